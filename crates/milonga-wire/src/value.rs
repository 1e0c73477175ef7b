//! The [`Value`] type: what a sample carries.
//!
//! Numeric arrays are [`TypedArray`]s: contiguous little-endian bytes with an
//! element type, encoded as RFC 8746 typed arrays so that a reader views them
//! without decoding element by element. Their bytes live in a shared
//! [`Bytes`] buffer, which may be the user's own `Vec<f64>` (sent without a
//! copy) or a received ZeroMQ message (read without a copy).

use bytes::Bytes;

/// The element type of a [`TypedArray`]; values are little-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ElementType {
    /// `u8`
    U8,
    /// `u16`
    U16,
    /// `u32`
    U32,
    /// `u64`
    U64,
    /// `i8`
    I8,
    /// `i16`
    I16,
    /// `i32`
    I32,
    /// `i64`
    I64,
    /// `f32`
    F32,
    /// `f64`
    F64,
}

impl ElementType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            ElementType::U8 | ElementType::I8 => 1,
            ElementType::U16 | ElementType::I16 => 2,
            ElementType::U32 | ElementType::I32 | ElementType::F32 => 4,
            ElementType::U64 | ElementType::I64 | ElementType::F64 => 8,
        }
    }

    /// The RFC 8746 tag of the little-endian array of this type.
    pub fn cbor_tag(self) -> u64 {
        match self {
            ElementType::U8 => 64,
            ElementType::U16 => 69,
            ElementType::U32 => 70,
            ElementType::U64 => 71,
            ElementType::I8 => 72,
            ElementType::I16 => 77,
            ElementType::I32 => 78,
            ElementType::I64 => 79,
            ElementType::F32 => 85,
            ElementType::F64 => 86,
        }
    }

    /// The element type and byte order (true = big-endian) of an RFC 8746
    /// tag, for the tags Milonga reads.
    pub fn from_cbor_tag(tag: u64) -> Option<(Self, bool)> {
        Some(match tag {
            64 | 68 => (ElementType::U8, false),
            69 => (ElementType::U16, false),
            70 => (ElementType::U32, false),
            71 => (ElementType::U64, false),
            72 => (ElementType::I8, false),
            77 => (ElementType::I16, false),
            78 => (ElementType::I32, false),
            79 => (ElementType::I64, false),
            85 => (ElementType::F32, false),
            86 => (ElementType::F64, false),
            65 => (ElementType::U16, true),
            66 => (ElementType::U32, true),
            67 => (ElementType::U64, true),
            73 => (ElementType::I16, true),
            74 => (ElementType::I32, true),
            75 => (ElementType::I64, true),
            81 => (ElementType::F32, true),
            82 => (ElementType::F64, true),
            _ => return None,
        })
    }

    /// Short lower-case name (`f64`).
    pub fn name(self) -> &'static str {
        match self {
            ElementType::U8 => "u8",
            ElementType::U16 => "u16",
            ElementType::U32 => "u32",
            ElementType::U64 => "u64",
            ElementType::I8 => "i8",
            ElementType::I16 => "i16",
            ElementType::I32 => "i32",
            ElementType::I64 => "i64",
            ElementType::F32 => "f32",
            ElementType::F64 => "f64",
        }
    }
}

/// A numeric array: an element type and its little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct TypedArray {
    element: ElementType,
    bytes: Bytes,
}

/// The byte length is not a multiple of the element size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{len} bytes is not a whole number of {element:?} elements")]
pub struct TypedArrayLengthError {
    /// The element type.
    pub element: ElementType,
    /// The byte length offered.
    pub len: usize,
}

/// Types that can be the element of a [`TypedArray`].
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The element type.
    const TYPE: ElementType;
}

macro_rules! element {
    ($($t:ty => $e:ident),*) => {$(
        impl Element for $t { const TYPE: ElementType = ElementType::$e; }
    )*};
}
element!(u8 => U8, u16 => U16, u32 => U32, u64 => U64, i8 => I8, i16 => I16,
    i32 => I32, i64 => I64, f32 => F32, f64 => F64);

/// Owns a `Vec<T>` and shows its bytes, so that a `Vec<f64>` becomes a
/// [`Bytes`] without a copy.
struct VecBytes<T: Element>(Vec<T>);

impl<T: Element> AsRef<[u8]> for VecBytes<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

