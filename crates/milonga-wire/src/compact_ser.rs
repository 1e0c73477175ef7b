//! Writing a user type (serde) in the compact encoding straight from its
//! `Serialize`, guided by the schema: no [`Value`] is built on the way
//! (`Schema::write_serde`). A struct's fields come in its declaration
//! order, which is the schema's when the schema was traced from the type
//! (`Schema::of`); a field the type skips takes its default or null.

use serde::ser::{self, Impossible, Serialize};

use crate::compact::{head, Compact as _};
use crate::schema::{Field, Path, SchemaError, Type};
use crate::value::{ElementType, Value};

/// An integer in CBOR's range (checked by the caller).
fn int(out: &mut Vec<u8>, i: i128) {
    if i >= 0 {
        head(out, 0, i as u64);
    } else {
        head(out, 1, (-1 - i) as u64);
    }
}

/// Why a value does not fit: carried as serde's error, turned into
/// [`SchemaError::Value`]. Boxed: every call of the serializer returns a
/// `Result<(), Error>`, which stays one word wide.
#[derive(Debug)]
pub(crate) struct Error(pub(crate) Box<SchemaError>);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Error(Box::new(SchemaError::Value {
            path: String::new(),
            why: msg.to_string(),
        }))
    }
}

#[cold]
fn bad(path: &Path<'_>, why: impl Into<String>) -> Error {
    Error(Box::new(SchemaError::Value {
        path: path.to_string(),
        why: why.into(),
    }))
}

/// Writes `v` as a value of `root` (a schema's struct) into `out`.
pub(crate) fn write<T: Serialize + ?Sized>(
    root: &Type,
    v: &T,
    out: &mut Vec<u8>,
) -> Result<(), SchemaError> {
    v.serialize(Compact {
        ty: root,
        out,
        path: &Path::Root,
    })
    .map_err(|e| *e.0)
}

/// Writes a value whose type is `any`: plain CBOR.
fn write_any<T: Serialize + ?Sized>(
    v: &T,
    out: &mut Vec<u8>,
    path: &Path<'_>,
) -> Result<(), Error> {
    let b = crate::cbor::to_cbor(v).map_err(|e| bad(path, e.to_string()))?;
    out.extend_from_slice(&b);
    Ok(())
}

/// Writes `v` as a value of `ty`.
fn write_typed<T: Serialize + ?Sized>(
    ty: &Type,
    v: &T,
    out: &mut Vec<u8>,
    path: &Path<'_>,
) -> Result<(), Error> {
    match ty {
        Type::Any => write_any(v, out, path),
        ty => v.serialize(Compact { ty, out, path }),
    }
}

struct Compact<'a> {
    ty: &'a Type,
    out: &'a mut Vec<u8>,
    path: &'a Path<'a>,
}

impl<'a> Compact<'a> {
    /// The type a value is written as: an optional's inner type (a value
    /// is present).
    fn inner(&self) -> &'a Type {
        match self.ty {
            Type::Optional(t) => t,
            t => t,
        }
    }

    fn int(self, i: i128) -> Result<(), Error> {
        let (lo, hi) = match self.inner() {
            Type::I32 => (i128::from(i32::MIN), i128::from(i32::MAX)),
            Type::I64 => (i128::from(i64::MIN), i128::from(i64::MAX)),
            Type::U32 => (0, i128::from(u32::MAX)),
            Type::U64 => (0, i128::from(u64::MAX)),
            Type::F32 => {
                (i as f32).write_compact(self.out);
                return Ok(());
            }
            Type::F64 => {
                (i as f64).write_compact(self.out);
                return Ok(());
            }
            Type::Any => (-(1i128 << 64), (1i128 << 64) - 1),
            t => return Err(self.mismatch(t, "an integer")),
        };
        if !(lo..=hi).contains(&i) {
            return Err(bad(
                self.path,
                format!("{i} does not fit {}", self.inner().describe()),
            ));
        }
        int(self.out, i);
        Ok(())
    }

    fn float(self, f: f64) -> Result<(), Error> {
        match self.inner() {
            Type::F32 => (f as f32).write_compact(self.out),
            Type::F64 | Type::Any => f.write_compact(self.out),
            t => return Err(self.mismatch(t, "a float")),
        };
        Ok(())
    }

    #[cold]
    fn mismatch(&self, t: &Type, found: &str) -> Error {
        bad(
            self.path,
            format!("expected {}, found {found}", t.describe()),
        )
    }
}

