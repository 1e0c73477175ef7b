//! `#[derive(Compact)]`: a type's schema, compact writer and compact
//! reader, made from its declaration (docs/schemas.md, "Derived types").
//! Use it through the `milonga` crate (`#[derive(milonga::Compact)]`); the
//! code it writes names `::milonga`.
//!
//! - A struct with named fields becomes a schema `struct`: its fields in
//!   declaration order, each field's type its Rust type's
//!   (`milonga::wire::compact`'s table). It implements `Compact` and
//!   `CompactRecord` (its schema, made once).
//! - An enum whose variants are all units becomes a schema `enum` of the
//!   variants' names, written as the variant's index.
//!
//! Field attributes: `#[compact(rename = "name")]` (the schema's name for
//! the field), `#[compact(alias = "old")]` (repeatable: names a reader of
//! this type accepts for it), `#[compact(default = EXPR)]` (what a reader
//! of this type takes when a writer lacks the field; `EXPR` converts into
//! a `milonga::Value`). A variant takes `#[compact(rename = "name")]`.
//! Generic types, tuple and unit structs, and enums with data are refused
//! at compile time.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::quote;
use syn::{parse_macro_input, Data, DeriveInput, Fields, LitStr};

/// Derives `milonga::wire::compact::Compact` (and `CompactRecord` for a
/// struct). See the crate's documentation.
#[proc_macro_derive(Compact, attributes(compact))]
pub fn derive_compact(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    if !input.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(
            &input.generics,
            "#[derive(Compact)]: generic types are not supported (a schema is one concrete type)",
        ));
    }
    match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(named) => record(input, named.named.iter().collect()),
            _ => Err(syn::Error::new_spanned(
                &input.ident,
                "#[derive(Compact)]: a struct needs named fields (a schema's fields have names)",
            )),
        },
        Data::Enum(e) => choice(input, e),
        Data::Union(_) => Err(syn::Error::new_spanned(
            &input.ident,
            "#[derive(Compact)]: unions have no schema type",
        )),
    }
}

/// What `#[compact(...)]` says of a field or a variant.
#[derive(Default)]
struct Attrs {
    rename: Option<LitStr>,
    aliases: Vec<LitStr>,
    default: Option<syn::Expr>,
}

fn attrs(list: &[syn::Attribute], field: bool) -> syn::Result<Attrs> {
    let mut a = Attrs::default();
    for attr in list.iter().filter(|a| a.path().is_ident("compact")) {
        attr.parse_nested_meta(|m| {
            if m.path.is_ident("rename") {
                a.rename = Some(m.value()?.parse()?);
            } else if field && m.path.is_ident("alias") {
                a.aliases.push(m.value()?.parse()?);
            } else if field && m.path.is_ident("default") {
                a.default = Some(m.value()?.parse()?);
            } else {
                return Err(m.error(if field {
                    "#[compact(...)] on a field takes rename, alias or default"
                } else {
                    "#[compact(...)] on a variant takes rename"
                }));
            }
            Ok(())
        })?;
    }
    Ok(a)
}

