//! Schemas and the compact encoding (encoding 3, docs/protocol.md §5.1,
//! docs/schemas.md).
//!
//! A publisher that declares a [`Schema`] sends each value as one CBOR
//! item written by position: a struct is an array of its fields in schema
//! order (no names), an enum the index of its variant, a numeric array an
//! RFC 8746 typed array. The schema itself travels once, answered to a
//! history query that asks for it (`schemas`, §4.2), and is cached by the
//! subscriber under (publisher node, schema id). The subscriber turns what
//! arrives back into the same [`Value`] map a plain CBOR publisher would
//! have sent, or, when it declares a schema of its own (the reader's),
//! into that schema's shape: [`Plan::resolve`] decides once, when a
//! publication is matched, whether the two agree (fields added, removed,
//! reordered, renamed with an alias, widened) and refuses the pair,
//! naming the field, when they do not.

use std::collections::BTreeSet;

use bytes::Bytes;
use minicbor::data::Tag;
use minicbor::Encoder;

use minicbor::data::Type as DType;
use minicbor::Decoder;

use crate::cbor::{decode_cbor, DecodeError};
use crate::value::{ElementType, TypedArray, Value};

/// Deepest nesting of types a schema may have.
pub const MAX_SCHEMA_DEPTH: usize = 16;
/// Most fields (and enum variants) a schema may have, counted over every
/// nested struct.
pub const MAX_SCHEMA_FIELDS: usize = 1024;
/// Longest field, alias, variant or schema name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// Largest encoded schema, in bytes.
pub const MAX_SCHEMA_BYTES: usize = 64 << 10;
/// Largest typed array a reader makes by widening one (a `u8` array read
/// as `f64` takes eight times its bytes).
pub const MAX_WIDENED_BYTES: usize = 64 << 20;

/// A field's type.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Type {
    /// `bool`
    Bool,
    /// `i32`
    I32,
    /// `i64`
    I64,
    /// `u32`
    U32,
    /// `u64`
    U64,
    /// `f32`, sent as a CBOR float32.
    F32,
    /// `f64`
    F64,
    /// UTF-8 text.
    Text,
    /// A byte string.
    Bytes,
    /// One of these names, sent as its index, delivered as its name.
    Enum(Vec<String>),
    /// A list of values of one type.
    List(Box<Type>),
    /// A numeric array, sent as an RFC 8746 typed array.
    Array(ElementType),
    /// A nested record, sent as an array of its fields.
    Struct(Vec<Field>),
    /// The type, or null.
    Optional(Box<Type>),
    /// Any value, sent as plain CBOR.
    Any,
}

/// A field of a struct.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// Its name.
    pub name: String,
    /// Its type.
    pub ty: Type,
    /// Other names a reader accepts for it: a writer's field of one of these
    /// names fills it (a renamed field).
    pub aliases: Vec<String>,
    /// What a reader takes when the writer has no such field (a field
    /// added since), or sends null where the reader's type has none.
    pub default: Option<Value>,
}

impl Field {
    /// A field with no alias and no default.
    pub fn new(name: impl Into<String>, ty: Type) -> Self {
        Field {
            name: name.into(),
            ty,
            aliases: Vec::new(),
            default: None,
        }
    }

    /// With a default value.
    pub fn default_value(mut self, v: impl Into<Value>) -> Self {
        self.default = Some(v.into());
        self
    }

    /// With another name the field was known by.
    pub fn alias(mut self, name: impl Into<String>) -> Self {
        self.aliases.push(name.into());
        self
    }
}

/// A named record type: what every sample of a schema'd publisher holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    /// Its name (informative: two schemas agree by their fields, not by
    /// their names).
    pub name: String,
    /// Its fields, in the order they are sent.
    pub fields: Vec<Field>,
}

