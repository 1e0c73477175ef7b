//! Types that write and read themselves in the compact encoding
//! (docs/protocol.md §5.1) with code made for them, no schema walked per
//! value: `#[derive(milonga::Compact)]` implements [`Compact`] and
//! [`CompactRecord`] for a struct with named fields or an enum of unit
//! variants (docs/schemas.md, "Derived types").
//!
//! The schema of such a type is made from the same declaration as its
//! writer and reader, so what the writer puts is always a value of the
//! schema, and the reader needs only the checks the table of §5.1 asks for
//! (a head's kind and range, a struct's length): the payload is read by
//! position, each field by its own type's code. A payload written with
//! another schema (another release of the type) is not read here: see
//! `Sample::read` in the `milonga` crate, which converts it first.
//!
//! The mapping of Rust types to schema types is `Schema::of`'s:
//!
//! | Rust | schema type |
//! |---|---|
//! | `bool` | `bool` |
//! | `i8` `i16` `i32` / `i64` | `i32` / `i64` |
//! | `u8` `u16` `u32` / `u64` | `u32` / `u64` |
//! | `f32` / `f64` | `f32` / `f64` |
//! | `String` | `text` |
//! | [`Bytes`] | `bytes` |
//! | `Vec<T>`, `[T; N]` of a number type above | `array<T>` (a typed array) |
//! | `Vec<T>`, `[T; N]` of any other `T` | `list<T>` |
//! | `Option<T>` | `optional<T>` |
//! | a derived struct / enum | `struct` / `enum` |

use bytes::Bytes;

use crate::cbor::DecodeError;
use crate::schema::{Schema, SchemaError, Type};
use crate::value::{Element, ElementType};

/// Why a payload does not read as a type: a [`SchemaError`], boxed so that
/// every read returns a result one word wide.
#[derive(Debug)]
pub struct CompactError(Box<SchemaError>);

impl CompactError {
    /// The error as a [`SchemaError`].
    pub fn into_schema_error(self) -> SchemaError {
        *self.0
    }

    /// The error, with `name` (a field) in front of its path.
    #[cold]
    pub fn in_field(mut self, name: &str) -> Self {
        if let SchemaError::Value { path, .. } = &mut *self.0 {
            *path = if path.is_empty() {
                name.to_owned()
            } else if path.starts_with('[') {
                format!("{name}{path}")
            } else {
                format!("{name}.{path}")
            };
        }
        self
    }

    /// The error, with `[i]` (a list's item) in front of its path.
    #[cold]
    fn in_item(mut self, i: usize) -> Self {
        if let SchemaError::Value { path, .. } = &mut *self.0 {
            *path = if path.is_empty() || path.starts_with('[') {
                format!("[{i}]{path}")
            } else {
                format!("[{i}].{path}")
            };
        }
        self
    }
}

impl std::fmt::Display for CompactError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for CompactError {}

impl From<CompactError> for SchemaError {
    fn from(e: CompactError) -> Self {
        *e.0
    }
}

#[cold]
fn bad(why: impl Into<String>) -> CompactError {
    CompactError(Box::new(SchemaError::Value {
        path: String::new(),
        why: why.into(),
    }))
}

#[cold]
#[inline(never)]
fn fields_differ(n: usize, len: u64) -> CompactError {
    bad(format!("the schema has {n} fields, the payload {len}"))
}

#[cold]
#[inline(never)]
fn over_budget(n: usize, item_bytes: usize, items: bool) -> CompactError {
    if items {
        return malformed(DecodeError::TooManyItems);
    }
    malformed(DecodeError::Cbor(format!(
        "a list of {n} items of {item_bytes} bytes: the payload's lists would take more than {MAX_LIST_BYTES} bytes"
    )))
}

#[cold]
#[inline(never)]
fn too_long(n: u64, left: usize) -> CompactError {
    malformed(DecodeError::Cbor(format!(
        "an array of {n} items in {left} bytes"
    )))
}

#[cold]
#[inline(never)]
fn too_deep() -> CompactError {
    malformed(DecodeError::TooDeep)
}

#[cold]
#[inline(never)]
fn no_variant(i: u64, n: usize) -> CompactError {
    bad(format!("variant {i} of an enum of {n}"))
}

