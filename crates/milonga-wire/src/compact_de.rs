//! Reading a user type (serde) straight from a compact payload, guided by
//! a [`Plan`](crate::schema::Plan): no [`Value`] map is built on the way
//! (`Plan::deserialize`). It reads what [`Plan::read`](crate::schema::Plan::read)
//! reads, in the same single pass: writer fields the reader lacks are
//! skipped, fields the writer lacks take the reader's defaults, numbers
//! widen, enums arrive by the reader's variant names. A struct reaches the
//! type as a map of its reader's field names, so serde's derive matches
//! them in any order.

use bytes::Bytes;
use minicbor::data::Type as DType;
use minicbor::Decoder;
use serde::de::{
    self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor,
};

use crate::cbor::DecodeError;
use crate::schema::{Conv, Path, SchemaError, Source, Type};
use crate::value::{ElementType, TypedArray, Value};

/// Why a payload does not read as the type asked for. Boxed: every call
/// returns a `Result` of it, which stays one word wide.
#[derive(Debug)]
pub(crate) struct Error(Box<SchemaError>);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    #[cold]
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Error(Box::new(SchemaError::Value {
            path: String::new(),
            why: msg.to_string(),
        }))
    }
}

impl From<DecodeError> for Error {
    #[cold]
    fn from(e: DecodeError) -> Self {
        Error(Box::new(SchemaError::Decode(e)))
    }
}

impl From<minicbor::decode::Error> for Error {
    #[cold]
    fn from(e: minicbor::decode::Error) -> Self {
        DecodeError::from(e).into()
    }
}

impl Error {
    /// The error with the field it happened at, unless a field deeper
    /// down already named itself.
    #[cold]
    fn at(mut self, path: &Path<'_>) -> Self {
        if let SchemaError::Value { path: p, .. } = &mut *self.0 {
            if p.is_empty() {
                *p = path.to_string();
            }
        }
        self
    }
}

#[cold]
fn bad(path: &Path<'_>, why: impl Into<String>) -> Error {
    Error(Box::new(SchemaError::Value {
        path: path.to_string(),
        why: why.into(),
    }))
}

/// Reads `T` from `payload` by conversion `c` (a plan's root).
pub(crate) fn deserialize<'de, T: de::Deserialize<'de>>(
    c: &Conv,
    payload: &'de Bytes,
) -> Result<T, SchemaError> {
    let mut cx = Cx {
        d: Decoder::new(payload),
        buf: payload,
        budget: crate::cbor::MAX_ITEMS,
    };
    let t = T::deserialize(De {
        c,
        cx: &mut cx,
        path: &Path::Root,
    })
    .map_err(|e| *e.0)?;
    let rest = payload.len() - cx.d.position();
    if rest != 0 {
        return Err(SchemaError::Decode(DecodeError::TrailingBytes(rest)));
    }
    Ok(t)
}

/// The reading position, and how many more items may be read.
struct Cx<'de> {
    d: Decoder<'de>,
    buf: &'de Bytes,
    budget: usize,
}

/// One value to read: its conversion and where it is.
struct De<'c, 'x, 'de> {
    c: &'c Conv,
    cx: &'x mut Cx<'de>,
    path: &'x Path<'x>,
}

impl<'de> De<'_, '_, 'de> {
    fn wrong(&self, want: &str) -> Error {
        let found = match self.cx.d.datatype() {
            Ok(t) => format!("{t}"),
            Err(_) => "nothing".to_owned(),
        };
        bad(
            self.path,
            format!("the writer's schema says {want}, the payload holds {found}"),
        )
    }

