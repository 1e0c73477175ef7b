//! CBOR encoding of [`Value`]s and the split of large payloads.
//!
//! A payload is the body of the first frame, followed by the second frame
//! when the header's payload-frame flag is set. Milonga sets that flag only
//! when the whole value is a large byte string or typed array: the first
//! frame then ends with the CBOR head (tag and byte-string length) and the
//! second frame holds exactly the array's bytes, so that neither the sender
//! nor the receiver copies them.

use bytes::Bytes;
use minicbor::data::{Tag, Type};
use minicbor::{Decoder, Encoder};

use crate::frame::Encoding;
use crate::value::{ElementType, TypedArray, Value};

/// Deepest nesting of arrays, maps and tags a decoder accepts.
pub const MAX_DEPTH: usize = 64;
/// Most values (array items, map keys and values, scalars) one payload may
/// hold. Each costs tens of bytes decoded, so this bounds the memory a
/// hostile 64 MiB payload of one-byte items could claim. A typed array is
/// one value, whatever its length.
pub const MAX_ITEMS: usize = 1 << 20;

/// Why a value could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The integer lies outside CBOR's range (-2^64 ..= 2^64-1).
    #[error("integer {0} is outside CBOR's range -2^64..2^64-1")]
    IntegerOutOfRange(i128),
    /// A user type could not be serialized.
    #[error("cannot serialize value: {0}")]
    Serde(String),
}

/// Why a payload could not be decoded. Receivers drop such a sample, count
/// it and log this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Malformed CBOR.
    #[error("malformed CBOR: {0}")]
    Cbor(String),
    /// Nesting deeper than [`MAX_DEPTH`].
    #[error("CBOR nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// More than [`MAX_ITEMS`] values; send numbers as a typed array.
    #[error(
        "more than {MAX_ITEMS} CBOR values in one payload (numeric arrays belong in typed arrays)"
    )]
    TooManyItems,
    /// Bytes remain after the top-level value.
    #[error("{0} trailing bytes after the CBOR value")]
    TrailingBytes(usize),
    /// A typed-array tag wraps something other than a byte string of whole
    /// elements.
    #[error("typed array tag {tag}: {why}")]
    BadTypedArray {
        /// The RFC 8746 tag.
        tag: u64,
        /// What is wrong.
        why: String,
    },
    /// A CBOR simple value Milonga does not map to a [`Value`].
    #[error("unsupported CBOR simple value {0}")]
    UnsupportedSimple(u8),
    /// A JSON payload is not UTF-8.
    #[error("JSON payload is not UTF-8")]
    JsonNotUtf8,
    /// A user type could not be deserialized.
    #[error("cannot deserialize value: {0}")]
    Serde(String),
}

impl From<minicbor::decode::Error> for DecodeError {
    fn from(e: minicbor::decode::Error) -> Self {
        DecodeError::Cbor(e.to_string())
    }
}

/// A value ready for the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    /// The header's encoding byte.
    pub encoding: Encoding,
    /// Bytes that go in the first frame after the header.
    pub head: Bytes,
    /// Bytes that go, uncopied, in a second frame.
    pub tail: Option<Bytes>,
}

/// Encodes `value` for a sample. A top-level [`Value::Bytes`] uses the raw
/// encoding; a top-level byte string or typed array of `split_at` bytes or
/// more goes to a second frame without a copy.
pub fn encode_payload(value: &Value, split_at: usize) -> Result<Encoded, EncodeError> {
    match value {
        Value::Bytes(b) if b.len() >= split_at => Ok(Encoded {
            encoding: Encoding::Raw,
            head: Bytes::new(),
            tail: Some(b.clone()),
        }),
        Value::Bytes(b) => Ok(Encoded {
            encoding: Encoding::Raw,
            head: b.clone(),
            tail: None,
        }),
        Value::Typed(a) if a.bytes().len() >= split_at => {
            let mut e = Encoder::new(Vec::with_capacity(16));
            e.tag(Tag::new(a.element().cbor_tag()))
                .and_then(|e| e.bytes_len(a.bytes().len() as u64))
                .expect("writing to a Vec cannot fail");
            Ok(Encoded {
                encoding: Encoding::Cbor,
                head: Bytes::from(e.into_writer()),
                tail: Some(a.bytes().clone()),
            })
        }
        Value::Tagged(TAG_NDARRAY, inner) => match ndarray_parts(inner) {
            Some((dims, a)) if a.bytes().len() >= split_at => {
                const INFALLIBLE: &str = "writing to a Vec cannot fail";
                let mut e = Encoder::new(Vec::with_capacity(32));
                e.tag(Tag::new(TAG_NDARRAY))
                    .and_then(|e| e.array(2))
                    .and_then(|e| e.array(dims.len() as u64))
                    .expect(INFALLIBLE);
                for d in &dims {
                    e.u64(*d).expect(INFALLIBLE);
                }
                e.tag(Tag::new(a.element().cbor_tag()))
                    .and_then(|e| e.bytes_len(a.bytes().len() as u64))
                    .expect(INFALLIBLE);
                Ok(Encoded {
                    encoding: Encoding::Cbor,
                    head: Bytes::from(e.into_writer()),
                    tail: Some(a.bytes().clone()),
                })
            }
            _ => encode_whole(value),
        },
        v => encode_whole(v),
    }
}