#[cold]
#[inline(never)]
fn does_not_fit(i: i128, ty: &str) -> CompactError {
    bad(format!("{i} does not fit {ty}"))
}

#[cold]
fn malformed(e: DecodeError) -> CompactError {
    CompactError(Box::new(SchemaError::Decode(e)))
}

/// A type that writes and reads itself in the compact encoding. Derive it
/// (`#[derive(milonga::Compact)]`) for structs and enums; Milonga
/// implements it for the types of the module's table.
pub trait Compact: Sized {
    /// Its schema type.
    fn compact_type() -> Type;
    /// Writes it, by position, as §5.1 says a value of
    /// [`compact_type`](Compact::compact_type) is written.
    fn write_compact(&self, out: &mut Vec<u8>);
    /// Reads one from `r`, as §5.1 says a reader accepts a value of
    /// [`compact_type`](Compact::compact_type).
    fn read_compact(r: &mut Reader<'_>) -> Result<Self, CompactError>;

    /// The type of a `Vec<Self>`: a list, or a typed array for numbers.
    #[doc(hidden)]
    fn list_type() -> Type {
        Type::List(Box::new(Self::compact_type()))
    }
    /// Writes a `Vec<Self>` or `[Self; N]`.
    #[doc(hidden)]
    fn write_list(items: &[Self], out: &mut Vec<u8>) {
        head(out, 4, items.len() as u64);
        for i in items {
            i.write_compact(out);
        }
    }
    /// Reads a `Vec<Self>`.
    #[doc(hidden)]
    fn read_list(r: &mut Reader<'_>) -> Result<Vec<Self>, CompactError> {
        let n = r.list_len(std::mem::size_of::<Self>())?;
        let mut v = Vec::with_capacity(n.min(1024));
        for i in 0..n {
            v.push(Self::read_compact(r).map_err(|e| e.in_item(i))?);
        }
        Ok(v)
    }
}

/// A type whose values are a schema's records: a derived struct. Its
/// schema, made once from the type's declaration.
pub trait CompactRecord: Compact {
    /// The type's schema and its id, made on first use and kept.
    fn record_schema() -> Result<&'static RecordSchema, SchemaError>;
}

/// A derived struct's schema and the schema's id (docs/protocol.md §5.1).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordSchema {
    /// The schema.
    pub schema: Schema,
    /// Its id: the FNV-1a 32 of its encoding.
    pub id: u32,
}

impl RecordSchema {
    /// The schema named `name` of `T`, a struct type (what a derived
    /// [`CompactRecord`] keeps), checked as a publisher checks one. A type
    /// that contains itself is refused.
    pub fn of<T: Compact>(name: &str) -> Result<RecordSchema, SchemaError> {
        CUT.with(|c| c.set(false));
        let ty = T::compact_type();
        if CUT.with(|c| c.replace(false)) {
            return Err(SchemaError::Invalid(format!(
                "{name}: its type contains itself (structs nested deeper than {} or more than {} of them)",
                crate::schema::MAX_SCHEMA_DEPTH,
                crate::schema::MAX_SCHEMA_FIELDS
            )));
        }
        Self::new(name, ty)
    }

    /// The schema named `name` of a struct type `ty`, checked as a
    /// publisher checks one.
    pub fn new(name: &str, ty: Type) -> Result<RecordSchema, SchemaError> {
        let Type::Struct(fields) = ty else {
            return Err(SchemaError::Invalid(format!(
                "{name}: a record's type is a struct"
            )));
        };
        let schema = Schema::new(name, fields);
        let id = Schema::id_of(&schema.encode()?);
        Ok(RecordSchema { schema, id })
    }
}

/// Writes `v`, a record, into a new buffer.
pub fn to_vec<T: Compact>(v: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    v.write_compact(&mut out);
    out
}

/// Reads a `T` from `payload`, which holds it and nothing after it.
pub fn from_slice<T: Compact>(payload: &[u8]) -> Result<T, SchemaError> {
    let mut r = Reader::new(payload);
    let v = T::read_compact(&mut r)?;
    match payload.len() - r.pos {
        0 => Ok(v),
        rest => Err(SchemaError::Decode(DecodeError::TrailingBytes(rest))),
    }
}