    /// An integer of the writer's type `t`, range-checked: non-negative
    /// ones as `u64`, negative ones as `i64`.
    fn int(&mut self, t: &Type) -> Result<Int, Error> {
        let i = match self.major() {
            Some(0) => Int::U(self.cx.d.u64()?),
            Some(1) => {
                let i = i128::from(self.cx.d.int()?);
                match (u64::try_from(i), i64::try_from(i)) {
                    (Ok(u), _) => Int::U(u),
                    (_, Ok(s)) => Int::I(s),
                    _ => return Err(bad(self.path, format!("{i} does not fit {}", t.describe()))),
                }
            }
            _ => return Err(self.wrong(&t.describe())),
        };
        let fits = match (t, i) {
            (Type::I32, Int::U(u)) => u <= i32::MAX as u64,
            (Type::I32, Int::I(s)) => s >= i64::from(i32::MIN),
            (Type::I64, Int::U(u)) => u <= i64::MAX as u64,
            (Type::U32, Int::U(u)) => u <= u64::from(u32::MAX),
            (Type::U32 | Type::U64, Int::I(_)) => false,
            _ => true,
        };
        if !fits {
            return Err(bad(
                self.path,
                format!("{} does not fit {}", i.as_i128(), t.describe()),
            ));
        }
        Ok(i)
    }

    fn float(&mut self, t: &Type) -> Result<f64, Error> {
        Ok(match self.initial() {
            Some(0xf9) => f64::from(self.cx.d.f16()?),
            Some(0xfa) => f64::from(self.cx.d.f32()?),
            Some(0xfb) => self.cx.d.f64()?,
            _ => return Err(self.wrong(&t.describe())),
        })
    }

    /// The next item's initial byte (cheaper to look at than minicbor's
    /// `datatype`, which decodes the item's head).
    #[inline]
    fn initial(&self) -> Option<u8> {
        self.cx.buf.get(self.cx.d.position()).copied()
    }

    /// The next item's major type.
    #[inline]
    fn major(&self) -> Option<u8> {
        self.initial().map(|b| b >> 5)
    }