/// RFC 8746: a multi-dimensional array, row-major: `40([dims, elements])`.
pub const TAG_NDARRAY: u64 = 40;

/// The dimensions (unsigned integers, at most [`MAX_DIMS`]) and the typed
/// array of a [`TAG_NDARRAY`] value's content, if it is one.
fn ndarray_parts(inner: &Value) -> Option<(Vec<u64>, &TypedArray)> {
    let Value::Array(parts) = inner else {
        return None;
    };
    let [Value::Array(dims), Value::Typed(a)] = parts.as_slice() else {
        return None;
    };
    if dims.len() > MAX_DIMS {
        return None;
    }
    let dims = dims
        .iter()
        .map(|d| match d {
            Value::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        })
        .collect::<Option<Vec<u64>>>()?;
    Some((dims, a))
}

/// Dimensions of a multi-dimensional array that the split form carries.
const MAX_DIMS: usize = 32;

fn encode_whole(v: &Value) -> Result<Encoded, EncodeError> {
    let mut out = Vec::new();
    encode_cbor(v, &mut out)?;
    Ok(Encoded {
        encoding: Encoding::Cbor,
        head: Bytes::from(out),
        tail: None,
    })
}

/// Appends the CBOR encoding of `value` to `out`.
pub fn encode_cbor(value: &Value, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let mut e = Encoder::new(out);
    write_value(&mut e, value)
}

fn write_value(e: &mut Encoder<&mut Vec<u8>>, v: &Value) -> Result<(), EncodeError> {
    const INFALLIBLE: &str = "writing to a Vec cannot fail";
    match v {
        Value::Null => {
            e.null().expect(INFALLIBLE);
        }
        Value::Bool(b) => {
            e.bool(*b).expect(INFALLIBLE);
        }
        Value::Int(i) => {
            let int = minicbor::data::Int::try_from(*i)
                .map_err(|_| EncodeError::IntegerOutOfRange(*i))?;
            e.int(int).expect(INFALLIBLE);
        }
        Value::Float(f) => {
            e.f64(*f).expect(INFALLIBLE);
        }
        Value::Text(s) => {
            e.str(s).expect(INFALLIBLE);
        }
        Value::Bytes(b) => {
            e.bytes(b).expect(INFALLIBLE);
        }
        Value::Array(items) => {
            e.array(items.len() as u64).expect(INFALLIBLE);
            for item in items {
                write_value(e, item)?;
            }
        }
        Value::Map(pairs) => {
            e.map(pairs.len() as u64).expect(INFALLIBLE);
            for (k, v) in pairs {
                write_value(e, k)?;
                write_value(e, v)?;
            }
        }
        Value::Typed(a) => {
            e.tag(Tag::new(a.element().cbor_tag()))
                .and_then(|e| e.bytes(a.bytes()))
                .expect(INFALLIBLE);
        }
        Value::Tagged(t, inner) => {
            e.tag(Tag::new(*t)).expect(INFALLIBLE);
            write_value(e, inner)?;
        }
    }
    Ok(())
}

/// Decodes a payload: `first` is the first frame's body, `second` the
/// payload frame if the header says there is one. Byte strings and
/// little-endian typed arrays are views of these buffers, not copies.
pub fn decode_payload(
    encoding: Encoding,
    first: Bytes,
    second: Option<Bytes>,
) -> Result<Value, DecodeError> {
    match (encoding, second) {
        (Encoding::Raw, None) => Ok(Value::Bytes(first)),
        (Encoding::Raw, Some(tail)) if first.is_empty() => Ok(Value::Bytes(tail)),
        // A compact payload is CBOR too; its schema gives it names
        // (`crate::schema::Plan`).
        (Encoding::Cbor | Encoding::Compact, None) => decode_cbor(&first),
        (Encoding::Cbor, Some(tail)) => match split_view(&first, &tail) {
            Some(v) => v,
            None => decode_cbor(&concat(&first, &tail)),
        },
        (Encoding::Json, None) => json_text(first),
        (enc, Some(tail)) => decode_payload(enc, concat(&first, &tail), None),
    }
}