/// A CBOR head: major type `major`, argument `n`, shortest form.
#[doc(hidden)]
#[inline]
pub fn head(out: &mut Vec<u8>, major: u8, n: u64) {
    if n < 24 {
        out.push(major << 5 | n as u8);
    } else {
        long_head(out, major, n);
    }
}

/// A head whose argument takes bytes of its own.
#[inline(never)]
fn long_head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    if n <= 0xff {
        out.extend_from_slice(&[m | 24, n as u8]);
    } else if n <= 0xffff {
        let b = (n as u16).to_be_bytes();
        out.extend_from_slice(&[m | 25, b[0], b[1]]);
    } else if n <= 0xffff_ffff {
        out.push(m | 26);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

/// Writes a signed integer.
#[inline]
fn int(out: &mut Vec<u8>, i: i64) {
    if i >= 0 {
        head(out, 0, i as u64);
    } else {
        head(out, 1, (-1 - i) as u64);
    }
}

/// Where a payload is read from.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// List items that may still be read ([`cbor::MAX_ITEMS`](crate::cbor::MAX_ITEMS) a payload).
    items: usize,
    /// Bytes that lists may still take in memory ([`MAX_LIST_BYTES`] a payload).
    memory: usize,
    /// Structs entered and not left: at most [`MAX_SCHEMA_DEPTH`](crate::schema::MAX_SCHEMA_DEPTH).
    depth: usize,
}

/// The memory the lists of one payload may take once read, whatever their
/// items' type: a list of one-byte items of a large type is refused past
/// it, not allocated.
pub const MAX_LIST_BYTES: usize = 64 << 20;