    /// A definite length, within the budget (a compact writer's lengths
    /// are definite: docs/protocol.md §5.1).
    fn definite(&mut self, what: &str) -> Result<usize, Error> {
        if self.major() != Some(4) {
            return Err(self.wrong(what));
        }
        let Some(n) = self.cx.d.array()? else {
            return Err(bad(self.path, "an indefinite-length array"));
        };
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.cx.budget)
            .ok_or_else(|| DecodeError::TooManyItems.into())
    }

    fn is_null(&self) -> bool {
        matches!(self.cx.d.datatype(), Ok(DType::Null | DType::Undefined))
    }

    /// Reads the value as a [`Value`] the way [`Plan::read`] does, for the
    /// rare conversions read no faster directly (a value of type `any`, a
    /// scalar made a list or an array of one).
    ///
    /// [`Plan::read`]: crate::schema::Plan::read
    fn via_value<V: Visitor<'de>>(mut self, v: V) -> Result<V::Value, Error> {
        let x = self.read_value()?;
        crate::value_de::value_deserializer(&x)
            .deserialize_any(v)
            .map_err(|e| bad(self.path, e.to_string()))
    }

    /// The value as [`Plan::read`](crate::schema::Plan::read) reads it.
    fn read_value(&mut self) -> Result<Value, Error> {
        crate::schema::read(
            self.c,
            &mut self.cx.d,
            self.cx.buf,
            self.path,
            &mut self.cx.budget,
        )
        .map_err(|e| Error(Box::new(e)))
    }

    fn spend(&mut self) -> Result<(), Error> {
        self.cx.budget = self
            .cx
            .budget
            .checked_sub(1)
            .ok_or(DecodeError::TooManyItems)?;
        Ok(())
    }

    fn any<V: Visitor<'de>>(mut self, v: V) -> Result<V::Value, Error> {
        match self.c {
            Conv::Keep(t) => match t {
                Type::Bool => {
                    if !matches!(self.cx.d.datatype(), Ok(DType::Bool)) {
                        return Err(self.wrong("bool"));
                    }
                    v.visit_bool(self.cx.d.bool()?)
                }
                Type::I32 | Type::I64 | Type::U32 | Type::U64 => match self.int(t)? {
                    Int::U(u) => v.visit_u64(u),
                    Int::I(s) => v.visit_i64(s),
                },
                Type::Text => {
                    if !matches!(self.cx.d.datatype(), Ok(DType::String)) {
                        return Err(self.wrong("text"));
                    }
                    v.visit_borrowed_str(self.cx.d.str()?)
                }
                Type::Bytes => {
                    if !matches!(self.cx.d.datatype(), Ok(DType::Bytes)) {
                        return Err(self.wrong("bytes"));
                    }
                    v.visit_borrowed_bytes(self.cx.d.bytes()?)
                }
                _ => self.via_value(v),
            },
            Conv::ToFloat(t) => match t {
                Type::F32 | Type::F64 => {
                    let f = self.float(t)?;
                    v.visit_f64(f)
                }
                t => {
                    let f = self.int(t)?.as_i128() as f64;
                    v.visit_f64(f)
                }
            },
            Conv::Enum(names) => {
                let name = self.variant(names)?;
                v.visit_str(name)
            }
            Conv::Array { from, to } => {
                if !matches!(self.cx.d.datatype(), Ok(DType::Tag)) {
                    return Err(self.wrong(&format!("array<{}>", from.name())));
                }
                match crate::cbor::read_item(&mut self.cx.d, self.cx.buf, &mut self.cx.budget)? {
                    Value::Typed(a) if a.element() == *from => {
                        if from != to
                            && a.len().saturating_mul(to.size()) > crate::schema::MAX_WIDENED_BYTES
                        {
                            return Err(bad(
                                self.path,
                                format!(
                                    "{} elements widened to {} pass {} bytes",
                                    a.len(),
                                    to.name(),
                                    crate::schema::MAX_WIDENED_BYTES
                                ),
                            ));
                        }
                        let mut items = Elements {
                            a: &a,
                            to: *to,
                            i: 0,
                        };
                        let r = v.visit_seq(&mut items)?;
                        if items.i != a.len() {
                            return Err(bad(
                                self.path,
                                format!(
                                    "the type reads {} of the array's {} elements",
                                    items.i,
                                    a.len()
                                ),
                            ));
                        }
                        Ok(r)
                    }
                    _ => Err(bad(
                        self.path,
                        format!("the writer's schema says array<{}>", from.name()),
                    )),
                }
            }
            Conv::List(inner) => {
                let n = self.definite("a list")?;
                let mut items = List {
                    inner,
                    cx: self.cx,
                    path: self.path,
                    next: 0,
                    left: n,
                };
                let r = v.visit_seq(&mut items)?;
                // A type that stops early (a fixed-size array) must not
                // leave items behind: the next field would read them.
                if items.left != 0 {
                    return Err(bad(
                        self.path,
                        format!("the type reads {} of the list's {n} items", n - items.left),
                    ));
                }
                Ok(r)
            }
            Conv::ToArray { .. } | Conv::ToList(_) => self.via_value(v),
            Conv::Optional(inner, default) => {
                if self.is_null() {
                    self.cx.d.skip()?;
                    let d = default.as_ref().unwrap_or(&Value::Null);
                    crate::value_de::value_deserializer(d)
                        .deserialize_any(v)
                        .map_err(|e| bad(self.path, e.to_string()))
                } else {
                    De {
                        c: inner,
                        cx: self.cx,
                        path: self.path,
                    }
                    .any(v)
                }
            }
            Conv::Struct {
                writer_len,
                fields,
                by_writer,
                ..
            } => {
                let n = self.definite("a struct (an array)")?;
                if n != *writer_len {
                    return Err(bad(
                        self.path,
                        format!("the writer's schema has {writer_len} fields, the payload {n}"),
                    ));
                }
                let mut map = Fields {
                    fields,
                    by_writer,
                    cx: self.cx,
                    path: self.path,
                    writer: 0,
                    reader: 0,
                    pending: None,
                };
                let r = v.visit_map(&mut map)?;
                if map.writer < map.by_writer.len() || map.pending.is_some() {
                    return Err(bad(
                        self.path,
                        "the type stopped before the struct's last field",
                    ));
                }
                Ok(r)
            }
        }
    }

    /// An enum's index, as the reader's variant name.
    fn variant<'n>(&mut self, names: &'n [String]) -> Result<&'n str, Error> {
        let i = match self.int(&Type::U32)? {
            Int::U(u) => u as usize,
            Int::I(_) => usize::MAX,
        };
        names
            .get(i)
            .map(String::as_str)
            .ok_or_else(|| bad(self.path, format!("enum index {i} out of range")))
    }
}

#[derive(Clone, Copy)]
enum Int {
    U(u64),
    I(i64),
}