fn json_text(b: Bytes) -> Result<Value, DecodeError> {
    String::from_utf8(b.to_vec())
        .map(Value::Text)
        .map_err(|_| DecodeError::JsonNotUtf8)
}

fn concat(a: &[u8], b: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(a.len() + b.len());
    v.extend_from_slice(a);
    v.extend_from_slice(b);
    Bytes::from(v)
}

/// Recognises `head` = [`40([dims, `] [typed-array tag] + byte-string
/// length == tail.len(), the splits Milonga writes, and views the tail
/// without a copy. `None`
/// for anything else, which the caller decodes the general way.
fn split_view(head: &[u8], tail: &Bytes) -> Option<Result<Value, DecodeError>> {
    let mut d = Decoder::new(head);
    let mut element = None;
    // A multi-dimensional array: `40([dims, ` before the typed array.
    let mut dims = None;
    if head.starts_with(&[0xd8, TAG_NDARRAY as u8, 0x82]) {
        d.set_position(3);
        let n = d.array().ok()??;
        if n > MAX_DIMS as u64 {
            return None;
        }
        let mut v = Vec::with_capacity(n as usize);
        for _ in 0..n {
            v.push(Value::Int(i128::from(d.u64().ok()?)));
        }
        dims = Some(v);
        if d.position() >= head.len() || d.datatype().ok()? != Type::Tag {
            return None;
        }
    }
    if d.datatype().ok()? == Type::Tag {
        let tag = d.tag().ok()?.as_u64();
        match ElementType::from_cbor_tag(tag) {
            Some((el, false)) => element = Some(el),
            _ => return None,
        }
    }
    if d.position() >= head.len() || d.datatype().ok()? != Type::Bytes {
        return None;
    }
    // Read the byte-string length without consuming bytes that are not there.
    let len = {
        let rest = &head[d.position()..];
        let info = rest[0] & 0x1f;
        let (len, n) = match info {
            0..=23 => (u64::from(info), 1),
            24 if rest.len() >= 2 => (u64::from(rest[1]), 2),
            25 if rest.len() >= 3 => (u64::from(u16::from_be_bytes([rest[1], rest[2]])), 3),
            26 if rest.len() >= 5 => (
                u64::from(u32::from_be_bytes(rest[1..5].try_into().expect("4"))),
                5,
            ),
            27 if rest.len() >= 9 => (u64::from_be_bytes(rest[1..9].try_into().expect("8")), 9),
            _ => return None,
        };
        if d.position() + n != head.len() {
            return None;
        }
        len
    };
    if len != tail.len() as u64 {
        return None;
    }
    let value = match element {
        None => Ok(Value::Bytes(tail.clone())),
        Some(el) => TypedArray::from_bytes(el, tail.clone())
            .map(Value::Typed)
            .map_err(|e| DecodeError::BadTypedArray {
                tag: el.cbor_tag(),
                why: e.to_string(),
            }),
    };
    Some(match dims {
        None => value,
        Some(dims) => value.map(|v| {
            Value::Tagged(
                TAG_NDARRAY,
                Box::new(Value::Array(vec![Value::Array(dims), v])),
            )
        }),
    })
}

/// Decodes one complete CBOR value from `buf`; byte strings and typed arrays
/// borrow `buf` (a cheap reference-counted slice).
pub fn decode_cbor(buf: &Bytes) -> Result<Value, DecodeError> {
    let mut d = Decoder::new(buf);
    let mut budget = MAX_ITEMS;
    let v = read_value(&mut d, buf, 0, &mut budget)?;
    let rest = buf.len() - d.position();
    if rest != 0 {
        return Err(DecodeError::TrailingBytes(rest));
    }
    Ok(v)
}

pub(crate) fn read_bytes(d: &mut Decoder<'_>, buf: &Bytes) -> Result<Bytes, DecodeError> {
    match d.datatype()? {
        Type::Bytes => {
            let s = d.bytes()?;
            let off = s.as_ptr() as usize - buf.as_ptr() as usize;
            Ok(buf.slice(off..off + s.len()))
        }
        Type::BytesIndef => {
            let mut v = Vec::new();
            for chunk in d.bytes_iter()? {
                v.extend_from_slice(chunk?);
            }
            Ok(Bytes::from(v))
        }
        t => Err(DecodeError::Cbor(format!(
            "expected a byte string, found {t}"
        ))),
    }
}