impl<'a> Reader<'a> {
    /// Reads `buf` from its start.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader {
            buf,
            pos: 0,
            items: crate::cbor::MAX_ITEMS,
            memory: MAX_LIST_BYTES,
            depth: 0,
        }
    }

    /// How many bytes were read.
    pub fn position(&self) -> usize {
        self.pos
    }

    #[cold]
    #[inline(never)]
    fn ends_early(&self) -> CompactError {
        malformed(DecodeError::Cbor(format!(
            "the payload ends at byte {}, inside an item",
            self.buf.len()
        )))
    }

    /// The next item's head: its major type and argument. Indefinite
    /// lengths, reserved heads and simple values are refused: no caller
    /// wants one.
    #[inline]
    fn head(&mut self) -> Result<(u8, u64), CompactError> {
        let Some(&ib) = self.buf.get(self.pos) else {
            return Err(self.ends_early());
        };
        let ai = ib & 31;
        // Each width read as itself: a wide load of bytes just copied
        // into place would wait on the copy.
        let at = self.pos + 1;
        let arg = |len: usize| self.buf.get(at..at + len);
        let (n, len) = match ai {
            0..=23 => (u64::from(ai), 1),
            24 => match arg(1) {
                Some(b) => (u64::from(b[0]), 2),
                None => return Err(self.ends_early()),
            },
            25 => match arg(2) {
                Some(b) => (u64::from(u16::from_be_bytes([b[0], b[1]])), 3),
                None => return Err(self.ends_early()),
            },
            26 => match arg(4).and_then(|b| <[u8; 4]>::try_from(b).ok()) {
                Some(b) => (u64::from(u32::from_be_bytes(b)), 5),
                None => return Err(self.ends_early()),
            },
            27 => match arg(8).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
                Some(b) => (u64::from_be_bytes(b), 9),
                None => return Err(self.ends_early()),
            },
            _ => return Err(self.unexpected("a definite head")),
        };
        self.pos += len;
        Ok((ib >> 5, n))
    }

    #[cold]
    #[inline(never)]
    fn unexpected(&self, want: &str) -> CompactError {
        let found = match self.buf.get(self.pos) {
            None => "nothing".to_owned(),
            Some(b) => match b >> 5 {
                0 | 1 => "an integer".to_owned(),
                2 => "bytes".to_owned(),
                3 => "text".to_owned(),
                4 => "an array".to_owned(),
                5 => "a map".to_owned(),
                6 => "a tag".to_owned(),
                _ => format!("the simple or float item 0x{b:02x}"),
            },
        };
        bad(format!("the schema says {want}, the payload holds {found}"))
    }

    /// The end of a struct begun by [`Reader::struct_of`].
    #[inline]
    pub fn end_struct(&mut self) {
        self.depth -= 1;
    }

    /// A struct of `n` fields: an array of exactly `n` items. Structs
    /// nest at most as deep as a schema's types (a type that contains
    /// itself is read no deeper); once its fields are read, the struct
    /// ends with [`Reader::end_struct`] (derived code does both).
    #[inline]
    pub fn struct_of(&mut self, n: usize) -> Result<(), CompactError> {
        if self.depth >= crate::schema::MAX_SCHEMA_DEPTH {
            return Err(too_deep());
        }
        self.depth += 1;
        match self.buf.get(self.pos) {
            Some(&b) if b >> 5 == 4 => {}
            _ => return Err(self.unexpected("a struct (an array)")),
        }
        if n < 24 && self.buf.get(self.pos) == Some(&(0x80 | n as u8)) {
            self.pos += 1;
            return Ok(());
        }
        let (_, len) = self.head()?;
        if len != n as u64 {
            return Err(fields_differ(n, len));
        }
        Ok(())
    }

    /// A list's length: a definite array, at most as long as the bytes
    /// left (each item takes one at least), its items (of `item_bytes`
    /// each in memory) within the payload's budgets.
    #[inline]
    pub fn list_len(&mut self, item_bytes: usize) -> Result<usize, CompactError> {
        match self.buf.get(self.pos) {
            Some(&b) if b >> 5 == 4 => {}
            _ => return Err(self.unexpected("a list (an array)")),
        }
        let (_, n) = self.head()?;
        if n > (self.buf.len() - self.pos) as u64 {
            return Err(too_long(n, self.buf.len() - self.pos));
        }
        let n = n as usize;
        let bytes = n.saturating_mul(item_bytes.max(1));
        if n > self.items || bytes > self.memory {
            return Err(over_budget(n, item_bytes, n > self.items));
        }
        self.items -= n;
        self.memory -= bytes;
        Ok(n)
    }

    /// An unsigned integer at most `max`.
    #[inline]
    pub fn uint(&mut self, max: u64, ty: &'static str) -> Result<u64, CompactError> {
        // Most integers of a record are small: one byte, its own value.
        if let Some(&b) = self.buf.get(self.pos) {
            if b < 24 && u64::from(b) <= max {
                self.pos += 1;
                return Ok(u64::from(b));
            }
            if b >> 5 == 0 {
                let (_, n) = self.head()?;
                if n <= max {
                    return Ok(n);
                }
                return Err(does_not_fit(i128::from(n), ty));
            }
        }
        Err(self.not_unsigned(ty))
    }

    #[cold]
    #[inline(never)]
    fn not_unsigned(&mut self, ty: &str) -> CompactError {
        if matches!(self.buf.get(self.pos), Some(b) if b >> 5 == 1) {
            return bad(format!("a negative integer does not fit {ty}"));
        }
        self.unexpected(ty)
    }

    /// A signed integer in `min..=max`.
    #[inline]
    pub fn int(&mut self, min: i64, max: i64, ty: &'static str) -> Result<i64, CompactError> {
        let negative = match self.buf.get(self.pos) {
            Some(&b) if b >> 5 == 0 => false,
            Some(&b) if b >> 5 == 1 => true,
            _ => return Err(self.unexpected(ty)),
        };
        let (_, n) = self.head()?;
        let i = if negative {
            -1 - i128::from(n)
        } else {
            i128::from(n)
        };
        if i < i128::from(min) || i > i128::from(max) {
            return Err(does_not_fit(i, ty));
        }
        Ok(i as i64)
    }

    /// A float: float16, float32 or float64.
    #[inline]
    pub fn f64(&mut self) -> Result<f64, CompactError> {
        if let Some(b) = self.buf.get(self.pos..self.pos + 9) {
            if b[0] == 0xfb {
                self.pos += 9;
                return Ok(f64::from_be_bytes(b[1..9].try_into().expect("8 bytes")));
            }
        }
        self.float_other("f64")
    }

    /// A float: float32, float16 or float64 (rounded to the nearest f32).
    #[inline]
    pub fn f32(&mut self) -> Result<f32, CompactError> {
        if let Some(b) = self.buf.get(self.pos..self.pos + 5) {
            if b[0] == 0xfa {
                self.pos += 5;
                return Ok(f32::from_be_bytes(b[1..5].try_into().expect("4 bytes")));
            }
        }
        self.float_other("f32").map(|f| f as f32)
    }

    /// Any float head (the uncommon ones through minicbor).
    #[cold]
    fn float_other(&mut self, ty: &str) -> Result<f64, CompactError> {
        let mut d = minicbor::Decoder::new(&self.buf[self.pos..]);
        let f = match self.buf.get(self.pos) {
            Some(0xf9) => f64::from(d.f16().map_err(|e| malformed(e.into()))?),
            Some(0xfa) => f64::from(d.f32().map_err(|e| malformed(e.into()))?),
            Some(0xfb) => d.f64().map_err(|e| malformed(e.into()))?,
            _ => return Err(self.unexpected(ty)),
        };
        self.pos += d.position();
        Ok(f)
    }

    /// `true` or `false`.
    #[inline]
    pub fn bool(&mut self) -> Result<bool, CompactError> {
        let b = match self.buf.get(self.pos) {
            Some(0xf4) => false,
            Some(0xf5) => true,
            _ => return Err(self.unexpected("bool")),
        };
        self.pos += 1;
        Ok(b)
    }

    /// Whether the next item is null or undefined (taken if so): an
    /// optional's absent value.
    #[inline]
    pub fn null(&mut self) -> bool {
        if matches!(self.buf.get(self.pos), Some(0xf6 | 0xf7)) {
            self.pos += 1;
            return true;
        }
        false
    }

    /// The next `n` bytes.
    #[inline]
    fn take(&mut self, n: u64) -> Result<&'a [u8], CompactError> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .filter(|end| *end <= self.buf.len())
            .ok_or_else(|| self.ends_early())?;
        let b = &self.buf[self.pos..end];
        self.pos = end;
        Ok(b)
    }

    /// A definite text string.
    #[inline]
    pub fn text(&mut self) -> Result<&'a str, CompactError> {
        match self.buf.get(self.pos) {
            Some(&b) if b >> 5 == 3 && b & 31 != 31 => {}
            _ => return Err(self.unexpected("text")),
        }
        let (_, n) = self.head()?;
        std::str::from_utf8(self.take(n)?)
            .map_err(|e| malformed(DecodeError::Cbor(format!("text is not UTF-8: {e}"))))
    }

    /// A definite byte string.
    #[inline]
    pub fn bytes(&mut self) -> Result<&'a [u8], CompactError> {
        match self.buf.get(self.pos) {
            Some(&b) if b >> 5 == 2 && b & 31 != 31 => {}
            _ => return Err(self.unexpected("bytes")),
        }
        let (_, n) = self.head()?;
        self.take(n)
    }

    /// An enum's index, below `n`.
    #[inline]
    pub fn variant(&mut self, n: usize) -> Result<usize, CompactError> {
        let i = self.uint(u64::MAX, "an enum (an index)")?;
        if i >= n as u64 {
            return Err(no_variant(i, n));
        }
        Ok(i as usize)
    }

    /// A typed array of `T`: a tag of `T`'s element type (RFC 8746,
    /// either byte order; `u8` also as clamped) over a byte string,
    /// definite or in chunks (§5), read where it lies.
    pub fn elements<T: Element>(&mut self) -> Result<Vec<T>, CompactError> {
        let el = T::TYPE;
        match self.buf.get(self.pos) {
            Some(&b) if b >> 5 == 6 => {}
            _ => return Err(self.unexpected(&format!("array<{}>", el.name()))),
        }
        let (_, tag) = self.head()?;
        let big_endian = match ElementType::from_cbor_tag(tag) {
            Some((e, big)) if e == el => big,
            _ => {
                return Err(bad(format!(
                    "the schema says array<{}>, the payload holds tag {tag}",
                    el.name()
                )))
            }
        };
        let bytes: std::borrow::Cow<'a, [u8]> = if matches!(self.buf.get(self.pos), Some(&b) if b >> 5 == 2 && b & 31 != 31)
        {
            self.bytes()?.into()
        } else {
            // A byte string in chunks: minicbor reads them in place.
            let mut d = minicbor::Decoder::new(&self.buf[self.pos..]);
            let mut bytes = Vec::new();
            for chunk in d.bytes_iter().map_err(|e| malformed(e.into()))? {
                bytes.extend_from_slice(chunk.map_err(|e| malformed(e.into()))?);
            }
            self.pos += d.position();
            bytes.into()
        };
        if bytes.len() % el.size() != 0 {
            return Err(malformed(DecodeError::BadTypedArray {
                tag,
                why: format!("{} bytes are not whole {} elements", bytes.len(), el.name()),
            }));
        }
        let mut out: Vec<T> = vec![T::zeroed(); bytes.len() / el.size()];
        bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes);
        if big_endian != cfg!(target_endian = "big") {
            for x in &mut out {
                bytemuck::bytes_of_mut(x).reverse();
            }
        }
        Ok(out)
    }
}