impl Int {
    fn as_i128(self) -> i128 {
        match self {
            Int::U(u) => i128::from(u),
            Int::I(s) => i128::from(s),
        }
    }
}

impl<'de> Deserializer<'de> for De<'_, '_, 'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(mut self, v: V) -> Result<V::Value, Error> {
        self.spend()?;
        let path = self.path;
        self.any(v).map_err(|e| e.at(path))
    }

    fn deserialize_option<V: Visitor<'de>>(mut self, v: V) -> Result<V::Value, Error> {
        self.spend()?;
        let path = self.path;
        let r = match self.c {
            Conv::Optional(inner, default) => {
                if self.is_null() {
                    self.cx.d.skip()?;
                    match default {
                        Some(d) if *d != Value::Null => v
                            .visit_some(crate::value_de::value_deserializer(d))
                            .map_err(|e| bad(path, e.to_string())),
                        _ => v.visit_none(),
                    }
                } else {
                    v.visit_some(De {
                        c: inner,
                        cx: self.cx,
                        path,
                    })
                }
            }
            // What the map path gives: a null of type `any` is `None`.
            Conv::Keep(Type::Any) | Conv::ToList(_) | Conv::ToArray { .. } => {
                let x = self.read_value()?;
                crate::value_de::value_deserializer(&x)
                    .deserialize_option(v)
                    .map_err(|e| bad(path, e.to_string()))
            }
            _ => v.visit_some(self),
        };
        r.map_err(|e| e.at(path))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        mut self,
        name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        let path = self.path;
        self.spend()?;
        match self.c {
            Conv::Enum(names) => {
                let name = self.variant(names)?;
                v.visit_enum(name.into_deserializer())
                    .map_err(|e: Error| e.at(path))
            }
            // A writer's optional enum read into a plain one (its default
            // for null), or an enum in a value of type `any`: as the map
            // path reads it.
            Conv::Optional(inner, default) => {
                if self.is_null() {
                    self.cx.d.skip()?;
                    crate::value_de::value_deserializer(default.as_ref().unwrap_or(&Value::Null))
                        .deserialize_enum(name, variants, v)
                        .map_err(|e| bad(path, e.to_string()))
                } else {
                    De {
                        c: inner,
                        cx: self.cx,
                        path,
                    }
                    .deserialize_enum(name, variants, v)
                }
            }
            _ => {
                let x = self.read_value()?;
                crate::value_de::value_deserializer(&x)
                    .deserialize_enum(name, variants, v)
                    .map_err(|e| bad(path, e.to_string()))
            }
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, Error> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(mut self, v: V) -> Result<V::Value, Error> {
        // One conversion reads one CBOR item, whatever it is (a field the
        // type ignores is skipped, not checked against its schema).
        self.spend()?;
        self.cx.d.skip()?;
        v.visit_unit()
    }

    fn deserialize_struct<V: Visitor<'de>>(
        mut self,
        _name: &'static str,
        names: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        // A type whose fields are the writer's, in the writer's order,
        // reads by position: serde's `visit_seq`, no names compared.
        let Conv::Struct {
            writer_len,
            fields,
            in_order: true,
            seen,
            ..
        } = self.c
        else {
            return self.deserialize_any(v);
        };
        if !seen.matches(names, fields) {
            return self.deserialize_any(v);
        }
        self.spend()?;
        let path = self.path;
        let n = self.definite("a struct (an array)")?;
        if n != *writer_len {
            return Err(bad(
                path,
                format!("the writer's schema has {writer_len} fields, the payload {n}"),
            ));
        }
        let mut items = InOrder {
            fields: fields.iter(),
            cx: self.cx,
            path,
        };
        let r = v.visit_seq(&mut items).map_err(|e| e.at(path))?;
        if items.fields.len() != 0 {
            return Err(bad(
                path,
                format!(
                    "the type reads {} of the struct's {n} fields",
                    n - items.fields.len()
                ),
            ));
        }
        Ok(r)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map
        identifier
    }
}

/// A struct's fields by position, when the type's are the writer's in
/// order.
struct InOrder<'c, 'x, 'de> {
    fields: std::slice::Iter<'c, (String, Source)>,
    cx: &'x mut Cx<'de>,
    path: &'x Path<'x>,
}