/// Reads one data item at `d`'s position, as [`decode_cbor`] would, from
/// `budget` items (a schema's `any` field, a typed array).
pub(crate) fn read_item(
    d: &mut Decoder<'_>,
    buf: &Bytes,
    budget: &mut usize,
) -> Result<Value, DecodeError> {
    read_value(d, buf, 0, budget)
}

fn read_value(
    d: &mut Decoder<'_>,
    buf: &Bytes,
    depth: usize,
    budget: &mut usize,
) -> Result<Value, DecodeError> {
    if depth > MAX_DEPTH {
        return Err(DecodeError::TooDeep);
    }
    *budget = budget.checked_sub(1).ok_or(DecodeError::TooManyItems)?;
    Ok(match d.datatype()? {
        Type::Null | Type::Undefined => {
            d.skip()?;
            Value::Null
        }
        Type::Bool => Value::Bool(d.bool()?),
        Type::U8
        | Type::U16
        | Type::U32
        | Type::U64
        | Type::I8
        | Type::I16
        | Type::I32
        | Type::I64
        | Type::Int => Value::Int(i128::from(d.int()?)),
        Type::F16 => Value::Float(f64::from(d.f16()?)),
        Type::F32 => Value::Float(f64::from(d.f32()?)),
        Type::F64 => Value::Float(d.f64()?),
        Type::String => Value::Text(d.str()?.to_owned()),
        Type::StringIndef => {
            let mut s = String::new();
            for chunk in d.str_iter()? {
                s.push_str(chunk?);
            }
            Value::Text(s)
        }
        Type::Bytes | Type::BytesIndef => Value::Bytes(read_bytes(d, buf)?),
        Type::Array | Type::ArrayIndef => {
            let len = d.array()?;
            let mut items = Vec::new();
            match len {
                Some(n) => {
                    for _ in 0..n {
                        items.push(read_value(d, buf, depth + 1, budget)?);
                    }
                }
                None => {
                    while d.datatype()? != Type::Break {
                        items.push(read_value(d, buf, depth + 1, budget)?);
                    }
                    d.skip()?;
                }
            }
            Value::Array(items)
        }
        Type::Map | Type::MapIndef => {
            let len = d.map()?;
            let mut pairs = Vec::new();
            match len {
                Some(n) => {
                    for _ in 0..n {
                        let k = read_value(d, buf, depth + 1, budget)?;
                        pairs.push((k, read_value(d, buf, depth + 1, budget)?));
                    }
                }
                None => {
                    while d.datatype()? != Type::Break {
                        let k = read_value(d, buf, depth + 1, budget)?;
                        pairs.push((k, read_value(d, buf, depth + 1, budget)?));
                    }
                    d.skip()?;
                }
            }
            Value::Map(pairs)
        }
        Type::Tag => {
            let tag = d.tag()?.as_u64();
            match ElementType::from_cbor_tag(tag) {
                Some((el, big_endian)) => {
                    let bad = |why: String| DecodeError::BadTypedArray { tag, why };
                    if !matches!(d.datatype()?, Type::Bytes | Type::BytesIndef) {
                        return Err(bad("the tag must wrap a byte string".into()));
                    }
                    let mut bytes = read_bytes(d, buf)?;
                    if big_endian {
                        let mut v = bytes.to_vec();
                        if v.len() % el.size() == 0 {
                            v.chunks_mut(el.size()).for_each(<[u8]>::reverse);
                        }
                        bytes = Bytes::from(v);
                    }
                    Value::Typed(TypedArray::from_bytes(el, bytes).map_err(|e| bad(e.to_string()))?)
                }
                None => Value::Tagged(tag, Box::new(read_value(d, buf, depth + 1, budget)?)),
            }
        }
        Type::Simple => return Err(DecodeError::UnsupportedSimple(d.simple()?)),
        Type::Break => return Err(DecodeError::Cbor("unexpected break".into())),
        Type::Unknown(b) => {
            return Err(DecodeError::Cbor(format!("unknown initial byte {b:#04x}")))
        }
    })
}

pub use crate::value_de::from_value;

