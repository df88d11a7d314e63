//! Settings objects read from maps only. serde's derived deserializer of a struct also takes
//! a sequence of its fields' values in order (`[null, 0.5]` for a struct of two fields), which
//! a configuration or request written by hand never means; a policy given as an array is a
//! mistake to report, not a policy to guess. Fields of such types use
//! `#[serde(deserialize_with = "crate::map_only::required")]` (or `optional` for an
//! `Option`), and the error then says a map was expected.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

/// Deserializes `T` from a map, refusing any other shape.
pub fn required<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    deserializer.deserialize_map(FromMap(PhantomData))
}

/// Deserializes `Option<T>` from null or a map, refusing any other shape.
pub fn optional<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    deserializer.deserialize_option(OptionFromMap(PhantomData))
}

struct FromMap<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for FromMap<T> {
    type Value = T;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a map (an object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        // The map goes on to the type's own deserializer, whose errors (and the paths
        // callers track through the map) are unchanged.
        T::deserialize(MapAccessDeserializer::new(map))
    }
}

struct OptionFromMap<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for OptionFromMap<T> {
    type Value = Option<T>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("null or a map (an object)")
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<T>, D::Error> {
        required(deserializer).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Marks {
        high: f64,
        low: f64,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Policy {
        #[serde(default, deserialize_with = "super::optional")]
        marks: Option<Marks>,
        #[serde(default, deserialize_with = "super::required")]
        other: Marks0,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(default)]
    struct Marks0 {
        at: u32,
    }

    #[test]
    fn maps_are_read_and_sequences_refused() {
        let read = |text: &str| serde_json::from_str::<Policy>(text);
        let policy = read(r#"{"marks": {"high": 0.9, "low": 0.5}, "other": {"at": 3}}"#).unwrap();
        assert_eq!(
            policy.marks,
            Some(Marks {
                high: 0.9,
                low: 0.5
            })
        );
        assert_eq!(policy.other.at, 3);
        assert_eq!(read(r#"{"marks": null}"#).unwrap().marks, None);
        assert_eq!(read("{}").unwrap().marks, None);
        let error = read(r#"{"marks": [0.9, 0.5]}"#).unwrap_err().to_string();
        assert!(error.contains("expected a map"), "{error}");
        let error = read(r#"{"other": [3]}"#).unwrap_err().to_string();
        assert!(error.contains("expected a map"), "{error}");
        let error = read(r#"{"marks": {"high": 0.9, "lo": 0.5}}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown field `lo`"), "{error}");
    }
}