macro_rules! unsigned {
    ($($t:ty => $ty:ident, $name:literal);*) => {$(
        impl Compact for $t {
            fn compact_type() -> Type {
                Type::$ty
            }
            #[inline]
            fn write_compact(&self, out: &mut Vec<u8>) {
                head(out, 0, u64::from(*self));
            }
            #[inline]
            fn read_compact(r: &mut Reader<'_>) -> Result<Self, CompactError> {
                Ok(r.uint(u64::from(<$t>::MAX), $name)? as $t)
            }
            numeric_list!($t);
        }
    )*};
}

macro_rules! signed {
    ($($t:ty => $ty:ident, $name:literal);*) => {$(
        impl Compact for $t {
            fn compact_type() -> Type {
                Type::$ty
            }
            #[inline]
            fn write_compact(&self, out: &mut Vec<u8>) {
                int(out, i64::from(*self));
            }
            #[inline]
            fn read_compact(r: &mut Reader<'_>) -> Result<Self, CompactError> {
                Ok(r.int(i64::from(<$t>::MIN), i64::from(<$t>::MAX), $name)? as $t)
            }
            numeric_list!($t);
        }
    )*};
}

/// A `Vec` of numbers is a typed array.
macro_rules! numeric_list {
    ($t:ty) => {
        fn list_type() -> Type {
            Type::Array(<$t as Element>::TYPE)
        }
        fn write_list(items: &[Self], out: &mut Vec<u8>) {
            write_elements(items, out);
        }
        fn read_list(r: &mut Reader<'_>) -> Result<Vec<Self>, CompactError> {
            r.elements::<$t>()
        }
    };
}