impl TypedArray {
    /// An array over little-endian `bytes`.
    pub fn from_bytes(element: ElementType, bytes: Bytes) -> Result<Self, TypedArrayLengthError> {
        if bytes.len() % element.size() != 0 {
            return Err(TypedArrayLengthError {
                element,
                len: bytes.len(),
            });
        }
        Ok(TypedArray { element, bytes })
    }

    /// Takes ownership of `v` without copying it (on a little-endian host).
    pub fn from_vec<T: Element>(v: Vec<T>) -> Self {
        let bytes = if cfg!(target_endian = "little") {
            Bytes::from_owner(VecBytes(v))
        } else {
            let mut out = Vec::with_capacity(v.len() * T::TYPE.size());
            for x in &v {
                let mut b = bytemuck::bytes_of(x).to_vec();
                b.reverse();
                out.extend_from_slice(&b);
            }
            Bytes::from(out)
        };
        TypedArray {
            element: T::TYPE,
            bytes,
        }
    }

    /// The element type.
    pub fn element(&self) -> ElementType {
        self.element
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.element.size()
    }

    /// Whether the array has no element.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The little-endian bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// A view of the elements without a copy, when `T` is the element type,
    /// the host is little-endian and the bytes are aligned for `T`.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        if T::TYPE != self.element || cfg!(target_endian = "big") {
            return None;
        }
        bytemuck::try_cast_slice(&self.bytes).ok()
    }

    /// The elements as a vector (copies; works whatever the alignment).
    pub fn to_vec<T: Element>(&self) -> Option<Vec<T>> {
        if T::TYPE != self.element {
            return None;
        }
        let mut out: Vec<T> = vec![T::zeroed(); self.len()];
        bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&self.bytes);
        if cfg!(target_endian = "big") {
            for x in &mut out {
                bytemuck::bytes_of_mut(x).reverse();
            }
        }
        Some(out)
    }

    /// Element `i` as a [`Value`]: an integer, or a float for `f32` and
    /// `f64` elements.
    pub fn value_at(&self, i: usize) -> Option<Value> {
        let n = self.element.size();
        let b = self.bytes.get(i * n..(i + 1) * n)?;
        let int = |v: i128| Some(Value::Int(v));
        match self.element {
            ElementType::F32 | ElementType::F64 => self.get_f64(i).map(Value::Float),
            ElementType::U8 => int(i128::from(b[0])),
            ElementType::I8 => int(i128::from(b[0] as i8)),
            ElementType::U16 => int(i128::from(u16::from_le_bytes([b[0], b[1]]))),
            ElementType::I16 => int(i128::from(i16::from_le_bytes([b[0], b[1]]))),
            ElementType::U32 => int(i128::from(u32::from_le_bytes(b.try_into().ok()?))),
            ElementType::I32 => int(i128::from(i32::from_le_bytes(b.try_into().ok()?))),
            ElementType::U64 => int(i128::from(u64::from_le_bytes(b.try_into().ok()?))),
            ElementType::I64 => int(i128::from(i64::from_le_bytes(b.try_into().ok()?))),
        }
    }

    /// Element `i` as an `f64` (lossy for 64-bit integers beyond 2^53).
    pub fn get_f64(&self, i: usize) -> Option<f64> {
        let n = self.element.size();
        let b = self.bytes.get(i * n..(i + 1) * n)?;
        Some(match self.element {
            ElementType::U8 => f64::from(b[0]),
            ElementType::I8 => f64::from(b[0] as i8),
            ElementType::U16 => f64::from(u16::from_le_bytes([b[0], b[1]])),
            ElementType::I16 => f64::from(i16::from_le_bytes([b[0], b[1]])),
            ElementType::U32 => f64::from(u32::from_le_bytes(b.try_into().ok()?)),
            ElementType::I32 => f64::from(i32::from_le_bytes(b.try_into().ok()?)),
            ElementType::F32 => f64::from(f32::from_le_bytes(b.try_into().ok()?)),
            ElementType::U64 => u64::from_le_bytes(b.try_into().ok()?) as f64,
            ElementType::I64 => i64::from_le_bytes(b.try_into().ok()?) as f64,
            ElementType::F64 => f64::from_le_bytes(b.try_into().ok()?),
        })
    }
}