impl<'de> SeqAccess<'de> for InOrder<'_, '_, 'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        let Some((name, src)) = self.fields.next() else {
            return Ok(None);
        };
        let Source::Writer(_, conv) = src else {
            unreachable!("in order: every field is the writer's")
        };
        let at = Path::Field(self.path, name);
        seed.deserialize(De {
            c: conv,
            cx: self.cx,
            path: &at,
        })
        .map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.fields.len())
    }
}

/// A list's items.
struct List<'c, 'x, 'de> {
    inner: &'c Conv,
    cx: &'x mut Cx<'de>,
    path: &'x Path<'x>,
    next: usize,
    left: usize,
}

impl<'de> SeqAccess<'de> for List<'_, '_, 'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        let at = Path::Index(self.path, self.next);
        self.next += 1;
        seed.deserialize(De {
            c: self.inner,
            cx: self.cx,
            path: &at,
        })
        .map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

/// A typed array's elements, as the reader's element type (widened:
/// integers stay integers, anything read as a float is a float).
struct Elements<'a> {
    a: &'a TypedArray,
    to: ElementType,
    i: usize,
}

impl<'de> SeqAccess<'de> for Elements<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        if self.i >= self.a.len() {
            return Ok(None);
        }
        let i = self.i;
        self.i += 1;
        if matches!(self.to, ElementType::F32 | ElementType::F64) {
            let f = self.a.get_f64(i).unwrap_or(f64::NAN);
            return seed.deserialize(f.into_deserializer()).map(Some);
        }
        match self.a.value_at(i) {
            Some(Value::Int(n)) => match (u64::try_from(n), i64::try_from(n)) {
                (Ok(u), _) => seed.deserialize(u.into_deserializer()).map(Some),
                (_, Ok(s)) => seed.deserialize(s.into_deserializer()).map(Some),
                _ => Err(de::Error::custom(format!("element {i}: {n} out of range"))),
            },
            other => Err(de::Error::custom(format!(
                "element {i}: {other:?} is not an integer"
            ))),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.a.len() - self.i)
    }
}

/// What the map gives next: a writer's field to read, or a default.
enum Pending<'c> {
    Writer(&'c Conv, &'c str),
    Default(&'c Value, &'c str),
}

/// A struct's fields, as a map of the reader's names: the writer's fields
/// in the writer's order (those the reader lacks skipped), then the
/// reader's defaults for the fields the writer lacks.
struct Fields<'c, 'x, 'de> {
    fields: &'c [(String, Source)],
    by_writer: &'c [Option<usize>],
    cx: &'x mut Cx<'de>,
    path: &'x Path<'x>,
    writer: usize,
    reader: usize,
    pending: Option<Pending<'c>>,
}