unsigned!(u8 => U32, "u8"; u16 => U32, "u16"; u32 => U32, "u32"; u64 => U64, "u64");
signed!(i8 => I32, "i8"; i16 => I32, "i16"; i32 => I32, "i32"; i64 => I64, "i64");

/// Writes numbers as a typed array (RFC 8746, little-endian).
fn write_elements<T: Element>(items: &[T], out: &mut Vec<u8>) {
    let el: ElementType = T::TYPE;
    head(out, 6, el.cbor_tag());
    head(out, 2, (items.len() * el.size()) as u64);
    if cfg!(target_endian = "little") {
        out.extend_from_slice(bytemuck::cast_slice(items));
    } else {
        for x in items {
            let mut b = bytemuck::bytes_of(x).to_vec();
            b.reverse();
            out.extend_from_slice(&b);
        }
    }
}

impl Compact for f32 {
    fn compact_type() -> Type {
        Type::F32
    }
    #[inline]
    fn write_compact(&self, out: &mut Vec<u8>) {
        let b = self.to_be_bytes();
        out.extend_from_slice(&[0xfa, b[0], b[1], b[2], b[3]]);
    }
    #[inline]
    fn read_compact(r: &mut Reader<'_>) -> Result<Self, CompactError> {
        r.f32()
    }
    numeric_list!(f32);
}

impl Compact for f64 {
    fn compact_type() -> Type {
        Type::F64
    }
    #[inline]
    fn write_compact(&self, out: &mut Vec<u8>) {
        out.push(0xfb);
        out.extend_from_slice(&self.to_be_bytes());
    }
    #[inline]
    fn read_compact(r: &mut Reader<'_>) -> Result<Self, CompactError> {
        r.f64()
    }
    numeric_list!(f64);
}