impl<'a> ser::Serializer for Compact<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Seq<'a>;
    type SerializeTuple = Seq<'a>;
    type SerializeTupleStruct = Impossible<(), Error>;
    type SerializeTupleVariant = Impossible<(), Error>;
    type SerializeMap = Impossible<(), Error>;
    type SerializeStruct = Struct<'a>;
    type SerializeStructVariant = Impossible<(), Error>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        match self.inner() {
            Type::Bool | Type::Any => {
                self.out.push(if v { 0xf5 } else { 0xf4 });
                Ok(())
            }
            t => Err(self.mismatch(t, "bool")),
        }
    }
    fn serialize_i8(self, v: i8) -> Result<(), Error> {
        self.int(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result<(), Error> {
        self.int(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result<(), Error> {
        self.int(v.into())
    }
    fn serialize_i64(self, v: i64) -> Result<(), Error> {
        self.int(v.into())
    }
    fn serialize_i128(self, v: i128) -> Result<(), Error> {
        self.int(v)
    }
    fn serialize_u8(self, v: u8) -> Result<(), Error> {
        self.int(v.into())
    }
    fn serialize_u16(self, v: u16) -> Result<(), Error> {
        self.int(v.into())
    }
    fn serialize_u32(self, v: u32) -> Result<(), Error> {
        self.int(v.into())
    }
    fn serialize_u64(self, v: u64) -> Result<(), Error> {
        self.int(v.into())
    }
    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        let i = i128::try_from(v).map_err(|_| bad(self.path, format!("{v} is too large")))?;
        self.int(i)
    }
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        self.float(v.into())
    }
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        self.float(v)
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        match self.inner() {
            Type::Text | Type::Any => {
                head(self.out, 3, v.len() as u64);
                self.out.extend_from_slice(v.as_bytes());
                Ok(())
            }
            Type::Enum(names) => match names.iter().position(|n| n == v) {
                Some(i) => {
                    head(self.out, 0, i as u64);
                    Ok(())
                }
                None => Err(bad(self.path, format!("{v:?} is not a variant"))),
            },
            t => Err(self.mismatch(t, "text")),
        }
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        match self.inner() {
            Type::Bytes | Type::Any => {
                head(self.out, 2, v.len() as u64);
                self.out.extend_from_slice(v);
                Ok(())
            }
            t => Err(self.mismatch(t, "bytes")),
        }
    }
    fn serialize_none(self) -> Result<(), Error> {
        match self.ty {
            Type::Optional(_) | Type::Any => {
                self.out.push(0xf6);
                Ok(())
            }
            t => Err(self.mismatch(t, "none")),
        }
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<(), Error> {
        let ty = self.inner();
        write_typed(ty, v, self.out, self.path)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        match self.ty {
            Type::Optional(_) | Type::Any => {
                self.out.push(0xf6);
                Ok(())
            }
            t => Err(self.mismatch(t, "unit")),
        }
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        v: &T,
    ) -> Result<(), Error> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _v: &T,
    ) -> Result<(), Error> {
        Err(bad(
            self.path,
            format!("variant {variant} carries data; the schema has unit variants only"),
        ))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Seq<'a>, Error> {
        let Some(len) = len else {
            return Err(bad(self.path, "a sequence of unknown length"));
        };
        let path = self.path;
        match self.inner() {
            Type::List(item) => {
                head(self.out, 4, len as u64);
                Ok(Seq {
                    item: Item::List(item),
                    out: self.out,
                    path,
                    left: len,
                    next: 0,
                })
            }
            Type::Array(el) => {
                head(self.out, 6, el.cbor_tag());
                head(self.out, 2, (len * el.size()) as u64);
                Ok(Seq {
                    item: Item::Element(*el),
                    out: self.out,
                    path,
                    left: len,
                    next: 0,
                })
            }
            t => Err(self.mismatch(t, "a sequence")),
        }
    }
    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, Error> {
        // A fixed-size array (`[f32; 9]`) is a sequence of known length;
        // a tuple of several types fits no list or array and is refused
        // by its elements.
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Err(bad(self.path, "tuple structs have no schema type"))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(bad(self.path, format!("variant {variant} carries data")))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(bad(
            self.path,
            "a map is written only as a field of type any",
        ))
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Struct<'a>, Error> {
        let Type::Struct(fields) = self.inner() else {
            let t = self.inner();
            return Err(self.mismatch(t, "a struct"));
        };
        head(self.out, 4, fields.len() as u64);
        Ok(Struct {
            fields,
            next: 0,
            out: self.out,
            path: self.path,
        })
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(bad(self.path, format!("variant {variant} carries data")))
    }
}