impl<'de> MapAccess<'de> for Fields<'_, '_, 'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        while self.writer < self.by_writer.len() {
            let w = self.writer;
            self.writer += 1;
            match self.by_writer[w] {
                Some(k) => {
                    let (name, Source::Writer(_, conv)) = &self.fields[k] else {
                        unreachable!("by_writer names writer fields")
                    };
                    self.pending = Some(Pending::Writer(conv, name));
                    return seed
                        .deserialize(name.as_str().into_deserializer())
                        .map(Some);
                }
                None => self.cx.d.skip()?,
            }
        }
        while self.reader < self.fields.len() {
            let (name, src) = &self.fields[self.reader];
            self.reader += 1;
            if let Source::Default(d) = src {
                self.pending = Some(Pending::Default(d, name));
                return seed
                    .deserialize(name.as_str().into_deserializer())
                    .map(Some);
            }
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        match self.pending.take() {
            Some(Pending::Writer(conv, name)) => {
                let at = Path::Field(self.path, name);
                seed.deserialize(De {
                    c: conv,
                    cx: self.cx,
                    path: &at,
                })
            }
            Some(Pending::Default(d, name)) => seed
                .deserialize(crate::value_de::value_deserializer(d))
                .map_err(|e| bad(&Path::Field(self.path, name), e.to_string())),
            None => Err(de::Error::custom("a field's value asked before its name")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.fields.len())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    use crate::schema::{Field, Plan, Schema, Type};
    use crate::value::{ElementType, Value};
    use bytes::Bytes;

    #[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
    enum Mode {
        Air,
        Ground,
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
    struct Pos {
        x: f64,
        y: f64,
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
    struct Rec {
        id: u16,
        pos: Pos,
        mode: Mode,
        note: Option<String>,
        wave: Vec<f32>,
        items: Vec<Pos>,
        extra: BTreeMap<String, i32>,
        raw: serde_bytes_like::Raw,
    }

    /// Bytes as a CBOR byte string (serde's `Vec<u8>` is a sequence).
    mod serde_bytes_like {
        #[derive(Debug, PartialEq, Clone)]
        pub struct Raw(pub Vec<u8>);

        impl serde::Serialize for Raw {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(&self.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for Raw {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = Raw;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str("bytes")
                    }
                    fn visit_bytes<E>(self, b: &[u8]) -> Result<Raw, E> {
                        Ok(Raw(b.to_vec()))
                    }
                }
                d.deserialize_bytes(V)
            }
        }
    }

    fn rec(note: Option<&str>) -> Rec {
        Rec {
            id: 7,
            pos: Pos { x: 1.5, y: -2.0 },
            mode: Mode::Ground,
            note: note.map(str::to_owned),
            wave: vec![0.5, 1.0],
            items: vec![Pos { x: 0.0, y: 1.0 }, Pos { x: 2.0, y: 3.0 }],
            extra: [("a".to_owned(), 3)].into(),
            raw: serde_bytes_like::Raw(vec![1, 2, 3]),
        }
    }

    fn written<T: Serialize>(s: &Schema, v: &T) -> Bytes {
        let mut out = Vec::new();
        s.writer().write_serde(v, &mut out).unwrap();
        Bytes::from(out)
    }

    #[test]
    fn a_type_reads_straight_from_its_payload_as_through_the_value_map() {
        let s = Schema::of::<Rec>().unwrap();
        let plan = Plan::identity(&s);
        for note in [None, Some("hello")] {
            let b = written(&s, &rec(note));
            let direct: Rec = plan.deserialize(&b).unwrap();
            assert_eq!(direct, rec(note));
            // The same as the map a subscriber delivers, deserialized.
            let via: Rec = crate::cbor::from_value(&plan.read(&b).unwrap()).unwrap();
            assert_eq!(direct, via);
            // Read twice: the second read goes by position (the type was
            // seen), and gives the same.
            assert_eq!(plan.deserialize::<Rec>(&b).unwrap(), rec(note));
        }
        // Strings borrow from the payload.
        #[derive(Deserialize)]
        struct Borrowing<'a> {
            note: Option<&'a str>,
        }
        let b = written(&s, &rec(Some("view")));
        let v: Borrowing<'_> = plan.deserialize(&b).unwrap();
        assert_eq!(v.note, Some("view"));
    }

    /// A type whose fields are the writer's in another order, or a subset,
    /// reads by name: never a value in the wrong field.
    #[test]
    fn a_type_in_another_field_order_reads_by_name() {
        #[derive(Deserialize, Debug, PartialEq)]
        struct Swapped {
            y: f64,
            x: f64,
        }
        #[derive(Deserialize, Debug, PartialEq)]
        struct OnlyY {
            y: f64,
        }
        let s = Schema::of::<Pos>().unwrap();
        let plan = Plan::identity(&s);
        let b = written(&s, &Pos { x: 1.0, y: 2.0 });
        // The in-order type first, so that the plan has seen one.
        assert_eq!(plan.deserialize::<Pos>(&b).unwrap(), Pos { x: 1.0, y: 2.0 });
        assert_eq!(
            plan.deserialize::<Swapped>(&b).unwrap(),
            Swapped { y: 2.0, x: 1.0 }
        );
        assert_eq!(plan.deserialize::<OnlyY>(&b).unwrap(), OnlyY { y: 2.0 });
        assert_eq!(plan.deserialize::<Pos>(&b).unwrap(), Pos { x: 1.0, y: 2.0 });
    }

    #[test]
    fn evolved_writers_read_into_the_reader_s_type() {
        // Writer v1: id i32, x f32, gone text, n u32, mode enum.
        let w1 = Schema::new(
            "t",
            vec![
                Field::new("id", Type::I32),
                Field::new("x", Type::F32),
                Field::new("gone", Type::Text),
                Field::new("n", Type::U32),
                Field::new("mode", Type::Enum(vec!["Air".into(), "Ground".into()])),
                Field::new("wave", Type::Array(ElementType::I16)),
                Field::new("maybe", Type::Optional(Box::new(Type::I32))),
            ],
        );
        // Reader v2: reordered, renamed, widened, a field added with a
        // default, a scalar made a list, an optional given a default.
        #[derive(Deserialize, Debug, PartialEq)]
        struct V2 {
            x: f64,
            ident: i64,
            n: Vec<u64>,
            added: String,
            mode: Mode,
            wave: Vec<f64>,
            maybe: i64,
        }
        let r2 = Schema::new(
            "t",
            vec![
                Field::new("x", Type::F64),
                Field::new("ident", Type::I64).alias("id"),
                Field::new("n", Type::List(Box::new(Type::U64))),
                Field::new("added", Type::Text).default_value("none"),
                Field::new(
                    "mode",
                    Type::Enum(vec!["Ground".into(), "Sea".into(), "Air".into()]),
                ),
                Field::new("wave", Type::Array(ElementType::F64)),
                Field::new("maybe", Type::I64).default_value(-1),
            ],
        );
        let plan = Plan::resolve(&r2, &w1).unwrap();
        let value = |maybe: Value| {
            Value::Map(
                [
                    ("id", Value::Int(5)),
                    ("x", Value::Float(0.5)),
                    ("gone", Value::Text("old".into())),
                    ("n", Value::Int(9)),
                    ("mode", Value::Text("Ground".into())),
                    ("wave", Value::Array(vec![Value::Int(-3), Value::Int(4)])),
                    ("maybe", maybe),
                ]
                .into_iter()
                .map(|(k, v)| (Value::Text(k.into()), v))
                .collect(),
            )
        };
        for (maybe, want) in [(Value::Null, -1), (Value::Int(12), 12)] {
            let mut out = Vec::new();
            w1.write_compact(&value(maybe), &mut out).unwrap();
            let b = Bytes::from(out);
            let v: V2 = plan.deserialize(&b).unwrap();
            assert_eq!(
                v,
                V2 {
                    x: 0.5,
                    ident: 5,
                    n: vec![9],
                    added: "none".into(),
                    mode: Mode::Ground,
                    wave: vec![-3.0, 4.0],
                    maybe: want,
                }
            );
            // As the map path reads it.
            let via: V2 = crate::cbor::from_value(&plan.read(&b).unwrap()).unwrap();
            assert_eq!(via, v);
        }
    }

    /// A type that reads fewer items than a list holds (a fixed-size
    /// array) is an error, never the next field reading what is left.
    #[test]
    fn a_type_that_stops_early_is_an_error_not_a_shifted_value() {
        let writer = Schema::new(
            "w",
            vec![
                Field::new(
                    "a",
                    Type::List(Box::new(Type::Struct(vec![
                        Field::new("x", Type::F64),
                        Field::new("y", Type::F64),
                    ]))),
                ),
                Field::new("b", Type::Text),
                Field::new("w", Type::Array(ElementType::F32)),
            ],
        );
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct Short {
            a: [Pos; 2],
            b: String,
            w: Vec<f32>,
        }
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct ShortArray {
            a: Vec<Pos>,
            b: String,
            w: [f32; 2],
        }
        let pos = |x: f64| {
            Value::Map(vec![
                (Value::Text("x".into()), Value::Float(x)),
                (Value::Text("y".into()), Value::Float(0.0)),
            ])
        };
        let mut out = Vec::new();
        writer
            .write_compact(
                &Value::Map(vec![
                    (
                        Value::Text("a".into()),
                        Value::Array(vec![pos(1.0), pos(2.0), pos(3.0)]),
                    ),
                    (Value::Text("b".into()), Value::Text("b".into())),
                    (
                        Value::Text("w".into()),
                        Value::Array(vec![Value::Float(1.0); 3]),
                    ),
                ]),
                &mut out,
            )
            .unwrap();
        let b = Bytes::from(out);
        let plan = Plan::identity(&writer);
        for _ in 0..2 {
            let err = plan.deserialize::<Short>(&b).unwrap_err().to_string();
            assert!(err.contains("2 of the list's 3"), "{err}");
            let err = plan.deserialize::<ShortArray>(&b).unwrap_err().to_string();
            assert!(err.contains("2 of the array's 3"), "{err}");
            // The map path refuses them too.
            let map = plan.read(&b).unwrap();
            assert!(crate::cbor::from_value::<Short>(&map).is_err());
            assert!(crate::cbor::from_value::<ShortArray>(&map).is_err());
        }
    }

    /// A writer's optional enum read into a plain enum with a default, and
    /// a null of type `any` read into an `Option`: as the map path reads
    /// them.
    #[test]
    fn optional_enums_and_null_anys_read_as_through_the_map() {
        let modes = || Type::Enum(vec!["Air".into(), "Ground".into()]);
        let writer = Schema::new(
            "w",
            vec![
                Field::new("mode", Type::Optional(Box::new(modes()))),
                Field::new("extra", Type::Any),
            ],
        );
        let reader = Schema::new(
            "r",
            vec![
                Field::new("mode", modes()).default_value("Air"),
                Field::new("extra", Type::Any),
            ],
        );
        #[derive(Deserialize, Debug, PartialEq)]
        struct R {
            mode: Mode,
            extra: Option<i64>,
        }
        let plan = Plan::resolve(&reader, &writer).unwrap();
        for (mode, extra, want) in [
            (
                Value::Text("Ground".into()),
                Value::Int(4),
                R {
                    mode: Mode::Ground,
                    extra: Some(4),
                },
            ),
            (
                Value::Null,
                Value::Null,
                R {
                    mode: Mode::Air,
                    extra: None,
                },
            ),
        ] {
            let mut out = Vec::new();
            writer
                .write_compact(
                    &Value::Map(vec![
                        (Value::Text("mode".into()), mode),
                        (Value::Text("extra".into()), extra),
                    ]),
                    &mut out,
                )
                .unwrap();
            let b = Bytes::from(out);
            let via: R = crate::cbor::from_value(&plan.read(&b).unwrap()).unwrap();
            assert_eq!(via, want);
            assert_eq!(plan.deserialize::<R>(&b).unwrap(), want);
        }
    }

    #[test]
    fn payloads_that_do_not_fit_are_errors_naming_the_field() {
        let s = Schema::of::<Pos>().unwrap();
        let plan = Plan::identity(&s);
        // y holds text where the schema says f64.
        let bad = Bytes::from_static(b"\x82\xfb\x3f\xf0\0\0\0\0\0\0\x61a");
        let err = plan.deserialize::<Pos>(&bad).unwrap_err().to_string();
        assert!(err.contains('y') && err.contains("f64"), "{err}");
        // One field short, trailing bytes, truncated, indefinite length.
        for junk in [
            &b"\x81\xfb\x3f\xf0\0\0\0\0\0\0"[..],
            b"\x82\xfb\x3f\xf0\0\0\0\0\0\0\xfb\x3f\xf0\0\0\0\0\0\0\x00",
            b"\x82\xfb\x3f\xf0",
            b"\x9f\xff",
            b"",
        ] {
            let b = Bytes::copy_from_slice(junk);
            assert!(plan.deserialize::<Pos>(&b).is_err(), "{junk:?}");
            assert!(plan.read(&b).is_err(), "{junk:?}");
        }
        // A value that fits the schema but not the type: the type's error,
        // at its field.
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct Narrow {
            x: u8,
            y: f64,
        }
        let n = Schema::new(
            "n",
            vec![Field::new("x", Type::I32), Field::new("y", Type::F64)],
        );
        let mut out = Vec::new();
        n.write_compact(
            &Value::Map(vec![
                (Value::Text("x".into()), Value::Int(300)),
                (Value::Text("y".into()), Value::Float(1.0)),
            ]),
            &mut out,
        )
        .unwrap();
        let err = Plan::identity(&n)
            .deserialize::<Narrow>(&Bytes::from(out))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("field x:") && err.contains("300"), "{err}");
    }
}