impl Compact for bool {
    fn compact_type() -> Type {
        Type::Bool
    }
    #[inline]
    fn write_compact(&self, out: &mut Vec<u8>) {
        out.push(if *self { 0xf5 } else { 0xf4 });
    }
    #[inline]
    fn read_compact(r: &mut Reader<'_>) -> Result<Self, CompactError> {
        r.bool()
    }
}

impl Compact for String {
    fn compact_type() -> Type {
        Type::Text
    }
    #[inline]
    fn write_compact(&self, out: &mut Vec<u8>) {
        head(out, 3, self.len() as u64);
        out.extend_from_slice(self.as_bytes());
    }
    #[inline]
    fn read_compact(r: &mut Reader<'_>) -> Result<Self, CompactError> {
        r.text().map(str::to_owned)
    }
}

impl Compact for Bytes {
    fn compact_type() -> Type {
        Type::Bytes
    }
    fn write_compact(&self, out: &mut Vec<u8>) {
        head(out, 2, self.len() as u64);
        out.extend_from_slice(self);
    }
    fn read_compact(r: &mut Reader<'_>) -> Result<Self, CompactError> {
        r.bytes().map(Bytes::copy_from_slice)
    }
}

impl<T: Compact> Compact for Option<T> {
    fn compact_type() -> Type {
        Type::Optional(Box::new(T::compact_type()))
    }
    #[inline]
    fn write_compact(&self, out: &mut Vec<u8>) {
        match self {
            Some(v) => v.write_compact(out),
            None => out.push(0xf6),
        }
    }
    #[inline]
    fn read_compact(r: &mut Reader<'_>) -> Result<Self, CompactError> {
        if r.null() {
            return Ok(None);
        }
        T::read_compact(r).map(Some)
    }
}

impl<T: Compact> Compact for Vec<T> {
    fn compact_type() -> Type {
        T::list_type()
    }
    #[inline]
    fn write_compact(&self, out: &mut Vec<u8>) {
        T::write_list(self, out);
    }
    #[inline]
    fn read_compact(r: &mut Reader<'_>) -> Result<Self, CompactError> {
        T::read_list(r)
    }
}

impl<T: Compact> Compact for Box<T> {
    fn compact_type() -> Type {
        T::compact_type()
    }
    #[inline]
    fn write_compact(&self, out: &mut Vec<u8>) {
        (**self).write_compact(out);
    }
    #[inline]
    fn read_compact(r: &mut Reader<'_>) -> Result<Self, CompactError> {
        T::read_compact(r).map(Box::new)
    }
}

impl<T: Compact, const N: usize> Compact for [T; N] {
    fn compact_type() -> Type {
        T::list_type()
    }
    #[inline]
    fn write_compact(&self, out: &mut Vec<u8>) {
        T::write_list(self, out);
    }
    fn read_compact(r: &mut Reader<'_>) -> Result<Self, CompactError> {
        let v = T::read_list(r)?;
        let n = v.len();
        v.try_into()
            .map_err(|_| bad(format!("{N} items expected, the payload has {n}")))
    }
}

std::thread_local! {
    /// How deep [`nested`] calls are on this thread.
    static DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Structs [`nested`] made since the outermost call began.
    static MADE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Whether [`nested`] left a type unmade (it contains itself).
    static CUT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes a derived struct's type (`make`) without overflowing the stack or
/// memory on a type that contains itself: past the schema's nesting
/// limit, or past as many structs as a schema may have fields, the type
/// is left an empty struct and [`RecordSchema::of`] refuses the whole.
#[doc(hidden)]
pub fn nested(make: impl FnOnce() -> Type) -> Type {
    let depth = DEPTH.with(|d| d.replace(d.get() + 1));
    if depth == 0 {
        MADE.with(|m| m.set(0));
    }
    let made = MADE.with(|m| m.replace(m.get() + 1));
    let t = if depth > crate::schema::MAX_SCHEMA_DEPTH || made > crate::schema::MAX_SCHEMA_FIELDS {
        CUT.with(|c| c.set(true));
        Type::Struct(Vec::new())
    } else {
        make()
    };
    DEPTH.with(|d| d.set(depth));
    t
}
