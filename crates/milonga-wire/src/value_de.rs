//! Reading a user type (serde) straight from a [`Value`], without encoding
//! it again: what a subscriber's `Sample::deserialize` does. Typed arrays
//! read as sequences of numbers, so a `Vec<f64>` field takes one; an enum
//! reads from its variant's name, its index, or a one-pair map for a
//! variant with data.

use serde::de::{
    self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor,
};

use crate::cbor::DecodeError;
use crate::value::{TypedArray, Value};

/// Deserializes `T` from `v`.
pub fn from_value<T: de::DeserializeOwned>(v: &Value) -> Result<T, DecodeError> {
    T::deserialize(ValueDe(v)).map_err(|e| DecodeError::Serde(e.0))
}

/// The serde deserializer over `v` (the compact reader's defaults and
/// values of type `any`).
pub(crate) fn value_deserializer(v: &Value) -> impl for<'de> Deserializer<'de, Error = Error> + '_ {
    ValueDe(v)
}

/// Why a value does not read as the type asked for.
#[derive(Debug)]
pub(crate) struct Error(String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Error(msg.to_string())
    }
}

#[derive(Clone, Copy)]
struct ValueDe<'a>(&'a Value);

impl<'de> Deserializer<'de> for ValueDe<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => v.visit_unit(),
            Value::Bool(b) => v.visit_bool(*b),
            Value::Int(i) => {
                if let Ok(u) = u64::try_from(*i) {
                    v.visit_u64(u)
                } else if let Ok(s) = i64::try_from(*i) {
                    v.visit_i64(s)
                } else {
                    v.visit_i128(*i)
                }
            }
            Value::Float(f) => v.visit_f64(*f),
            Value::Text(s) => v.visit_str(s),
            Value::Bytes(b) => v.visit_bytes(b),
            Value::Array(items) => {
                let mut seq = Seq(items.iter());
                let r = v.visit_seq(&mut seq)?;
                // As serde's own value deserializers: a type that reads
                // fewer items than there are (a fixed-size array) is told.
                if seq.0.len() != 0 {
                    return Err(de::Error::invalid_length(items.len(), &"fewer items"));
                }
                Ok(r)
            }
            Value::Map(pairs) => v.visit_map(Map {
                pairs: pairs.iter(),
                value: None,
            }),
            Value::Typed(a) => {
                let mut seq = Typed { a, i: 0 };
                let r = v.visit_seq(&mut seq)?;
                if seq.i != a.len() {
                    return Err(de::Error::invalid_length(a.len(), &"fewer elements"));
                }
                Ok(r)
            }
            Value::Tagged(_, inner) => ValueDe(inner).deserialize_any(v),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => v.visit_none(),
            _ => v.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, Error> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::Text(s) => v.visit_enum(s.as_str().into_deserializer()),
            Value::Int(i) => {
                let i = u32::try_from(*i).map_err(|_| Error(format!("variant index {i}")))?;
                v.visit_enum(i.into_deserializer())
            }
            Value::Map(pairs) if pairs.len() == 1 => {
                v.visit_enum(de::value::MapAccessDeserializer::new(Map {
                    pairs: pairs.iter(),
                    value: None,
                }))
            }
            other => Err(Error(format!("an enum cannot be read from {other:?}"))),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct
        identifier ignored_any
    }
}

struct Seq<'a>(std::slice::Iter<'a, Value>);

impl<'de> SeqAccess<'de> for Seq<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0
            .next()
            .map(|v| seed.deserialize(ValueDe(v)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Typed<'a> {
    a: &'a TypedArray,
    i: usize,
}

impl<'de> SeqAccess<'de> for Typed<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        let Some(v) = self.a.value_at(self.i) else {
            return Ok(None);
        };
        self.i += 1;
        seed.deserialize(ValueDe(&v)).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.a.len() - self.i)
    }
}

struct Map<'a> {
    pairs: std::slice::Iter<'a, (Value, Value)>,
    value: Option<&'a Value>,
}

impl<'de> MapAccess<'de> for Map<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.pairs.next() {
            Some((k, v)) => {
                self.value = Some(v);
                seed.deserialize(ValueDe(k)).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let v = self
            .value
            .take()
            .ok_or_else(|| Error("a map value asked before its key".into()))?;
        seed.deserialize(ValueDe(v))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.pairs.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Deserialize)]
    enum E {
        A,
        B(u8),
    }

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct S {
        x: f64,
        v: Vec<f32>,
        o: Option<String>,
        e: E,
        f: E,
        n: i64,
    }

    #[test]
    fn a_struct_reads_from_a_map_with_typed_arrays_and_enums() {
        let t = |k: &str| Value::Text(k.into());
        let v = Value::Map(vec![
            (t("x"), Value::Int(2)),
            (
                t("v"),
                Value::Typed(TypedArray::from_vec(vec![1.0f32, 2.5])),
            ),
            (t("o"), Value::Null),
            (t("e"), t("A")),
            (t("f"), Value::Map(vec![(t("B"), Value::Int(7))])),
            (t("n"), Value::Int(-5)),
            (t("ignored"), Value::Bool(true)),
        ]);
        assert_eq!(
            from_value::<S>(&v).unwrap(),
            S {
                x: 2.0,
                v: vec![1.0, 2.5],
                o: None,
                e: E::A,
                f: E::B(7),
                n: -5,
            }
        );
        assert!(from_value::<S>(&Value::Int(1)).is_err());
    }
}