/// Why a schema, or a value under a schema, was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The schema itself is not valid (names, nesting, size).
    #[error("invalid schema: {0}")]
    Invalid(String),
    /// A value does not fit the schema: the field's path and why.
    #[error("field {path}: {why}")]
    Value {
        /// Dotted path of the field (`pos.x`, `tracks[2].id`); empty for
        /// the whole value.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// A payload is not valid CBOR.
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

/// A reader's schema and a writer's do not agree: the first field that
/// does not, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field {field}: {why}")]
pub struct Incompatible {
    /// Dotted path of the field in the reader's schema.
    pub field: String,
    /// What the writer has and the reader wants.
    pub why: String,
}

fn invalid(why: impl Into<String>) -> SchemaError {
    SchemaError::Invalid(why.into())
}

/// Where a value lies in its schema (`pos.x`, `plots[2].range`): built
/// as the writer or reader descends, rendered only for an error.
#[derive(Clone, Copy)]
pub(crate) enum Path<'a> {
    Root,
    Field(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Field(Path::Root, name) => f.write_str(name),
            Path::Field(parent, name) => write!(f, "{parent}.{name}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

fn bad_value(path: &Path<'_>, why: impl Into<String>) -> SchemaError {
    SchemaError::Value {
        path: path.to_string(),
        why: why.into(),
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

fn element_by_name(name: &str) -> Option<ElementType> {
    use ElementType::*;
    [U8, U16, U32, U64, I8, I16, I32, I64, F32, F64]
        .into_iter()
        .find(|e| e.name() == name)
}

impl Type {
    /// The type's name as a schema writes it (`f64`, `list<i32>`).
    pub fn describe(&self) -> String {
        match self {
            Type::Bool => "bool".into(),
            Type::I32 => "i32".into(),
            Type::I64 => "i64".into(),
            Type::U32 => "u32".into(),
            Type::U64 => "u64".into(),
            Type::F32 => "f32".into(),
            Type::F64 => "f64".into(),
            Type::Text => "text".into(),
            Type::Bytes => "bytes".into(),
            Type::Any => "any".into(),
            Type::Enum(v) => format!("enum({})", v.join("|")),
            Type::List(t) => format!("list<{}>", t.describe()),
            Type::Array(e) => format!("array<{}>", e.name()),
            Type::Struct(_) => "struct".into(),
            Type::Optional(t) => format!("optional<{}>", t.describe()),
        }
    }

    fn scalar_name(&self) -> Option<&'static str> {
        Some(match self {
            Type::Bool => "bool",
            Type::I32 => "i32",
            Type::I64 => "i64",
            Type::U32 => "u32",
            Type::U64 => "u64",
            Type::F32 => "f32",
            Type::F64 => "f64",
            Type::Text => "text",
            Type::Bytes => "bytes",
            Type::Any => "any",
            _ => return None,
        })
    }

    fn to_value(&self) -> Value {
        if let Some(n) = self.scalar_name() {
            return Value::Text(n.into());
        }
        let (k, v) = match self {
            Type::Enum(names) => (
                "enum",
                Value::Array(names.iter().map(|n| Value::Text(n.clone())).collect()),
            ),
            Type::List(t) => ("list", t.to_value()),
            Type::Array(e) => ("array", Value::Text(e.name().into())),
            Type::Struct(fields) => ("struct", fields_to_value(fields)),
            Type::Optional(t) => ("optional", t.to_value()),
            _ => unreachable!("scalars are named above"),
        };
        Value::Map(vec![(Value::Text(k.into()), v)])
    }

    fn from_value(v: &Value, depth: usize, count: &mut usize) -> Result<Type, SchemaError> {
        if depth > MAX_SCHEMA_DEPTH {
            return Err(invalid(format!(
                "types nested deeper than {MAX_SCHEMA_DEPTH}"
            )));
        }
        match v {
            Value::Text(t) => Ok(match t.as_str() {
                "bool" => Type::Bool,
                "i32" => Type::I32,
                "i64" => Type::I64,
                "u32" => Type::U32,
                "u64" => Type::U64,
                "f32" => Type::F32,
                "f64" => Type::F64,
                "text" => Type::Text,
                "bytes" => Type::Bytes,
                "any" => Type::Any,
                other => return Err(invalid(format!("unknown type {other:?}"))),
            }),
            Value::Map(pairs) if pairs.len() == 1 => {
                let (Value::Text(k), inner) = &pairs[0] else {
                    return Err(invalid("a composite type is a map of one text key"));
                };
                match k.as_str() {
                    "enum" => {
                        let Value::Array(items) = inner else {
                            return Err(invalid("enum: expected an array of names"));
                        };
                        if items.is_empty() {
                            return Err(invalid("enum: no variant"));
                        }
                        let mut names = Vec::with_capacity(items.len());
                        for i in items {
                            *count += 1;
                            if *count > MAX_SCHEMA_FIELDS {
                                return Err(invalid(format!(
                                    "more than {MAX_SCHEMA_FIELDS} fields and variants"
                                )));
                            }
                            names.push(name(i, "enum variant")?);
                        }
                        unique(names.iter(), "enum variant")?;
                        Ok(Type::Enum(names))
                    }
                    "list" => Ok(Type::List(Box::new(Type::from_value(
                        inner,
                        depth + 1,
                        count,
                    )?))),
                    "array" => match inner {
                        Value::Text(e) => element_by_name(e)
                            .map(Type::Array)
                            .ok_or_else(|| invalid(format!("array: unknown element {e:?}"))),
                        _ => Err(invalid("array: expected an element name")),
                    },
                    "struct" => Ok(Type::Struct(fields_from_value(inner, depth + 1, count)?)),
                    "optional" => {
                        let t = Type::from_value(inner, depth + 1, count)?;
                        if matches!(t, Type::Optional(_)) {
                            return Err(invalid("optional<optional<..>> is not a type"));
                        }
                        Ok(Type::Optional(Box::new(t)))
                    }
                    other => Err(invalid(format!("unknown type {other:?}"))),
                }
            }
            _ => Err(invalid("a type is a name or a map of one pair")),
        }
    }
}

fn name(v: &Value, what: &str) -> Result<String, SchemaError> {
    match v {
        Value::Text(t) if !t.is_empty() && t.len() <= MAX_NAME_BYTES => Ok(t.clone()),
        Value::Text(_) => Err(invalid(format!(
            "{what}: a name has 1..={MAX_NAME_BYTES} bytes"
        ))),
        _ => Err(invalid(format!("{what}: expected text"))),
    }
}

fn unique<'a>(names: impl Iterator<Item = &'a String>, what: &str) -> Result<(), SchemaError> {
    let mut seen = BTreeSet::new();
    for n in names {
        if !seen.insert(n) {
            return Err(invalid(format!("{what} {n:?} appears twice")));
        }
    }
    Ok(())
}

fn fields_to_value(fields: &[Field]) -> Value {
    Value::Array(
        fields
            .iter()
            .map(|f| {
                let mut m = vec![
                    (Value::Text("name".into()), Value::Text(f.name.clone())),
                    (Value::Text("type".into()), f.ty.to_value()),
                ];
                if !f.aliases.is_empty() {
                    m.push((
                        Value::Text("aliases".into()),
                        Value::Array(f.aliases.iter().map(|a| Value::Text(a.clone())).collect()),
                    ));
                }
                if let Some(d) = &f.default {
                    m.push((Value::Text("default".into()), d.clone()));
                }
                Value::Map(m)
            })
            .collect(),
    )
}

fn fields_from_value(
    v: &Value,
    depth: usize,
    count: &mut usize,
) -> Result<Vec<Field>, SchemaError> {
    let Value::Array(items) = v else {
        return Err(invalid("fields: expected an array"));
    };
    let mut fields = Vec::with_capacity(items.len());
    for item in items {
        *count += 1;
        if *count > MAX_SCHEMA_FIELDS {
            return Err(invalid(format!(
                "more than {MAX_SCHEMA_FIELDS} fields and variants"
            )));
        }
        if !matches!(item, Value::Map(_)) {
            return Err(invalid("a field is a map"));
        }
        let fname = name(
            item.get("name")
                .ok_or_else(|| invalid("a field has no name"))?,
            "field name",
        )?;
        let ty = Type::from_value(
            item.get("type")
                .ok_or_else(|| invalid(format!("field {fname:?} has no type")))?,
            depth,
            count,
        )?;
        let aliases = match item.get("aliases") {
            None => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|a| name(a, "alias"))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(invalid("aliases: expected an array of names")),
        };
        let default = item.get("default").cloned();
        let f = Field {
            name: fname,
            ty,
            aliases,
            default,
        };
        if let Some(d) = &f.default {
            let mut out = Vec::new();
            write(
                &f.ty,
                d,
                &Path::Field(&Path::Root, &f.name),
                &mut Encoder::new(&mut out),
            )
            .map_err(|e| invalid(format!("the default of {:?} does not fit: {e}", f.name)))?;
        }
        fields.push(f);
    }
    unique(
        fields
            .iter()
            .flat_map(|f| std::iter::once(&f.name).chain(&f.aliases)),
        "field name or alias",
    )?;
    Ok(fields)
}

impl Schema {
    /// A schema of these fields.
    pub fn new(name: impl Into<String>, fields: Vec<Field>) -> Self {
        Schema {
            name: name.into(),
            fields,
        }
    }

    /// The schema as the CBOR map that travels (docs/protocol.md §5.1).
    pub fn to_value(&self) -> Value {
        Value::Map(vec![
            (Value::Text("name".into()), Value::Text(self.name.clone())),
            (Value::Text("fields".into()), fields_to_value(&self.fields)),
        ])
    }

    /// Reads a schema from its CBOR map, checking every limit.
    pub fn from_value(v: &Value) -> Result<Schema, SchemaError> {
        if !matches!(v, Value::Map(_)) {
            return Err(invalid("a schema is a map"));
        }
        let sname = name(
            v.get("name").ok_or_else(|| invalid("no name"))?,
            "schema name",
        )?;
        let mut count = 0;
        let fields = fields_from_value(
            v.get("fields").ok_or_else(|| invalid("no fields"))?,
            1,
            &mut count,
        )?;
        Ok(Schema {
            name: sname,
            fields,
        })
    }

    /// The schema's bytes on the wire: its CBOR map.
    pub fn encode(&self) -> Result<Vec<u8>, SchemaError> {
        // Validate as a reader would.
        let v = self.to_value();
        Schema::from_value(&v)?;
        let mut out = Vec::new();
        crate::cbor::encode_cbor(&v, &mut out).map_err(|e| invalid(e.to_string()))?;
        if out.len() > MAX_SCHEMA_BYTES {
            return Err(invalid(format!(
                "{} bytes encoded, more than {MAX_SCHEMA_BYTES}",
                out.len()
            )));
        }
        Ok(out)
    }

    /// Reads a schema from its bytes.
    pub fn decode(bytes: &[u8]) -> Result<Schema, SchemaError> {
        if bytes.len() > MAX_SCHEMA_BYTES {
            return Err(invalid(format!("more than {MAX_SCHEMA_BYTES} bytes")));
        }
        Schema::from_value(&decode_cbor(&Bytes::copy_from_slice(bytes))?)
    }

    /// The schema's id: FNV-1a 32 of its encoded bytes (0 is never an id:
    /// it becomes 1). A subscriber keys the schemas it learns by
    /// (publisher node, id).
    pub fn id_of(encoded: &[u8]) -> u32 {
        crate::content_id(encoded)
    }

    /// Writes `value` (a map of this schema's fields) in the compact
    /// encoding. A field the map lacks takes its default, or null if it is
    /// optional; a key the schema does not have is an error.
    pub fn write_compact(&self, value: &Value, out: &mut Vec<u8>) -> Result<(), SchemaError> {
        write_struct(&self.fields, value, &Path::Root, &mut Encoder::new(out))
    }

    /// A writer of this schema's values: made once per publisher.
    pub fn writer(&self) -> CompactWriter {
        CompactWriter(Type::Struct(self.fields.clone()))
    }

    /// Reads a compact payload written with this schema into its value map.
    pub fn read_compact(&self, payload: &Bytes) -> Result<Value, SchemaError> {
        Plan::identity(self).read(payload)
    }
}

impl Schema {
    /// The schema of a serde type, traced from its `Deserialize` impl
    /// (`#[derive(Deserialize)]`): a struct's fields in declaration order
    /// (`#[serde(rename)]` names them), `Option<T>` optional, `Vec<T>` a
    /// list (of numbers: a typed array), an enum of unit variants an enum,
    /// a newtype its inner type, 8- to 32-bit integers `i32`/`u32`,
    /// `String` and `char` text, maps `any`. A type that is not a struct,
    /// tuples, enums with data and 128-bit integers are refused: build
    /// the [`Schema`] by hand for those.
    pub fn of<T: serde::de::DeserializeOwned>() -> Result<Schema, SchemaError> {
        // A struct cannot be an enum; a top-level enum is refused below.
        use serde_reflection::{ContainerFormat, Error, Samples, Tracer, TracerConfig};
        // A pass of the tracer visits one more variant of each enum it was
        // told is incomplete (`check_incomplete_enum`), and the names of
        // the enums only come from the error of a finished trace: so the
        // trace starts over, knowing more names, until every variant of
        // every enum is seen.
        let samples = Samples::new();
        let cannot = |e: Error| invalid(format!("cannot trace the type: {e}"));
        let mut enums: Vec<String> = Vec::new();
        let (format, registry) = loop {
            let mut tracer = Tracer::new(TracerConfig::default());
            let mut format = tracer.trace_type_once::<T>(&samples).map_err(cannot)?.0;
            for _ in 0..MAX_SCHEMA_FIELDS {
                let mut again = false;
                for name in &enums {
                    again |= tracer.check_incomplete_enum(name).is_some();
                }
                if !again {
                    break;
                }
                format = tracer.trace_type_once::<T>(&samples).map_err(cannot)?.0;
            }
            match tracer.registry() {
                Ok(r) => break (format, r),
                Err(Error::MissingVariants(names)) if names.iter().any(|n| !enums.contains(n)) => {
                    enums.extend(names);
                }
                Err(e) => return Err(cannot(e)),
            }
        };
        let serde_reflection::Format::TypeName(name) = &format else {
            return Err(invalid("a schema's type is a struct"));
        };
        match registry.get(name) {
            Some(ContainerFormat::Struct(_)) => {}
            _ => return Err(invalid(format!("{name} is not a struct with named fields"))),
        }
        let Type::Struct(fields) = traced(&format, &registry, 0)? else {
            return Err(invalid(format!("{name} is not a struct with named fields")));
        };
        let schema = Schema {
            name: name.clone(),
            fields,
        };
        schema.encode()?;
        Ok(schema)
    }
}

fn traced(
    f: &serde_reflection::Format,
    registry: &serde_reflection::Registry,
    depth: usize,
) -> Result<Type, SchemaError> {
    use serde_reflection::{ContainerFormat, Format as F, VariantFormat};
    if depth > MAX_SCHEMA_DEPTH {
        return Err(invalid(format!(
            "types nested deeper than {MAX_SCHEMA_DEPTH} (a recursive type?)"
        )));
    }
    let numeric = |f: &F| {
        Some(match f {
            F::U8 => ElementType::U8,
            F::U16 => ElementType::U16,
            F::U32 => ElementType::U32,
            F::U64 => ElementType::U64,
            F::I8 => ElementType::I8,
            F::I16 => ElementType::I16,
            F::I32 => ElementType::I32,
            F::I64 => ElementType::I64,
            F::F32 => ElementType::F32,
            F::F64 => ElementType::F64,
            _ => return None,
        })
    };
    Ok(match f {
        F::Bool => Type::Bool,
        F::I8 | F::I16 | F::I32 => Type::I32,
        F::I64 => Type::I64,
        F::U8 | F::U16 | F::U32 => Type::U32,
        F::U64 => Type::U64,
        F::F32 => Type::F32,
        F::F64 => Type::F64,
        F::Char | F::Str => Type::Text,
        F::Bytes => Type::Bytes,
        F::Option(inner) => match traced(inner, registry, depth + 1)? {
            Type::Optional(_) => return Err(invalid("Option<Option<T>> has no schema type")),
            t => Type::Optional(Box::new(t)),
        },
        F::Seq(inner) | F::TupleArray { content: inner, .. } => match numeric(inner) {
            Some(e) => Type::Array(e),
            None => Type::List(Box::new(traced(inner, registry, depth + 1)?)),
        },
        F::Map { .. } => Type::Any,
        F::TypeName(name) => match registry.get(name) {
            Some(ContainerFormat::Struct(fields)) => Type::Struct(
                fields
                    .iter()
                    .map(|n| {
                        Ok(Field::new(
                            n.name.clone(),
                            traced(&n.value, registry, depth + 1)?,
                        ))
                    })
                    .collect::<Result<_, SchemaError>>()?,
            ),
            Some(ContainerFormat::NewTypeStruct(inner)) => traced(inner, registry, depth + 1)?,
            Some(ContainerFormat::Enum(variants)) => {
                let mut names = Vec::with_capacity(variants.len());
                for v in variants.values() {
                    if !matches!(v.value, VariantFormat::Unit) {
                        return Err(invalid(format!(
                            "enum {name}: variant {} carries data; only unit variants have a schema type",
                            v.name
                        )));
                    }
                    names.push(v.name.clone());
                }
                Type::Enum(names)
            }
            _ => {
                return Err(invalid(format!(
                    "{name}: unit and tuple structs have no schema type"
                )))
            }
        },
        other => return Err(invalid(format!("{other:?} has no schema type"))),
    })
}

/// Writes values of one schema in the compact encoding ([`Schema::writer`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CompactWriter(Type);

impl CompactWriter {
    /// Writes a user type (serde) straight from its `Serialize`, with no
    /// [`Value`] built on the way. Its fields come in the schema's order
    /// (the type's declaration order when the schema was traced from it);
    /// a field it skips takes its default, or null if optional.
    pub fn write_serde<T: serde::Serialize + ?Sized>(
        &self,
        v: &T,
        out: &mut Vec<u8>,
    ) -> Result<(), SchemaError> {
        crate::compact_ser::write(&self.0, v, out)
    }

    /// Writes `value`, a map of the schema's fields ([`Schema::write_compact`]).
    pub fn write(&self, value: &Value, out: &mut Vec<u8>) -> Result<(), SchemaError> {
        let Type::Struct(fields) = &self.0 else {
            unreachable!("a writer's type is its schema's struct")
        };
        write_struct(fields, value, &Path::Root, &mut Encoder::new(out))
    }
}

/// Writes `v` as a value of `ty` (a default filled in by the serde writer).
pub(crate) fn write_value(
    ty: &Type,
    v: &Value,
    path: &Path<'_>,
    out: &mut Vec<u8>,
) -> Result<(), SchemaError> {
    write(ty, v, path, &mut Encoder::new(out))
}

const INFALLIBLE: &str = "writing to a Vec cannot fail";

fn int_of(v: &Value, path: &Path<'_>, lo: i128, hi: i128, ty: &str) -> Result<i128, SchemaError> {
    match v {
        Value::Int(i) if (lo..=hi).contains(i) => Ok(*i),
        Value::Int(i) => Err(bad_value(path, format!("{i} does not fit {ty}"))),
        other => Err(bad_value(
            path,
            format!("expected {ty}, found {}", kind(other)),
        )),
    }
}

fn float_of(v: &Value, path: &Path<'_>, ty: &str) -> Result<f64, SchemaError> {
    match v {
        Value::Float(f) => Ok(*f),
        Value::Int(i) => Ok(*i as f64),
        other => Err(bad_value(
            path,
            format!("expected {ty}, found {}", kind(other)),
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Int(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Text(_) => "text",
        Value::Bytes(_) => "bytes",
        Value::Array(_) => "an array",
        Value::Map(_) => "a map",
        Value::Typed(_) => "a typed array",
        _ => "a tagged value",
    }
}

fn write_struct(
    fields: &[Field],
    value: &Value,
    path: &Path<'_>,
    e: &mut Encoder<&mut Vec<u8>>,
) -> Result<(), SchemaError> {
    let Value::Map(pairs) = value else {
        return Err(bad_value(
            path,
            format!("expected a map, found {}", kind(value)),
        ));
    };
    for (k, _) in pairs {
        match k {
            Value::Text(t) if fields.iter().any(|f| &f.name == t) => {}
            Value::Text(t) => {
                return Err(bad_value(
                    &Path::Field(path, t),
                    "not a field of the schema",
                ));
            }
            other => {
                return Err(bad_value(
                    path,
                    format!("a key is {}, not text", kind(other)),
                ))
            }
        }
    }
    e.array(fields.len() as u64).expect(INFALLIBLE);
    for f in fields {
        let p = Path::Field(path, &f.name);
        match value.get(&f.name).or(f.default.as_ref()) {
            Some(v) => write(&f.ty, v, &p, e)?,
            None if matches!(f.ty, Type::Optional(_) | Type::Any) => {
                e.null().expect(INFALLIBLE);
            }
            None => return Err(bad_value(&p, "missing, and it has no default")),
        }
    }
    Ok(())
}

fn write(
    ty: &Type,
    v: &Value,
    path: &Path<'_>,
    e: &mut Encoder<&mut Vec<u8>>,
) -> Result<(), SchemaError> {
    match ty {
        Type::Bool => match v {
            Value::Bool(b) => {
                e.bool(*b).expect(INFALLIBLE);
            }
            other => {
                return Err(bad_value(
                    path,
                    format!("expected bool, found {}", kind(other)),
                ))
            }
        },
        Type::I32 | Type::I64 | Type::U32 | Type::U64 => {
            let (lo, hi) = match ty {
                Type::I32 => (i128::from(i32::MIN), i128::from(i32::MAX)),
                Type::I64 => (i128::from(i64::MIN), i128::from(i64::MAX)),
                Type::U32 => (0, i128::from(u32::MAX)),
                _ => (0, i128::from(u64::MAX)),
            };
            let i = int_of(v, path, lo, hi, &ty.describe())?;
            let int = minicbor::data::Int::try_from(i).expect("in range");
            e.int(int).expect(INFALLIBLE);
        }
        Type::F32 => {
            e.f32(float_of(v, path, "f32")? as f32).expect(INFALLIBLE);
        }
        Type::F64 => {
            e.f64(float_of(v, path, "f64")?).expect(INFALLIBLE);
        }
        Type::Text => match v {
            Value::Text(t) => {
                e.str(t).expect(INFALLIBLE);
            }
            other => {
                return Err(bad_value(
                    path,
                    format!("expected text, found {}", kind(other)),
                ))
            }
        },
        Type::Bytes => match v {
            Value::Bytes(b) => {
                e.bytes(b).expect(INFALLIBLE);
            }
            other => {
                return Err(bad_value(
                    path,
                    format!("expected bytes, found {}", kind(other)),
                ))
            }
        },
        Type::Enum(names) => {
            let i = match v {
                Value::Text(t) => names
                    .iter()
                    .position(|n| n == t)
                    .ok_or_else(|| bad_value(path, format!("{t:?} is not a variant")))?,
                other => {
                    return Err(bad_value(
                        path,
                        format!("expected a variant name, found {}", kind(other)),
                    ))
                }
            };
            e.u32(i as u32).expect(INFALLIBLE);
        }
        Type::List(t) => match v {
            Value::Array(items) => {
                e.array(items.len() as u64).expect(INFALLIBLE);
                for (i, item) in items.iter().enumerate() {
                    write(t, item, &Path::Index(path, i), e)?;
                }
            }
            Value::Typed(a) => {
                e.array(a.len() as u64).expect(INFALLIBLE);
                for i in 0..a.len() {
                    write(t, &element_value(a, i), &Path::Index(path, i), e)?;
                }
            }
            other => {
                return Err(bad_value(
                    path,
                    format!("expected a list, found {}", kind(other)),
                ))
            }
        },
        Type::Array(el) => {
            let a = match v {
                Value::Typed(a) if a.element() == *el => a.clone(),
                Value::Typed(a) => pack(*el, (0..a.len()).map(|i| element_value(a, i)), path)?,
                Value::Array(items) => pack(*el, items.iter().cloned(), path)?,
                other => {
                    return Err(bad_value(
                        path,
                        format!("expected a numeric array, found {}", kind(other)),
                    ))
                }
            };
            e.tag(Tag::new(el.cbor_tag()))
                .and_then(|e| e.bytes(a.bytes()))
                .expect(INFALLIBLE);
        }
        Type::Struct(fields) => write_struct(fields, v, path, e)?,
        Type::Optional(t) => match v {
            Value::Null => {
                e.null().expect(INFALLIBLE);
            }
            v => write(t, v, path, e)?,
        },
        Type::Any => {
            let mut buf = Vec::new();
            crate::cbor::encode_cbor(v, &mut buf)
                .map_err(|err| bad_value(path, err.to_string()))?;
            e.writer_mut().extend_from_slice(&buf);
        }
    }
    Ok(())
}

/// Element `i` of a typed array as a value (an integer or a float).
fn element_value(a: &TypedArray, i: usize) -> Value {
    a.value_at(i).unwrap_or(Value::Null)
}

/// Packs numbers into a typed array of `el`, refusing any that does not
/// fit.
fn pack(
    el: ElementType,
    items: impl Iterator<Item = Value>,
    path: &Path<'_>,
) -> Result<TypedArray, SchemaError> {
    let mut out = Vec::new();
    for (i, v) in items.enumerate() {
        let p = || Path::Index(path, i);
        let int = |lo: i128, hi: i128| int_of(&v, &p(), lo, hi, el.name());
        match el {
            ElementType::U8 => out.push(int(0, 255)? as u8),
            ElementType::I8 => out.push(int(-128, 127)? as i8 as u8),
            ElementType::U16 => out.extend_from_slice(&(int(0, 65535)? as u16).to_le_bytes()),
            ElementType::I16 => {
                out.extend_from_slice(&(int(-32768, 32767)? as i16).to_le_bytes());
            }
            ElementType::U32 => {
                out.extend_from_slice(&(int(0, i128::from(u32::MAX))? as u32).to_le_bytes());
            }
            ElementType::I32 => out.extend_from_slice(
                &(int(i128::from(i32::MIN), i128::from(i32::MAX))? as i32).to_le_bytes(),
            ),
            ElementType::U64 => {
                out.extend_from_slice(&(int(0, i128::from(u64::MAX))? as u64).to_le_bytes());
            }
            ElementType::I64 => out.extend_from_slice(
                &(int(i128::from(i64::MIN), i128::from(i64::MAX))? as i64).to_le_bytes(),
            ),
            ElementType::F32 => {
                out.extend_from_slice(&(float_of(&v, &p(), "f32")? as f32).to_le_bytes());
            }
            ElementType::F64 => out.extend_from_slice(&float_of(&v, &p(), "f64")?.to_le_bytes()),
        }
    }
    Ok(TypedArray::from_bytes(el, Bytes::from(out)).expect("whole elements"))
}

/// A number type, for widening.
#[derive(Clone, Copy, PartialEq)]
enum Num {
    Int { signed: bool, bits: u32 },
    Float { bits: u32 },
}

fn num_of_type(t: &Type) -> Option<Num> {
    Some(match t {
        Type::I32 => Num::Int {
            signed: true,
            bits: 32,
        },
        Type::I64 => Num::Int {
            signed: true,
            bits: 64,
        },
        Type::U32 => Num::Int {
            signed: false,
            bits: 32,
        },
        Type::U64 => Num::Int {
            signed: false,
            bits: 64,
        },
        Type::F32 => Num::Float { bits: 32 },
        Type::F64 => Num::Float { bits: 64 },
        _ => return None,
    })
}

fn num_of_element(e: ElementType) -> Num {
    use ElementType::*;
    match e {
        U8 => Num::Int {
            signed: false,
            bits: 8,
        },
        U16 => Num::Int {
            signed: false,
            bits: 16,
        },
        U32 => Num::Int {
            signed: false,
            bits: 32,
        },
        U64 => Num::Int {
            signed: false,
            bits: 64,
        },
        I8 => Num::Int {
            signed: true,
            bits: 8,
        },
        I16 => Num::Int {
            signed: true,
            bits: 16,
        },
        I32 => Num::Int {
            signed: true,
            bits: 32,
        },
        I64 => Num::Int {
            signed: true,
            bits: 64,
        },
        F32 => Num::Float { bits: 32 },
        F64 => Num::Float { bits: 64 },
    }
}

/// Whether every value of `from` reads as a value of `to`: integers into
/// wider integers (unsigned into a wider signed), any integer into f64
/// (64-bit ones rounded beyond 2^53, as the issue's i64 -> f64 asks),
/// integers of 16 bits or less into f32, f32 into f64.
fn widens(from: Num, to: Num) -> bool {
    match (from, to) {
        (a, b) if a == b => true,
        (
            Num::Int {
                signed: s1,
                bits: b1,
            },
            Num::Int {
                signed: s2,
                bits: b2,
            },
        ) => (s1 == s2 && b1 <= b2) || (!s1 && s2 && b1 < b2),
        (Num::Int { .. }, Num::Float { bits: 64 }) => true,
        (Num::Int { bits, .. }, Num::Float { bits: 32 }) => bits <= 16,
        (Num::Float { bits: 32 }, Num::Float { bits: 64 }) => true,
        _ => false,
    }
}

/// How a value read with the writer's schema becomes the reader's: decided
/// once per (reader, writer) pair, then applied to every sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan(Conv);

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Conv {
    /// A scalar of the same kind (bool, text, bytes, any, an integer into
    /// a wider integer): checked against the writer's type, kept.
    Keep(Type),
    /// A writer's integer or float into a float.
    ToFloat(Type),
    /// A writer's enum index into a reader's name.
    Enum(Vec<String>),
    /// A typed array of the writer's element, converted to the reader's
    /// when they differ.
    Array {
        from: ElementType,
        to: ElementType,
    },
    /// A scalar number into a typed array of one.
    ToArray {
        from: Type,
        to: ElementType,
    },
    List(Box<Conv>),
    /// A scalar into a list of one.
    ToList(Box<Conv>),
    /// The writer may send null: the reader's null, or its default.
    Optional(Box<Conv>, Option<Value>),
    Struct {
        writer_len: usize,
        fields: Vec<(String, Source)>,
        /// For each writer field, the reader field it fills, if any.
        by_writer: Vec<Option<usize>>,
        /// Reader field `k` is writer field `k`, for every field: values
        /// go straight into the map as they are read.
        in_order: bool,
        /// A serde type whose fields are this struct's, in order (see
        /// [`Seen`]).
        seen: Seen,
    },
}

/// The address of the last serde field list (`&'static [&'static str]`,
/// one per type) found equal to an in-order struct's field names: a type
/// seen once is read by position (serde's `visit_seq`), without comparing
/// names again. Not part of the plan's value: clones start over, any two
/// compare equal.
#[derive(Default)]
pub(crate) struct Seen(std::sync::atomic::AtomicUsize);

impl Seen {
    /// Whether `names` (a type's field list) are `fields`' names, in order.
    pub(crate) fn matches(
        &self,
        names: &'static [&'static str],
        fields: &[(String, Source)],
    ) -> bool {
        use std::sync::atomic::Ordering;
        // The length first: a list that starts where a longer one does
        // (a custom impl's subslice) is not the list seen.
        if names.len() != fields.len() {
            return false;
        }
        let at = names.as_ptr() as usize;
        if self.0.load(Ordering::Relaxed) == at {
            return true;
        }
        let same = names.iter().zip(fields).all(|(n, (f, _))| *n == f.as_str());
        if same {
            self.0.store(at, Ordering::Relaxed);
        }
        same
    }
}

impl Clone for Seen {
    fn clone(&self) -> Self {
        Seen::default()
    }
}

impl PartialEq for Seen {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seen")
    }
}

/// A struct's conversion, with the indexes reading needs.
fn struct_conv(writer_len: usize, fields: Vec<(String, Source)>) -> Conv {
    let mut by_writer = vec![None; writer_len];
    for (k, (_, src)) in fields.iter().enumerate() {
        if let Source::Writer(i, _) = src {
            by_writer[*i] = Some(k);
        }
    }
    let in_order = fields.len() == writer_len
        && fields
            .iter()
            .enumerate()
            .all(|(k, (_, src))| matches!(src, Source::Writer(i, _) if *i == k));
    Conv::Struct {
        writer_len,
        fields,
        by_writer,
        in_order,
        seen: Seen::default(),
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Source {
    Writer(usize, Conv),
    Default(Value),
}

fn incompatible(path: &str, why: impl Into<String>) -> Incompatible {
    Incompatible {
        field: if path.is_empty() {
            "(the value)".into()
        } else {
            path.to_owned()
        },
        why: why.into(),
    }
}

fn resolve_type(reader: &Type, writer: &Type, path: &str) -> Result<Conv, Incompatible> {
    let mismatch = || {
        incompatible(
            path,
            format!(
                "the writer sends {}, the reader takes {}",
                writer.describe(),
                reader.describe()
            ),
        )
    };
    Ok(match (reader, writer) {
        (Type::Optional(r), Type::Optional(w)) => {
            Conv::Optional(Box::new(resolve_type(r, w, path)?), Some(Value::Null))
        }
        (Type::Optional(r), w) => resolve_type(r, w, path)?,
        (r, Type::Optional(_)) if !matches!(r, Type::Any) => {
            // Needs a default: the caller, who knows the field, adds it.
            return Err(incompatible(
                path,
                format!(
                    "the writer may send null ({}), the reader's {} has no default",
                    writer.describe(),
                    reader.describe()
                ),
            ));
        }
        (Type::Any, w) => identity(w),
        (Type::Bool, Type::Bool) | (Type::Text, Type::Text) | (Type::Bytes, Type::Bytes) => {
            Conv::Keep(writer.clone())
        }
        (r, w) if num_of_type(r).is_some() && num_of_type(w).is_some() => {
            let (rn, wn) = (
                num_of_type(r).expect("a number"),
                num_of_type(w).expect("a number"),
            );
            if !widens(wn, rn) {
                return Err(incompatible(
                    path,
                    format!(
                        "the writer sends {}, which the reader's {} cannot hold (narrowed)",
                        writer.describe(),
                        reader.describe()
                    ),
                ));
            }
            match rn {
                Num::Float { .. } => Conv::ToFloat(writer.clone()),
                Num::Int { .. } => Conv::Keep(writer.clone()),
            }
        }
        (Type::Enum(r), Type::Enum(w)) => {
            if let Some(missing) = w.iter().find(|n| !r.contains(n)) {
                return Err(incompatible(
                    path,
                    format!("the writer's variant {missing:?} is not one of the reader's"),
                ));
            }
            Conv::Enum(w.clone())
        }
        (Type::Array(r), Type::Array(w)) => {
            if !widens(num_of_element(*w), num_of_element(*r)) {
                return Err(mismatch());
            }
            Conv::Array { from: *w, to: *r }
        }
        (Type::Array(r), w) if num_of_type(w).is_some() => {
            if !widens(num_of_type(w).expect("a number"), num_of_element(*r)) {
                return Err(mismatch());
            }
            Conv::ToArray {
                from: w.clone(),
                to: *r,
            }
        }
        (Type::List(r), Type::List(w)) => {
            Conv::List(Box::new(resolve_type(r, w, &format!("{path}[]"))?))
        }
        (Type::List(r), w) => Conv::ToList(Box::new(resolve_type(r, w, path)?)),
        (Type::Struct(r), Type::Struct(w)) => resolve_struct(r, w, path)?,
        _ => return Err(mismatch()),
    })
}

fn resolve_struct(reader: &[Field], writer: &[Field], path: &str) -> Result<Conv, Incompatible> {
    let mut fields = Vec::with_capacity(reader.len());
    let mut claimed = vec![false; writer.len()];
    for rf in reader {
        let p = join(path, &rf.name);
        let found = writer
            .iter()
            .position(|wf| wf.name == rf.name)
            .or_else(|| writer.iter().position(|wf| rf.aliases.contains(&wf.name)))
            .or_else(|| writer.iter().position(|wf| wf.aliases.contains(&rf.name)));
        // Two reader fields never read one writer field (names and
        // aliases can make them meet): which one it is would be a guess.
        if let Some(i) = found {
            if std::mem::replace(&mut claimed[i], true) {
                return Err(incompatible(
                    &p,
                    format!(
                        "the writer's field {:?} is claimed by another of the reader's fields too",
                        writer[i].name
                    ),
                ));
            }
        }
        let src = match found {
            Some(i) => {
                let wt = &writer[i].ty;
                let conv = match (&rf.ty, wt) {
                    (r, Type::Optional(w)) if !matches!(r, Type::Optional(_) | Type::Any) => {
                        match &rf.default {
                            Some(d) => resolve_type(r, w, &p)
                                .map(|c| Conv::Optional(Box::new(c), Some(shaped(r, d)))),
                            None => resolve_type(r, wt, &p), // reports the missing default
                        }
                    }
                    (r, w) => resolve_type(r, w, &p),
                };
                // A field read under another name says the writer's too.
                let conv = conv.map_err(|mut e| {
                    if writer[i].name != rf.name {
                        e.why = format!("{} (the writer's field {:?})", e.why, writer[i].name);
                    }
                    e
                })?;
                Source::Writer(i, conv)
            }
            None => match (&rf.default, &rf.ty) {
                (Some(d), t) => Source::Default(shaped(t, d)),
                (None, Type::Optional(_) | Type::Any) => Source::Default(Value::Null),
                (None, _) => {
                    return Err(incompatible(
                        &p,
                        "the writer has no such field and the reader's has no default",
                    ))
                }
            },
        };
        fields.push((rf.name.clone(), src));
    }
    Ok(struct_conv(writer.len(), fields))
}

/// A default as a reader delivers a value of its type (an integer default
/// of a float field as a float, a list of numbers as a typed array):
/// written, then read back. A default that does
/// not fit (a schema made by hand, not checked) stays as given.
fn shaped(ty: &Type, d: &Value) -> Value {
    let mut out = Vec::new();
    if write(ty, d, &Path::Root, &mut Encoder::new(&mut out)).is_err() {
        return d.clone();
    }
    let bytes = Bytes::from(out);
    let mut dec = Decoder::new(&bytes);
    let mut budget = crate::cbor::MAX_ITEMS;
    read(&identity(ty), &mut dec, &bytes, &Path::Root, &mut budget).unwrap_or_else(|_| d.clone())
}

/// The conversion that reads a writer's type as it is.
fn identity(t: &Type) -> Conv {
    match t {
        Type::Optional(inner) => Conv::Optional(Box::new(identity(inner)), Some(Value::Null)),
        Type::Enum(names) => Conv::Enum(names.clone()),
        Type::Array(e) => Conv::Array { from: *e, to: *e },
        Type::List(inner) => Conv::List(Box::new(identity(inner))),
        Type::Struct(fields) => struct_conv(
            fields.len(),
            fields
                .iter()
                .enumerate()
                .map(|(i, f)| (f.name.clone(), Source::Writer(i, identity(&f.ty))))
                .collect(),
        ),
        Type::F32 | Type::F64 => Conv::ToFloat(t.clone()),
        other => Conv::Keep(other.clone()),
    }
}

impl Plan {
    /// How a reader of schema `reader` reads samples written with
    /// `writer`, or the first field where they disagree. Agreement:
    /// a field the writer lacks takes the reader's default (null if
    /// optional); a field the reader lacks is skipped; fields match by
    /// name, then by the reader's aliases, in any order; numbers widen
    /// (integer to a wider integer or to f64, f32 to f64), a scalar
    /// becomes a list or typed array of one, a value becomes an optional
    /// one; a writer's optional field needs a reader's default (taken for
    /// null) unless the reader's is optional too; an enum reads if the
    /// reader knows every writer's variant. Anything else (a narrowed
    /// number, another kind) is incompatible.
    pub fn resolve(reader: &Schema, writer: &Schema) -> Result<Plan, Incompatible> {
        resolve_struct(&reader.fields, &writer.fields, "").map(Plan)
    }

    /// The plan that reads `writer`'s samples as they are: its field map.
    pub fn identity(writer: &Schema) -> Plan {
        Plan(identity(&Type::Struct(writer.fields.clone())))
    }

    /// Reads a compact payload into the reader's value map, in one pass
    /// over its CBOR: writer fields the reader has no use for are skipped
    /// unread, typed arrays and byte strings stay views of `payload`.
    /// Structs and lists have definite lengths (a compact writer's); a
    /// payload that does not fit the writer's schema is an error.
    pub fn read(&self, payload: &Bytes) -> Result<Value, SchemaError> {
        let mut d = Decoder::new(payload);
        let mut budget = crate::cbor::MAX_ITEMS;
        let v = read(&self.0, &mut d, payload, &Path::Root, &mut budget)?;
        let rest = payload.len() - d.position();
        if rest != 0 {
            return Err(SchemaError::Decode(DecodeError::TrailingBytes(rest)));
        }
        Ok(v)
    }

    /// Reads a compact payload straight into the reader's serde type:
    /// what [`Plan::read`] followed by deserializing the map gives, without
    /// the map (the subscriber's fast path, `Sample::deserialize`). The
    /// type sees a struct as a map of the reader's field names; strings
    /// and byte strings may borrow from `payload`.
    pub fn deserialize<'de, T: serde::Deserialize<'de>>(
        &self,
        payload: &'de Bytes,
    ) -> Result<T, SchemaError> {
        crate::compact_de::deserialize(&self.0, payload)
    }
}

pub(crate) fn read(
    c: &Conv,
    d: &mut Decoder<'_>,
    buf: &Bytes,
    path: &Path<'_>,
    budget: &mut usize,
) -> Result<Value, SchemaError> {
    *budget = budget
        .checked_sub(1)
        .ok_or(SchemaError::Decode(DecodeError::TooManyItems))?;
    let found = |d: &Decoder<'_>| match d.datatype() {
        Ok(t) => format!("{t}"),
        Err(_) => "nothing".to_owned(),
    };
    let wrong = |d: &Decoder<'_>, want: &str| {
        bad_value(
            path,
            format!(
                "the writer's schema says {want}, the payload holds {}",
                found(d)
            ),
        )
    };
    let int = |d: &mut Decoder<'_>, t: &Type| -> Result<i128, SchemaError> {
        if !matches!(
            d.datatype(),
            Ok(DType::U8
                | DType::U16
                | DType::U32
                | DType::U64
                | DType::I8
                | DType::I16
                | DType::I32
                | DType::I64
                | DType::Int)
        ) {
            return Err(wrong(d, &t.describe()));
        }
        let i = i128::from(d.int().map_err(DecodeError::from)?);
        let fits = match t {
            Type::I32 => i32::try_from(i).is_ok(),
            Type::I64 => i64::try_from(i).is_ok(),
            Type::U32 => u32::try_from(i).is_ok(),
            _ => u64::try_from(i).is_ok(),
        };
        if fits {
            Ok(i)
        } else {
            Err(bad_value(
                path,
                format!("{i} does not fit {}", t.describe()),
            ))
        }
    };
    let float = |d: &mut Decoder<'_>, t: &Type| -> Result<f64, SchemaError> {
        Ok(match d.datatype() {
            Ok(DType::F16) => f64::from(d.f16().map_err(DecodeError::from)?),
            Ok(DType::F32) => f64::from(d.f32().map_err(DecodeError::from)?),
            Ok(DType::F64) => d.f64().map_err(DecodeError::from)?,
            _ => return Err(wrong(d, &t.describe())),
        })
    };
    let definite = |d: &mut Decoder<'_>, what: &str| -> Result<usize, SchemaError> {
        if !matches!(d.datatype(), Ok(DType::Array)) {
            return Err(wrong(d, what));
        }
        // A compact writer's lengths are definite (§5.1).
        let Some(n) = d.array().map_err(DecodeError::from)? else {
            return Err(bad_value(path, "an indefinite-length array"));
        };
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= *budget)
            .ok_or(SchemaError::Decode(DecodeError::TooManyItems))
    };
    Ok(match c {
        Conv::Keep(t) => match t {
            Type::Bool => {
                if !matches!(d.datatype(), Ok(DType::Bool)) {
                    return Err(wrong(d, "bool"));
                }
                Value::Bool(d.bool().map_err(DecodeError::from)?)
            }
            Type::I32 | Type::I64 | Type::U32 | Type::U64 => Value::Int(int(d, t)?),
            Type::Text => {
                if !matches!(d.datatype(), Ok(DType::String)) {
                    return Err(wrong(d, "text"));
                }
                Value::Text(d.str().map_err(DecodeError::from)?.to_owned())
            }
            Type::Bytes => {
                if !matches!(d.datatype(), Ok(DType::Bytes)) {
                    return Err(wrong(d, "bytes"));
                }
                Value::Bytes(crate::cbor::read_bytes(d, buf)?)
            }
            _ => crate::cbor::read_item(d, buf, budget)?,
        },
        Conv::ToFloat(t) => match t {
            Type::F32 | Type::F64 => Value::Float(float(d, t)?),
            t => Value::Float(int(d, t)? as f64),
        },
        Conv::Enum(names) => {
            let i = int(d, &Type::U32)? as usize;
            match names.get(i) {
                Some(n) => Value::Text(n.clone()),
                None => return Err(bad_value(path, format!("enum index {i} out of range"))),
            }
        }
        Conv::Array { from, to } => {
            if !matches!(d.datatype(), Ok(DType::Tag)) {
                return Err(wrong(d, &format!("array<{}>", from.name())));
            }
            match crate::cbor::read_item(d, buf, budget)? {
                Value::Typed(a) if a.element() == *from => {
                    if from == to {
                        Value::Typed(a)
                    } else if a.len().saturating_mul(to.size()) > MAX_WIDENED_BYTES {
                        return Err(bad_value(
                            path,
                            format!(
                                "{} elements widened to {} pass {MAX_WIDENED_BYTES} bytes",
                                a.len(),
                                to.name()
                            ),
                        ));
                    } else {
                        Value::Typed(pack(*to, (0..a.len()).map(|i| element_value(&a, i)), path)?)
                    }
                }
                _ => {
                    return Err(bad_value(
                        path,
                        format!("the writer's schema says array<{}>", from.name()),
                    ))
                }
            }
        }
        Conv::ToArray { from, to } => {
            let x = read(&identity(from), d, buf, path, budget)?;
            Value::Typed(pack(*to, std::iter::once(x), path)?)
        }
        Conv::List(inner) => {
            let n = definite(d, "a list")?;
            let mut items = Vec::with_capacity(n.min(1024));
            for i in 0..n {
                items.push(read(inner, d, buf, &Path::Index(path, i), budget)?);
            }
            Value::Array(items)
        }
        Conv::ToList(inner) => Value::Array(vec![read(inner, d, buf, path, budget)?]),
        Conv::Optional(inner, default) => {
            if matches!(d.datatype(), Ok(DType::Null | DType::Undefined)) {
                d.skip().map_err(DecodeError::from)?;
                default.clone().unwrap_or(Value::Null)
            } else {
                read(inner, d, buf, path, budget)?
            }
        }
        Conv::Struct {
            writer_len,
            fields,
            by_writer,
            in_order,
            ..
        } => {
            let n = definite(d, "a struct (an array)")?;
            if n != *writer_len {
                return Err(bad_value(
                    path,
                    format!("the writer's schema has {writer_len} fields, the payload {n}"),
                ));
            }
            if *in_order {
                let mut out = Vec::with_capacity(n);
                for (name, src) in fields {
                    let Source::Writer(_, conv) = src else {
                        unreachable!("in order: every field is the writer's")
                    };
                    let v = read(conv, d, buf, &Path::Field(path, name), budget)?;
                    out.push((Value::Text(name.clone()), v));
                }
                Value::Map(out)
            } else {
                let mut got: Vec<Option<Value>> = vec![None; fields.len()];
                for k in by_writer {
                    match k {
                        Some(k) => {
                            let (name, Source::Writer(_, conv)) = &fields[*k] else {
                                unreachable!("by_writer names writer fields")
                            };
                            got[*k] = Some(read(conv, d, buf, &Path::Field(path, name), budget)?);
                        }
                        None => d.skip().map_err(DecodeError::from)?,
                    }
                }
                let mut out = Vec::with_capacity(fields.len());
                for ((name, src), v) in fields.iter().zip(got) {
                    let v = match (v, src) {
                        (Some(v), _) => v,
                        (None, Source::Default(d)) => d.clone(),
                        (None, Source::Writer(..)) => Value::Null,
                    };
                    out.push((Value::Text(name.clone()), v));
                }
                Value::Map(out)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, Value)]) -> Value {
        Value::Map(
            pairs
                .iter()
                .map(|(k, v)| (Value::Text((*k).into()), v.clone()))
                .collect(),
        )
    }

    fn point() -> Type {
        Type::Struct(vec![Field::new("x", Type::F64), Field::new("y", Type::F64)])
    }

    fn v1() -> Schema {
        Schema::new(
            "track",
            vec![
                Field::new("id", Type::I32),
                Field::new("pos", point()),
                Field::new("kind", Type::Enum(vec!["air".into(), "ground".into()])),
                Field::new("speed", Type::F32),
                Field::new("wave", Type::Array(ElementType::F32)),
            ],
        )
    }

    fn sample() -> Value {
        map(&[
            ("id", Value::Int(7)),
            (
                "pos",
                map(&[("x", Value::Float(1.5)), ("y", Value::Float(-2.0))]),
            ),
            ("kind", Value::Text("ground".into())),
            ("speed", Value::Float(3.25)),
            (
                "wave",
                Value::Typed(TypedArray::from_vec(vec![1.0f32, 2.0])),
            ),
        ])
    }

    fn compact(s: &Schema, v: &Value) -> Bytes {
        let mut out = Vec::new();
        s.write_compact(v, &mut out).unwrap();
        Bytes::from(out)
    }

    #[test]
    fn a_value_round_trips_by_position_and_carries_no_field_name() {
        let s = v1();
        let b = compact(&s, &sample());
        assert!(
            !b.windows(2).any(|w| w == b"id"),
            "no field names on the wire"
        );
        assert_eq!(s.read_compact(&b).unwrap(), sample());
        // Smaller than the self-describing CBOR of the same value.
        let mut plain = Vec::new();
        crate::cbor::encode_cbor(&sample(), &mut plain).unwrap();
        assert!(
            b.len() * 3 < plain.len() * 2,
            "{} vs {}",
            b.len(),
            plain.len()
        );
    }

    #[test]
    fn a_schema_round_trips_and_its_id_follows_its_content() {
        let s = v1();
        let bytes = s.encode().unwrap();
        assert_eq!(Schema::decode(&bytes).unwrap(), s);
        let mut other = v1();
        other.fields[0].name = "ident".into();
        assert_ne!(
            Schema::id_of(&bytes),
            Schema::id_of(&other.encode().unwrap())
        );
        assert_ne!(Schema::id_of(&bytes), 0);
    }

    #[test]
    fn values_that_do_not_fit_are_refused_naming_the_field() {
        let s = v1();
        let mut out = Vec::new();
        let err = |v: Value| {
            s.write_compact(&v, &mut Vec::new())
                .unwrap_err()
                .to_string()
        };
        let mut v = sample();
        if let Value::Map(p) = &mut v {
            p[0].1 = Value::Int(1 << 40);
        }
        assert!(err(v).contains("field id"), "out of i32");
        let mut v = sample();
        if let Value::Map(p) = &mut v {
            p.push((Value::Text("extra".into()), Value::Null));
        }
        assert!(err(v).contains("extra"), "unknown key");
        let mut v = sample();
        if let Value::Map(p) = &mut v {
            p.remove(1);
        }
        assert!(err(v).contains("pos"), "missing field");
        let mut v = sample();
        if let Value::Map(p) = &mut v {
            p[2].1 = Value::Text("sea".into());
        }
        assert!(err(v).contains("sea"), "unknown variant");
        assert!(s.write_compact(&sample(), &mut out).is_ok());
    }

    #[test]
    fn invalid_schemas_are_refused() {
        let dup = Schema::new(
            "s",
            vec![Field::new("a", Type::I32), Field::new("a", Type::I64)],
        );
        assert!(dup.encode().is_err());
        let bad_default = Schema::new("s", vec![Field::new("a", Type::I32).default_value("x")]);
        assert!(bad_default.encode().is_err());
        let mut deep = Type::I32;
        for _ in 0..20 {
            deep = Type::List(Box::new(deep));
        }
        assert!(Schema::new("s", vec![Field::new("a", deep)])
            .encode()
            .is_err());
        for junk in [
            &b"\xa0"[..],
            b"\x01",
            b"\xa2dnameasffields\x81\x01",
            b"\xff",
        ] {
            assert!(Schema::decode(junk).is_err(), "{junk:?}");
        }
        let many: Vec<Field> = (0..2000)
            .map(|i| Field::new(format!("f{i}"), Type::Bool))
            .collect();
        assert!(Schema::new("s", many).encode().is_err());
    }

    fn read_as(reader: &Schema, writer: &Schema, v: &Value) -> Result<Value, String> {
        let plan = Plan::resolve(reader, writer).map_err(|e| e.to_string())?;
        plan.read(&compact(writer, v)).map_err(|e| e.to_string())
    }

    #[test]
    fn evolution_added_removed_reordered_renamed_and_widened_fields_agree_both_ways() {
        let w1 = Schema::new(
            "t",
            vec![
                Field::new("id", Type::I32),
                Field::new("x", Type::F32),
                Field::new("gone", Type::Text),
                Field::new("n", Type::U32),
            ],
        );
        let w2 = Schema::new(
            "t",
            vec![
                Field::new("x", Type::F64),
                Field::new("ident", Type::I64).alias("id"),
                Field::new("n", Type::List(Box::new(Type::U64))),
                Field::new("added", Type::Text).default_value("none"),
            ],
        );
        let v = map(&[
            ("id", Value::Int(5)),
            ("x", Value::Float(0.5)),
            ("gone", Value::Text("old".into())),
            ("n", Value::Int(9)),
        ]);
        // A v2 reader of a v1 writer: widened, renamed, defaulted, dropped.
        assert_eq!(
            read_as(&w2, &w1, &v).unwrap(),
            map(&[
                ("x", Value::Float(0.5)),
                ("ident", Value::Int(5)),
                ("n", Value::Array(vec![Value::Int(9)])),
                ("added", Value::Text("none".into())),
            ])
        );
        // The reverse: a v1 reader of a v2 writer lacks `gone`'s default,
        // and the writer narrows nothing it reads... but x is f64 -> f32.
        let err = Plan::resolve(&w1, &w2).unwrap_err();
        assert!(err.field == "x" || err.field == "id", "{err}");
        // A v1 reader that gave `gone` a default and reads x as f64 agrees
        // with v2 except for the list it cannot make a scalar.
        let mut r1 = w1.clone();
        r1.fields[1].ty = Type::F64;
        r1.fields[0] = Field::new("id", Type::I64).alias("ident");
        r1.fields[2] = r1.fields[2].clone().default_value("?");
        let err = Plan::resolve(&r1, &w2).unwrap_err();
        assert_eq!(err.field, "n");
        r1.fields[3].ty = Type::List(Box::new(Type::U64));
        let v2 = map(&[
            ("x", Value::Float(1.0)),
            ("ident", Value::Int(3)),
            ("n", Value::Array(vec![Value::Int(1), Value::Int(2)])),
        ]);
        assert_eq!(
            read_as(&r1, &w2, &v2).unwrap(),
            map(&[
                ("id", Value::Int(3)),
                ("x", Value::Float(1.0)),
                ("gone", Value::Text("?".into())),
                ("n", Value::Array(vec![Value::Int(1), Value::Int(2)])),
            ])
        );
    }

    #[test]
    fn narrowed_or_changed_kinds_are_incompatible_naming_the_field() {
        let w = Schema::new(
            "t",
            vec![Field::new("a", Type::I64), Field::new("p", point())],
        );
        let narrowed = Schema::new(
            "t",
            vec![Field::new("a", Type::I32), Field::new("p", point())],
        );
        assert_eq!(Plan::resolve(&narrowed, &w).unwrap_err().field, "a");
        let kind = Schema::new(
            "t",
            vec![Field::new("a", Type::Text), Field::new("p", point())],
        );
        assert_eq!(Plan::resolve(&kind, &w).unwrap_err().field, "a");
        let nested = Schema::new(
            "t",
            vec![
                Field::new("a", Type::I64),
                Field::new(
                    "p",
                    Type::Struct(vec![Field::new("x", Type::F32), Field::new("y", Type::F64)]),
                ),
            ],
        );
        assert_eq!(Plan::resolve(&nested, &w).unwrap_err().field, "p.x");
        let float_to_int = Schema::new(
            "t",
            vec![Field::new("p", point()), Field::new("a", Type::F64)],
        );
        assert!(Plan::resolve(&w, &float_to_int).is_err());
        // An enum the reader does not fully know.
        let we = Schema::new(
            "t",
            vec![Field::new("e", Type::Enum(vec!["a".into(), "b".into()]))],
        );
        let re = Schema::new("t", vec![Field::new("e", Type::Enum(vec!["a".into()]))]);
        assert_eq!(Plan::resolve(&re, &we).unwrap_err().field, "e");
        assert!(
            Plan::resolve(&we, &re).is_ok(),
            "a reader knowing more variants agrees"
        );
    }

    #[test]
    fn optional_fields_need_a_default_to_become_plain_and_arrays_widen() {
        let w = Schema::new(
            "t",
            vec![
                Field::new("o", Type::Optional(Box::new(Type::I32))),
                Field::new("w", Type::Array(ElementType::I16)),
                Field::new("s", Type::F32),
            ],
        );
        let r_plain = Schema::new("t", vec![Field::new("o", Type::I64)]);
        assert_eq!(Plan::resolve(&r_plain, &w).unwrap_err().field, "o");
        let r = Schema::new(
            "t",
            vec![
                Field::new("o", Type::I64).default_value(-1),
                Field::new("w", Type::Array(ElementType::F64)),
                Field::new("s", Type::Array(ElementType::F64)),
            ],
        );
        let v = map(&[
            ("o", Value::Null),
            ("w", Value::Array(vec![Value::Int(1), Value::Int(-2)])),
            ("s", Value::Float(0.5)),
        ]);
        let got = read_as(&r, &w, &v).unwrap();
        assert_eq!(got.get("o"), Some(&Value::Int(-1)));
        assert_eq!(
            got.get("w"),
            Some(&Value::Typed(TypedArray::from_vec(vec![1.0f64, -2.0])))
        );
        assert_eq!(
            got.get("s"),
            Some(&Value::Typed(TypedArray::from_vec(vec![0.5f64])))
        );
    }

    #[test]
    fn a_payload_that_does_not_match_its_writer_s_schema_is_an_error_not_a_value() {
        let s = v1();
        let plan = Plan::identity(&s);
        let mut other = Vec::new();
        crate::cbor::encode_cbor(&Value::Array(vec![Value::Int(1)]), &mut other).unwrap();
        assert!(plan.read(&Bytes::from(other)).is_err(), "too few fields");
        let mut wrong = Vec::new();
        let v = Value::Array(vec![
            Value::Text("x".into()),
            Value::Array(vec![Value::Float(1.0), Value::Float(2.0)]),
            Value::Int(0),
            Value::Float(1.0),
            Value::Typed(TypedArray::from_vec(vec![1.0f32])),
        ]);
        crate::cbor::encode_cbor(&v, &mut wrong).unwrap();
        assert!(plan
            .read(&Bytes::from(wrong))
            .unwrap_err()
            .to_string()
            .contains("id"));
        let mut idx = Vec::new();
        let v = Value::Array(vec![
            Value::Int(1),
            Value::Array(vec![Value::Float(1.0), Value::Float(2.0)]),
            Value::Int(5),
            Value::Float(1.0),
            Value::Typed(TypedArray::from_vec(vec![1.0f32])),
        ]);
        crate::cbor::encode_cbor(&v, &mut idx).unwrap();
        assert!(
            plan.read(&Bytes::from(idx)).is_err(),
            "enum index out of range"
        );
    }

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    enum Mode {
        Air,
        Ground,
    }

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Pos {
        x: f64,
        y: f64,
    }

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Rec {
        id: u16,
        pos: Pos,
        mode: Mode,
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<String>,
        wave: Vec<f32>,
        items: Vec<Pos>,
        extra: std::collections::BTreeMap<String, i32>,
    }

    fn rec() -> Rec {
        Rec {
            id: 7,
            pos: Pos { x: 1.5, y: -2.0 },
            mode: Mode::Ground,
            note: None,
            wave: vec![0.5, 1.0],
            items: vec![Pos { x: 0.0, y: 1.0 }],
            extra: [("a".to_owned(), 3)].into(),
        }
    }

    #[test]
    fn a_serde_type_written_straight_reads_back_and_equals_its_value_map_written() {
        let s = Schema::of::<Rec>().unwrap();
        assert_eq!(
            s.fields[2].ty,
            Type::Enum(vec!["Air".into(), "Ground".into()])
        );
        assert_eq!(s.fields[4].ty, Type::Array(ElementType::F32));
        assert_eq!(s.fields[6].ty, Type::Any);
        let w = s.writer();
        let mut direct = Vec::new();
        w.write_serde(&rec(), &mut direct).unwrap();
        // The same value through a Value map.
        let v =
            crate::cbor::decode_cbor(&Bytes::from(crate::cbor::to_cbor(&rec()).unwrap())).unwrap();
        let mut via = Vec::new();
        w.write(&v, &mut via).unwrap();
        assert_eq!(direct, via);
        let back = s.read_compact(&Bytes::from(direct)).unwrap();
        assert_eq!(crate::cbor::from_value::<Rec>(&back).unwrap(), rec());
        // Out of range for the schema's type.
        let narrow = Schema::new(
            "r",
            vec![Field::new("id", Type::U32), Field::new("pos", Type::Any)],
        );
        #[derive(serde::Serialize)]
        struct Neg {
            id: i64,
            pos: u8,
        }
        let err = narrow
            .writer()
            .write_serde(&Neg { id: -1, pos: 0 }, &mut Vec::new())
            .unwrap_err();
        assert!(err.to_string().contains("id"), "{err}");
    }

    #[test]
    fn the_protocol_s_example_is_written_byte_for_byte() {
        // docs/protocol.md §5.1.
        let s = Schema::new(
            "p",
            vec![
                Field::new("id", Type::I32),
                Field::new("kind", Type::Enum(vec!["a".into(), "b".into()])),
                Field::new("x", Type::F32),
            ],
        );
        let v = map(&[
            ("id", Value::Int(7)),
            ("kind", Value::Text("b".into())),
            ("x", Value::Float(0.5)),
        ]);
        let mut out = Vec::new();
        s.write_compact(&v, &mut out).unwrap();
        assert_eq!(out, [0x83, 0x07, 0x01, 0xfa, 0x3f, 0x00, 0x00, 0x00]);
        let mut plain = Vec::new();
        crate::cbor::encode_cbor(&v, &mut plain).unwrap();
        assert_eq!(plain.len(), 23);
        assert_eq!(s.read_compact(&Bytes::from(out)).unwrap(), v);
    }

    #[test]
    fn a_writer_field_two_reader_fields_claim_is_incompatible() {
        let w = Schema::new("t", vec![Field::new("b", Type::I32).alias("a")]);
        let r = Schema::new(
            "t",
            vec![Field::new("a", Type::I32), Field::new("b", Type::I32)],
        );
        assert_eq!(Plan::resolve(&r, &w).unwrap_err().field, "b");
    }

    #[test]
    fn indefinite_lengths_are_refused_and_defaults_take_their_field_s_shape() {
        let w = Schema::new("t", vec![Field::new("l", Type::List(Box::new(Type::I32)))]);
        // [[_ 5]] with an indefinite inner list.
        let p = Bytes::from_static(&[0x81, 0x9f, 0x05, 0xff]);
        assert!(Plan::identity(&w).read(&p).is_err());
        let r = Schema::new(
            "t",
            vec![
                Field::new("x", Type::F64).default_value(0),
                Field::new("e", Type::Enum(vec!["a".into(), "b".into()])).default_value("b"),
                Field::new("w", Type::Array(ElementType::F32))
                    .default_value(Value::Array(vec![Value::Int(1)])),
            ],
        );
        let w = Schema::new("t", vec![]);
        let got = Plan::resolve(&r, &w)
            .unwrap()
            .read(&Bytes::from_static(&[0x80]))
            .unwrap();
        assert_eq!(got.get("x"), Some(&Value::Float(0.0)));
        assert_eq!(got.get("e"), Some(&Value::Text("b".into())));
        assert_eq!(
            got.get("w"),
            Some(&Value::Typed(TypedArray::from_vec(vec![1.0f32])))
        );
    }

    #[test]
    fn a_fixed_size_array_is_written_as_a_typed_array() {
        #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
        struct Cov {
            m: [f32; 3],
        }
        let s = Schema::of::<Cov>().unwrap();
        assert_eq!(s.fields[0].ty, Type::Array(ElementType::F32));
        let mut out = Vec::new();
        s.writer()
            .write_serde(&Cov { m: [1.0, 2.0, 3.0] }, &mut out)
            .unwrap();
        let v = s.read_compact(&Bytes::from(out)).unwrap();
        assert_eq!(
            v.get("m"),
            Some(&Value::Typed(TypedArray::from_vec(vec![1.0f32, 2.0, 3.0])))
        );
    }
}