/// A self-describing value, encoded as CBOR on the wire.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// CBOR null.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer in CBOR's range, -2^64 ..= 2^64-1.
    Int(i128),
    /// A floating-point number (CBOR half, single and double all decode here).
    Float(f64),
    /// UTF-8 text.
    Text(String),
    /// A byte string. As the whole value of a sample it is sent with the raw
    /// encoding: untouched bytes, no CBOR framing.
    Bytes(Bytes),
    /// An array of values.
    Array(Vec<Value>),
    /// A map, in the order the pairs were written.
    Map(Vec<(Value, Value)>),
    /// A numeric array (RFC 8746).
    Typed(TypedArray),
    /// A CBOR tag Milonga does not interpret, kept so that it survives a
    /// round trip.
    Tagged(u64, Box<Value>),
}

impl Value {
    /// About the bytes of memory this value holds: its byte strings, text
    /// and numeric arrays, and 64 for each value besides (to bound what
    /// waits in a queue in bytes, not only in values).
    pub fn approx_bytes(&self) -> usize {
        64 + match self {
            Value::Bytes(b) => b.len(),
            Value::Text(t) => t.len(),
            Value::Typed(t) => t.bytes().len(),
            Value::Tagged(_, inner) => inner.approx_bytes(),
            Value::Array(items) => items.iter().map(Value::approx_bytes).sum(),
            Value::Map(pairs) => pairs
                .iter()
                .map(|(k, v)| k.approx_bytes() + v.approx_bytes())
                .sum(),
            Value::Null | Value::Bool(_) | Value::Int(_) | Value::Float(_) => 0,
        }
    }

    /// Looks up a text key in a map value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(pairs) => pairs.iter().find_map(|(k, v)| match k {
                Value::Text(t) if t == key => Some(v),
                _ => None,
            }),
            _ => None,
        }
    }

    /// The value as an `f64`, for numbers.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// The value as text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Value { fn from(x: $t) -> Self { Value::Int(i128::from(x)) } }
    )*};
}
from_int!(u8, u16, u32, u64, i8, i16, i32, i64);

impl From<bool> for Value {
    fn from(x: bool) -> Self {
        Value::Bool(x)
    }
}
impl From<f64> for Value {
    fn from(x: f64) -> Self {
        Value::Float(x)
    }
}
impl From<f32> for Value {
    fn from(x: f32) -> Self {
        Value::Float(f64::from(x))
    }
}
impl From<&str> for Value {
    fn from(x: &str) -> Self {
        Value::Text(x.to_owned())
    }
}
impl From<String> for Value {
    fn from(x: String) -> Self {
        Value::Text(x)
    }
}
impl From<Bytes> for Value {
    fn from(x: Bytes) -> Self {
        Value::Bytes(x)
    }
}
impl From<TypedArray> for Value {
    fn from(x: TypedArray) -> Self {
        Value::Typed(x)
    }
}
impl<T: Element> From<Vec<T>> for Value {
    /// A numeric vector becomes a typed array without a copy. (A `Vec<u8>`
    /// becomes a `u8` typed array; use [`Value::Bytes`] for opaque bytes.)
    fn from(v: Vec<T>) -> Self {
        Value::Typed(TypedArray::from_vec(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vec_becomes_typed_array_without_copy() {
        let v: Vec<f64> = (0..1024).map(f64::from).collect();
        let ptr = v.as_ptr() as *const u8;
        let a = TypedArray::from_vec(v);
        assert_eq!(a.bytes().as_ptr(), ptr, "the bytes are the vector's own");
        assert_eq!(a.len(), 1024);
        assert_eq!(a.as_slice::<f64>().unwrap()[1023], 1023.0);
        assert_eq!(a.as_slice::<f32>(), None);
        assert_eq!(a.get_f64(7), Some(7.0));
    }

    #[test]
    fn length_must_be_whole_elements() {
        assert!(TypedArray::from_bytes(ElementType::F64, Bytes::from_static(&[0; 9])).is_err());
        assert!(TypedArray::from_bytes(ElementType::I16, Bytes::from_static(&[0; 4])).is_ok());
    }

    #[test]
    fn unaligned_bytes_still_copy_out() {
        let raw = Bytes::from((0..17u8).collect::<Vec<_>>()).slice(1..17);
        let a = TypedArray::from_bytes(ElementType::U64, raw).unwrap();
        let v = a.to_vec::<u64>().unwrap();
        assert_eq!(v[0], u64::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 8]));
    }
}