fn record(input: &DeriveInput, fields: Vec<&syn::Field>) -> syn::Result<Tokens> {
    let ident = &input.ident;
    let name = LitStr::new(&ident.to_string(), Span::call_site());
    let n = fields.len();
    let mut schema_fields = Vec::new();
    let mut writes = Vec::new();
    let mut reads = Vec::new();
    for f in &fields {
        let a = attrs(&f.attrs, true)?;
        let id = f.ident.as_ref().expect("named fields");
        let ty = &f.ty;
        let fname = a
            .rename
            .clone()
            .unwrap_or_else(|| LitStr::new(id.to_string().trim_start_matches("r#"), id.span()));
        let aliases = a.aliases.iter();
        let default = a.default.iter();
        schema_fields.push(quote! {
            ::milonga::wire::schema::Field::new(
                #fname,
                <#ty as ::milonga::wire::compact::Compact>::compact_type(),
            )
            #(.alias(#aliases))*
            #(.default_value(::milonga::Value::from(#default)))*
        });
        writes.push(quote! {
            ::milonga::wire::compact::Compact::write_compact(&self.#id, out);
        });
        reads.push(quote! {
            #id: <#ty as ::milonga::wire::compact::Compact>::read_compact(r)
                .map_err(|e| e.in_field(#fname))?,
        });
    }
    let n_u64 = n as u64;
    Ok(quote! {
        impl ::milonga::wire::compact::Compact for #ident {
            fn compact_type() -> ::milonga::wire::schema::Type {
                ::milonga::wire::compact::nested(|| {
                    ::milonga::wire::schema::Type::Struct(::std::vec![#(#schema_fields),*])
                })
            }
            #[inline]
            fn write_compact(&self, out: &mut ::std::vec::Vec<u8>) {
                ::milonga::wire::compact::head(out, 4, #n_u64);
                #(#writes)*
            }
            #[inline]
            fn read_compact(
                r: &mut ::milonga::wire::compact::Reader<'_>,
            ) -> ::std::result::Result<Self, ::milonga::wire::compact::CompactError> {
                r.struct_of(#n)?;
                ::std::result::Result::Ok(#ident { #(#reads)* })
            }
        }
        impl ::milonga::wire::compact::CompactRecord for #ident {
            fn record_schema() -> ::std::result::Result<
                &'static ::milonga::wire::compact::RecordSchema,
                ::milonga::wire::schema::SchemaError,
            > {
                static SCHEMA: ::std::sync::OnceLock<::std::result::Result<
                    ::milonga::wire::compact::RecordSchema,
                    ::milonga::wire::schema::SchemaError,
                >> = ::std::sync::OnceLock::new();
                SCHEMA
                    .get_or_init(|| {
                        ::milonga::wire::compact::RecordSchema::new(
                            #name,
                            <Self as ::milonga::wire::compact::Compact>::compact_type(),
                        )
                    })
                    .as_ref()
                    .map_err(::std::clone::Clone::clone)
            }
        }
    })
}

fn choice(input: &DeriveInput, e: &syn::DataEnum) -> syn::Result<Tokens> {
    let ident = &input.ident;
    if e.variants.is_empty() {
        return Err(syn::Error::new_spanned(
            ident,
            "#[derive(Compact)]: an enum needs at least one variant",
        ));
    }
    let mut names = Vec::new();
    let mut writes = Vec::new();
    let mut reads = Vec::new();
    for (i, v) in e.variants.iter().enumerate() {
        if !matches!(v.fields, Fields::Unit) {
            return Err(syn::Error::new_spanned(
                v,
                "#[derive(Compact)]: only unit variants have a schema type (an enum is one of its names)",
            ));
        }
        let a = attrs(&v.attrs, false)?;
        let vid = &v.ident;
        names.push(
            a.rename
                .unwrap_or_else(|| LitStr::new(&vid.to_string(), vid.span())),
        );
        let i64_ = i as u64;
        writes.push(quote! { #ident::#vid => #i64_, });
        reads.push(quote! { #i => #ident::#vid, });
    }
    let n = e.variants.len();
    Ok(quote! {
        impl ::milonga::wire::compact::Compact for #ident {
            fn compact_type() -> ::milonga::wire::schema::Type {
                ::milonga::wire::schema::Type::Enum(::std::vec![
                    #(::std::string::String::from(#names)),*
                ])
            }
            #[inline]
            fn write_compact(&self, out: &mut ::std::vec::Vec<u8>) {
                let i: u64 = match self { #(#writes)* };
                ::milonga::wire::compact::head(out, 0, i);
            }
            #[inline]
            fn read_compact(
                r: &mut ::milonga::wire::compact::Reader<'_>,
            ) -> ::std::result::Result<Self, ::milonga::wire::compact::CompactError> {
                ::std::result::Result::Ok(match r.variant(#n)? {
                    #(#reads)*
                    _ => ::std::unreachable!("variant() checked the index"),
                })
            }
        }
    })
}