/// Serializes a user type (serde) to CBOR.
pub fn to_cbor<T: serde::Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, EncodeError> {
    minicbor_serde::to_vec(value).map_err(|e| EncodeError::Serde(e.to_string()))
}

/// Deserializes a user type (serde) from CBOR.
pub fn from_cbor<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, DecodeError> {
    minicbor_serde::from_slice(bytes).map_err(|e| DecodeError::Serde(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(v: &Value) -> Value {
        let mut out = Vec::new();
        encode_cbor(v, &mut out).unwrap();
        decode_cbor(&Bytes::from(out)).unwrap()
    }

    #[test]
    fn every_kind_round_trips() {
        let v = Value::Map(vec![
            (Value::from("null"), Value::Null),
            (Value::from("t"), Value::Bool(true)),
            (Value::from("i"), Value::Int(-5)),
            (Value::from("big"), Value::Int(u64::MAX as i128)),
            (Value::from("neg"), Value::Int(-(1i128 << 64))),
            (Value::from("f"), Value::Float(1.5)),
            (Value::from("s"), Value::from("héllo")),
            (
                Value::from("b"),
                Value::Bytes(Bytes::from_static(b"\x00\x01")),
            ),
            (
                Value::from("a"),
                Value::Array(vec![Value::Int(1), Value::Null]),
            ),
            (Value::from("f64"), Value::from(vec![1.0f64, 2.0, 3.0])),
            (Value::from("i16"), Value::from(vec![-1i16, 2])),
            (Value::from("u64"), Value::from(vec![u64::MAX])),
            (
                Value::from("tag"),
                Value::Tagged(1, Box::new(Value::Int(1_700_000_000))),
            ),
        ]);
        assert_eq!(round_trip(&v), v);
    }

    #[test]
    fn integers_out_of_range_are_refused() {
        let mut out = Vec::new();
        assert_eq!(
            encode_cbor(&Value::Int(1i128 << 64), &mut out),
            Err(EncodeError::IntegerOutOfRange(1i128 << 64))
        );
    }

    #[test]
    fn typed_array_is_a_view_of_the_buffer() {
        let mut out = Vec::new();
        encode_cbor(&Value::from(vec![0.5f64; 8]), &mut out).unwrap();
        assert_eq!(out[..3], [0xd8, 86, 0x58]); // tag(86), bytes(64)
        let buf = Bytes::from(out);
        let Value::Typed(a) = decode_cbor(&buf).unwrap() else {
            panic!("not typed")
        };
        let start = buf.as_ptr() as usize;
        let view = a.bytes().as_ptr() as usize;
        assert!(
            view > start && view < start + buf.len(),
            "decoded without a copy"
        );
    }

    #[test]
    fn big_endian_arrays_are_converted() {
        // tag 82 (float64 BE), 8 bytes of 1.0 big-endian
        let mut b = vec![0xd8, 82, 0x48];
        b.extend_from_slice(&1.0f64.to_be_bytes());
        let Value::Typed(a) = decode_cbor(&Bytes::from(b)).unwrap() else {
            panic!()
        };
        assert_eq!(a.to_vec::<f64>().unwrap(), vec![1.0]);
    }

    #[test]
    fn large_arrays_split_without_copy() {
        let v = Value::from(vec![2.0f64; 131_072]); // 1 MiB
        let Value::Typed(a) = &v else { unreachable!() };
        let enc = encode_payload(&v, 65_536).unwrap();
        let tail = enc.tail.clone().unwrap();
        assert_eq!(
            tail.as_ptr(),
            a.bytes().as_ptr(),
            "the tail is the user's buffer"
        );
        assert_eq!(enc.head.len(), 2 + 5);
        let back = decode_payload(enc.encoding, enc.head, Some(tail.clone())).unwrap();
        let Value::Typed(b) = back else { panic!() };
        assert_eq!(
            b.bytes().as_ptr(),
            tail.as_ptr(),
            "the receiver views the frame"
        );
        assert_eq!(b.len(), 131_072);
    }

    #[test]
    fn large_multi_dimensional_arrays_split_without_copy() {
        let a = TypedArray::from_vec(vec![7u16; 480 * 640]);
        let dims = Value::Array(vec![Value::Int(480), Value::Int(640)]);
        let v = Value::Tagged(
            TAG_NDARRAY,
            Box::new(Value::Array(vec![dims.clone(), Value::Typed(a.clone())])),
        );
        let enc = encode_payload(&v, 65_536).unwrap();
        let tail = enc.tail.clone().expect("split");
        assert_eq!(
            tail.as_ptr(),
            a.bytes().as_ptr(),
            "the tail is the array's buffer"
        );
        // The two frames are the whole encoding, cut before the elements:
        // a reader that joins them (protocol.md §4) decodes the same value.
        let mut whole = Vec::new();
        encode_cbor(&v, &mut whole).unwrap();
        assert_eq!([&enc.head[..], &tail[..]].concat(), whole);
        assert_eq!(decode_cbor(&Bytes::from(whole)).unwrap(), v);
        let back = decode_payload(enc.encoding, enc.head.clone(), Some(tail.clone())).unwrap();
        assert_eq!(back, v);
        let Value::Tagged(_, inner) = &back else {
            panic!()
        };
        let Value::Array(parts) = &**inner else {
            panic!()
        };
        let Value::Typed(b) = &parts[1] else { panic!() };
        assert_eq!(
            b.bytes().as_ptr(),
            tail.as_ptr(),
            "the receiver views the frame"
        );
        // Small, or not the shape `[dims, typed array]`: one frame.
        let small = Value::Tagged(
            TAG_NDARRAY,
            Box::new(Value::Array(vec![dims, Value::from(vec![1u16; 8])])),
        );
        assert!(encode_payload(&small, 65_536).unwrap().tail.is_none());
        let odd = Value::Tagged(
            TAG_NDARRAY,
            Box::new(Value::Array(vec![Value::Int(-1), Value::Typed(a)])),
        );
        assert!(encode_payload(&odd, 65_536).unwrap().tail.is_none());
        // A head whose dimensions are not unsigned integers is decoded
        // the general way, not viewed.
        let prefix = [0xd8, 40, 0x82, 0x82, 0x19, 0x01, 0xe0, 0x19, 0x02, 0x80];
        assert_eq!(enc.head[..10], prefix, "40([[480, 640], ");
        // docs/protocol.md §4's example.
        assert_eq!(enc.head[10..], [0xd8, 0x45, 0x5a, 0x00, 0x09, 0x60, 0x00]);
        let mut head = vec![0xd8, 40, 0x82, 0x81, 0x20];
        head.extend_from_slice(&enc.head[10..]);
        assert!(split_view(&head, &tail).is_none());
    }

    #[test]
    fn raw_bytes_pass_through() {
        let v = Value::Bytes(Bytes::from_static(b"\xff\x00raw"));
        let enc = encode_payload(&v, 65_536).unwrap();
        assert_eq!(enc.encoding, Encoding::Raw);
        assert_eq!(enc.head, &b"\xff\x00raw"[..]);
        assert_eq!(decode_payload(Encoding::Raw, enc.head, None).unwrap(), v);
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let cases: &[&[u8]] = &[
            &[0x18],                                                 // truncated uint
            &[0x5a, 0xff, 0xff, 0xff, 0xff],                         // bytes longer than input
            &[0x9f, 0x01],              // unterminated indefinite array
            &[0xff],                    // lone break
            &[0x01, 0x02],              // trailing bytes
            &[0xd8, 86, 0x43, 1, 2, 3], // f64 array of 3 bytes
            &[0xd8, 86, 0x01],          // typed array tag around an int
            &[0xf7 - 0x10],             // simple value 7 (0xe7)
            &[0x9b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], // array of 2^64-1 items
        ];
        for c in cases {
            assert!(decode_cbor(&Bytes::copy_from_slice(c)).is_err(), "{c:02x?}");
        }
        let deep = vec![0x81; MAX_DEPTH + 5];
        assert_eq!(decode_cbor(&Bytes::from(deep)), Err(DecodeError::TooDeep));
        // An array of MAX_ITEMS one-byte integers: refused before it is built.
        let mut many = vec![0x9a];
        many.extend_from_slice(&(MAX_ITEMS as u32).to_be_bytes());
        many.resize(5 + MAX_ITEMS, 0x01);
        assert_eq!(
            decode_cbor(&Bytes::from(many)),
            Err(DecodeError::TooManyItems)
        );
    }

    #[test]
    fn serde_structs() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Reading {
            current: f64,
            status: String,
        }
        let r = Reading {
            current: 1.25,
            status: "ON".into(),
        };
        let bytes = to_cbor(&r).unwrap();
        let v = decode_cbor(&Bytes::from(bytes.clone())).unwrap();
        assert_eq!(v.get("status").and_then(Value::as_str), Some("ON"));
        assert_eq!(from_cbor::<Reading>(&bytes).unwrap(), r);
    }
}