enum Item<'a> {
    List(&'a Type),
    Element(ElementType),
}

pub(crate) struct Seq<'a> {
    item: Item<'a>,
    out: &'a mut Vec<u8>,
    path: &'a Path<'a>,
    left: usize,
    next: usize,
}

impl ser::SerializeSeq for Seq<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        self.left = self
            .left
            .checked_sub(1)
            .ok_or_else(|| bad(self.path, "more elements than announced"))?;
        let at = Path::Index(self.path, self.next);
        self.next += 1;
        match &self.item {
            Item::List(t) => write_typed(t, v, self.out, &at),
            Item::Element(el) => {
                let x = v.serialize(Number).map_err(|e| bad(&at, e.to_string()))?;
                push_element(*el, &x, self.out, &at)
            }
        }
    }

    fn end(self) -> Result<(), Error> {
        if self.left != 0 {
            return Err(bad(self.path, "fewer elements than announced"));
        }
        Ok(())
    }
}

impl ser::SerializeTuple for Seq<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, v)
    }

    fn end(self) -> Result<(), Error> {
        ser::SerializeSeq::end(self)
    }
}

/// Appends number `x` as a little-endian element of `el`.
fn push_element(
    el: ElementType,
    x: &Value,
    out: &mut Vec<u8>,
    path: &Path<'_>,
) -> Result<(), Error> {
    let range = |lo: i128, hi: i128| match x {
        Value::Int(i) if (lo..=hi).contains(i) => Ok(*i),
        other => Err(bad(path, format!("{other:?} does not fit {}", el.name()))),
    };
    let float = || match x {
        Value::Float(f) => Ok(*f),
        Value::Int(i) => Ok(*i as f64),
        other => Err(bad(path, format!("{other:?} is not a number"))),
    };
    match el {
        ElementType::U8 => out.push(range(0, 255)? as u8),
        ElementType::I8 => out.push(range(-128, 127)? as i8 as u8),
        ElementType::U16 => out.extend_from_slice(&(range(0, 65535)? as u16).to_le_bytes()),
        ElementType::I16 => out.extend_from_slice(&(range(-32768, 32767)? as i16).to_le_bytes()),
        ElementType::U32 => {
            out.extend_from_slice(&(range(0, u32::MAX.into())? as u32).to_le_bytes());
        }
        ElementType::I32 => {
            out.extend_from_slice(&(range(i32::MIN.into(), i32::MAX.into())? as i32).to_le_bytes())
        }
        ElementType::U64 => {
            out.extend_from_slice(&(range(0, u64::MAX.into())? as u64).to_le_bytes());
        }
        ElementType::I64 => {
            out.extend_from_slice(&(range(i64::MIN.into(), i64::MAX.into())? as i64).to_le_bytes())
        }
        ElementType::F32 => out.extend_from_slice(&(float()? as f32).to_le_bytes()),
        ElementType::F64 => out.extend_from_slice(&float()?.to_le_bytes()),
    }
    Ok(())
}

pub(crate) struct Struct<'a> {
    fields: &'a [Field],
    next: usize,
    out: &'a mut Vec<u8>,
    path: &'a Path<'a>,
}

impl Struct<'_> {
    /// Writes the skipped fields before `upto` (their defaults, or null).
    fn fill(&mut self, upto: usize) -> Result<(), Error> {
        while self.next < upto {
            let f = &self.fields[self.next];
            let p = Path::Field(self.path, &f.name);
            match &f.default {
                Some(d) => crate::schema::write_value(&f.ty, d, &p, self.out)
                    .map_err(|e| Error(Box::new(e)))?,
                None if matches!(f.ty, Type::Optional(_) | Type::Any) => {
                    self.out.push(0xf6);
                }
                None => return Err(bad(&p, "missing, and it has no default")),
            }
            self.next += 1;
        }
        Ok(())
    }
}

