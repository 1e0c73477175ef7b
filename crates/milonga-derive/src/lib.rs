//! `#[derive(Compact)]`: a type's schema, compact writer and compact
//! reader, made from its declaration (docs/schemas.md, "Derived types").
//! Use it through the `milonga` crate (`#[derive(milonga::Compact)]`); the
//! code it writes names `::milonga::wire`, or the path a
//! `#[compact(crate = "milonga_wire")]` on the type gives (for code that
//! depends on the wire crate alone).
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

/// The path the generated code names the wire crate by: `::milonga::wire`,
/// or what `#[compact(crate = "path")]` on the type says (`milonga_wire`
/// for code that depends on the wire crate alone).
fn wire_crate(input: &DeriveInput) -> syn::Result<Tokens> {
    let mut path = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("compact")) {
        attr.parse_nested_meta(|m| {
            if m.path.is_ident("crate") {
                let s: LitStr = m.value()?.parse()?;
                path = Some(s.parse::<syn::Path>()?);
                Ok(())
            } else {
                Err(m.error("#[compact(...)] on a type takes crate"))
            }
        })?;
    }
    Ok(match path {
        Some(p) => quote!(#p),
        None => quote!(::milonga::wire),
    })
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
            Fields::Named(named) => {
                record(input, named.named.iter().collect(), &wire_crate(input)?)
            }
            _ => Err(syn::Error::new_spanned(
                &input.ident,
                "#[derive(Compact)]: a struct needs named fields (a schema's fields have names)",
            )),
        },
        Data::Enum(e) => choice(input, e, &wire_crate(input)?),
        Data::Union(_) => Err(syn::Error::new_spanned(
            &input.ident,
            "#[derive(Compact)]: unions have no schema type",
        )),
    }
}

/// An identifier as serde names it: without a raw identifier's `r#`.
fn unraw(id: &syn::Ident) -> String {
    let s = id.to_string();
    s.strip_prefix("r#").map(str::to_owned).unwrap_or(s)
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
                if a.rename.is_some() {
                    return Err(m.error("#[compact(rename)] given twice"));
                }
                a.rename = Some(m.value()?.parse()?);
            } else if field && m.path.is_ident("alias") {
                a.aliases.push(m.value()?.parse()?);
            } else if field && m.path.is_ident("default") {
                if a.default.is_some() {
                    return Err(m.error("#[compact(default)] given twice"));
                }
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

fn record(input: &DeriveInput, fields: Vec<&syn::Field>, w: &Tokens) -> syn::Result<Tokens> {
    let ident = &input.ident;
    let name = LitStr::new(&unraw(ident), Span::call_site());
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
            .unwrap_or_else(|| LitStr::new(&unraw(id), id.span()));
        let aliases = a.aliases.iter();
        let default = a.default.iter();
        schema_fields.push(quote! {
            #w::schema::Field::new(
                #fname,
                <#ty as #w::compact::Compact>::compact_type(),
            )
            #(.alias(#aliases))*
            #(.default_value(#w::Value::from(#default)))*
        });
        writes.push(quote! {
            #w::compact::Compact::write_compact(&self.#id, out);
        });
        reads.push(quote! {
            #id: <#ty as #w::compact::Compact>::read_compact(r)
                .map_err(|e| e.in_field(#fname))?,
        });
    }
    let n_u64 = n as u64;
    Ok(quote! {
        impl #w::compact::Compact for #ident {
            fn compact_type() -> #w::schema::Type {
                #w::compact::nested(|| {
                    #w::schema::Type::Struct(::std::vec![#(#schema_fields),*])
                })
            }
            #[inline]
            fn write_compact(&self, out: &mut ::std::vec::Vec<u8>) {
                #w::compact::head(out, 4, #n_u64);
                #(#writes)*
            }
            #[inline]
            fn read_compact(
                r: &mut #w::compact::Reader<'_>,
            ) -> ::std::result::Result<Self, #w::compact::CompactError> {
                r.struct_of(#n)?;
                let v = #ident { #(#reads)* };
                r.end_struct();
                ::std::result::Result::Ok(v)
            }
        }
        impl #w::compact::CompactRecord for #ident {
            fn record_schema() -> ::std::result::Result<
                &'static #w::compact::RecordSchema,
                #w::schema::SchemaError,
            > {
                static SCHEMA: ::std::sync::OnceLock<::std::result::Result<
                    #w::compact::RecordSchema,
                    #w::schema::SchemaError,
                >> = ::std::sync::OnceLock::new();
                SCHEMA
                    .get_or_init(|| {
                        #w::compact::RecordSchema::of::<Self>(#name)
                    })
                    .as_ref()
                    .map_err(::std::clone::Clone::clone)
            }
        }
    })
}

fn choice(input: &DeriveInput, e: &syn::DataEnum, w: &Tokens) -> syn::Result<Tokens> {
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
                .unwrap_or_else(|| LitStr::new(&unraw(vid), vid.span())),
        );
        let i64_ = i as u64;
        writes.push(quote! { #ident::#vid => #i64_, });
        reads.push(quote! { #i => #ident::#vid, });
    }
    let n = e.variants.len();
    Ok(quote! {
        impl #w::compact::Compact for #ident {
            fn compact_type() -> #w::schema::Type {
                #w::schema::Type::Enum(::std::vec![
                    #(::std::string::String::from(#names)),*
                ])
            }
            #[inline]
            fn write_compact(&self, out: &mut ::std::vec::Vec<u8>) {
                let i: u64 = match self { #(#writes)* };
                #w::compact::head(out, 0, i);
            }
            #[inline]
            fn read_compact(
                r: &mut #w::compact::Reader<'_>,
            ) -> ::std::result::Result<Self, #w::compact::CompactError> {
                ::std::result::Result::Ok(match r.variant(#n)? {
                    #(#reads)*
                    _ => ::std::unreachable!("variant() checked the index"),
                })
            }
        }
    })
}