impl ser::SerializeStruct for Struct<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        v: &T,
    ) -> Result<(), Error> {
        // Fields come in the schema's order: the next one, unless the
        // type skipped some (they take their defaults).
        let at = match self.fields.get(self.next) {
            Some(f) if same(&f.name, key) => self.next,
            _ => {
                let at = self.fields[self.next..]
                    .iter()
                    .position(|f| f.name == key)
                    .map(|i| i + self.next)
                    .ok_or_else(|| {
                        bad(
                            &Path::Field(self.path, key),
                            "not a field of the schema, or out of the schema's order",
                        )
                    })?;
                self.fill(at)?;
                at
            }
        };
        write_typed(
            &self.fields[at].ty,
            v,
            self.out,
            &Path::Field(self.path, key),
        )?;
        self.next = at + 1;
        Ok(())
    }

    fn skip_field(&mut self, _key: &'static str) -> Result<(), Error> {
        Ok(())
    }

    fn end(mut self) -> Result<(), Error> {
        let n = self.fields.len();
        self.fill(n)
    }
}

/// Whether two field names are equal: a byte loop, which for names this
/// short costs less than the call to `memcmp` that `==` makes.
#[inline]
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| x == y)
}

/// Takes a number out of a `Serialize` (an element of a typed array).
struct Number;

macro_rules! number {
    ($($m:ident: $t:ty => $e:expr),* $(,)?) => {$(
        fn $m(self, v: $t) -> Result<Value, Error> {
            #[allow(clippy::redundant_closure_call)]
            Ok(($e)(v))
        }
    )*};
}

macro_rules! not_a_number {
    ($($m:ident($($a:ty),*) -> $r:ty),* $(,)?) => {$(
        fn $m(self, $(_: $a),*) -> Result<$r, Error> {
            Err(bad(&Path::Root, "an element of a numeric array is a number"))
        }
    )*};
}

impl ser::Serializer for Number {
    type Ok = Value;
    type Error = Error;
    type SerializeSeq = Impossible<Value, Error>;
    type SerializeTuple = Impossible<Value, Error>;
    type SerializeTupleStruct = Impossible<Value, Error>;
    type SerializeTupleVariant = Impossible<Value, Error>;
    type SerializeMap = Impossible<Value, Error>;
    type SerializeStruct = Impossible<Value, Error>;
    type SerializeStructVariant = Impossible<Value, Error>;

    number! {
        serialize_i8: i8 => |v: i8| Value::Int(v.into()),
        serialize_i16: i16 => |v: i16| Value::Int(v.into()),
        serialize_i32: i32 => |v: i32| Value::Int(v.into()),
        serialize_i64: i64 => |v: i64| Value::Int(v.into()),
        serialize_i128: i128 => Value::Int,
        serialize_u8: u8 => |v: u8| Value::Int(v.into()),
        serialize_u16: u16 => |v: u16| Value::Int(v.into()),
        serialize_u32: u32 => |v: u32| Value::Int(v.into()),
        serialize_u64: u64 => |v: u64| Value::Int(v.into()),
        serialize_f32: f32 => |v: f32| Value::Float(v.into()),
        serialize_f64: f64 => Value::Float,
    }

    not_a_number! {
        serialize_bool(bool) -> Value,
        serialize_u128(u128) -> Value,
        serialize_char(char) -> Value,
        serialize_str(&str) -> Value,
        serialize_bytes(&[u8]) -> Value,
        serialize_none() -> Value,
        serialize_unit() -> Value,
        serialize_unit_struct(&'static str) -> Value,
        serialize_unit_variant(&'static str, u32, &'static str) -> Value,
        serialize_seq(Option<usize>) -> Self::SerializeSeq,
        serialize_tuple(usize) -> Self::SerializeTuple,
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct,
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Self::SerializeTupleVariant,
        serialize_map(Option<usize>) -> Self::SerializeMap,
        serialize_struct(&'static str, usize) -> Self::SerializeStruct,
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Self::SerializeStructVariant,
    }

    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<Value, Error> {
        v.serialize(self)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        v: &T,
    ) -> Result<Value, Error> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _v: &T,
    ) -> Result<Value, Error> {
        Err(bad(
            &Path::Root,
            "an element of a numeric array is a number",
        ))
    }
}
