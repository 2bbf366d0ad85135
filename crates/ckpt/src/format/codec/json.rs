//! Order-preserving JSON values for the file formats this crate reads and writes.
//!
//! MindSpore's JSON strategy files and `param_name_map.json` are objects whose key order
//! carries meaning (parameter order, bucket order). `serde_json::Value` sorts keys unless a
//! workspace-wide feature is switched on, so this small value type keeps them in file order
//! instead, and prints them the way Python's `json.dump(indent=n)` does.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

use crate::error::brief_name;

/// A JSON value whose objects keep their key order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// Parses text, refusing more than [`MAX_VALUES`] values (each value costs tens of bytes
    /// in memory against one or two in the text: a file of `[[1],[1],…]` within the size
    /// limit of a file read whole would otherwise take gigabytes).
    pub(crate) fn parse(text: &str) -> Result<Json, serde_json::Error> {
        LEFT.with(|left| left.set(MAX_VALUES));
        LIMIT.with(|limit| limit.set(MAX_VALUES));
        DEPTH.with(|d| d.set(0));
        let parsed = serde_json::from_str(text);
        SECTION.with(|s| s.take());
        LEFT.with(|left| left.set(usize::MAX));
        PENDING.with(|pending| *pending.borrow_mut() = Vec::new());
        parsed
    }

    /// Reads one small value (a name, a number, a short list) out of a larger document that a
    /// streaming reader walks, refusing more than `max_values` values or a string of more than
    /// `max_str_bytes` bytes: what such a value costs is bounded whatever the file holds.
    pub(crate) fn deserialize_small<'de, D: Deserializer<'de>>(
        d: D,
        max_values: usize,
        max_str_bytes: usize,
    ) -> Result<Json, D::Error> {
        let outer = (
            LEFT.with(|left| left.replace(max_values)),
            LIMIT.with(|limit| limit.replace(max_values)),
            MAX_STR.with(|max| max.replace(max_str_bytes)),
        );
        let depth = DEPTH.with(|d| d.replace(0));
        let value = Json::deserialize(d);
        DEPTH.with(|d| d.set(depth));
        LEFT.with(|left| left.set(outer.0));
        LIMIT.with(|limit| limit.set(outer.1));
        MAX_STR.with(|max| max.set(outer.2));
        value
    }

    /// Frees the list buffer the reads of this thread used (after a streaming read of a large
    /// file that called [`Json::deserialize_small`] many times).
    pub(crate) fn release_buffers() {
        PENDING.with(|pending| *pending.borrow_mut() = Vec::new());
    }

    /// Parses the bytes of a JSON file, or says why they are not JSON (not UTF-8, not valid).
    pub(crate) fn parse_bytes(bytes: &[u8]) -> Result<Json, String> {
        let text =
            std::str::from_utf8(bytes).map_err(|_| "a JSON file must be UTF-8".to_string())?;
        Json::parse(text).map_err(|e| format!("not valid JSON ({e})"))
    }

    /// Python `json.dump(value, indent=indent)` layout, without a trailing newline.
    pub(crate) fn to_pretty(&self, indent: usize) -> String {
        let indent = vec![b' '; indent];
        let mut out = Vec::new();
        let mut ser = serde_json::Serializer::with_formatter(
            &mut out,
            serde_json::ser::PrettyFormatter::with_indent(&indent),
        );
        self.serialize(&mut ser).expect("writing JSON to memory");
        String::from_utf8(out).expect("JSON is UTF-8")
    }

    /// The value as compact JSON text for a message, cut after 120 characters (`…`).
    pub(crate) fn brief(&self) -> String {
        const LONGEST: usize = 120;
        let text = serde_json::to_string(self).expect("writing JSON to memory");
        match text.char_indices().nth(LONGEST) {
            Some((cut, _)) => format!("{}…", &text[..cut]),
            None => text,
        }
    }

    /// The entry `key` of an object.
    pub(crate) fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The entries of an object.
    pub(crate) fn as_obj(&self) -> Option<&[(String, Json)]> {
        match self {
            Json::Obj(entries) => Some(entries),
            _ => None,
        }
    }

    /// The items of an array.
    pub(crate) fn as_arr(&self) -> Option<&[Json]> {
        match self {
            Json::Arr(items) => Some(items),
            _ => None,
        }
    }

    /// A string.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An integer (a float with no fractional part counts).
    pub(crate) fn as_i64(&self) -> Option<i64> {
        match *self {
            Json::Int(v) => Some(v),
            Json::UInt(v) => i64::try_from(v).ok(),
            Json::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Some(f as i64),
            _ => None,
        }
    }

    /// A non-negative integer.
    pub(crate) fn as_u64(&self) -> Option<u64> {
        self.as_i64().and_then(|v| u64::try_from(v).ok())
    }

    /// An object from key/value pairs.
    pub(crate) fn obj<K: Into<String>>(entries: impl IntoIterator<Item = (K, Json)>) -> Json {
        Json::Obj(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// An array of integers.
    pub(crate) fn ints<T: Copy + Into<i64>>(items: &[T]) -> Json {
        Json::Arr(items.iter().map(|&v| Json::Int(v.into())).collect())
    }

    /// An array of unsigned integers.
    pub(crate) fn uints(items: impl IntoIterator<Item = u64>) -> Json {
        Json::Arr(items.into_iter().map(Json::UInt).collect())
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            Json::Int(v) => s.serialize_i64(*v),
            Json::UInt(v) => s.serialize_u64(*v),
            Json::Float(v) => s.serialize_f64(*v),
            Json::Str(v) => s.serialize_str(v),
            Json::Arr(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Json::Obj(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

/// The most values (numbers, strings, lists, objects, …) one [`Json::parse`] builds.
pub(crate) const MAX_VALUES: usize = 1 << 23;

thread_local! {
    /// The values the running [`Json::parse`] may still build (`usize::MAX` outside one).
    static LEFT: Cell<usize> = const { Cell::new(usize::MAX) };
}

thread_local! {
    /// The values one read may build in all: [`MAX_VALUES`] for a whole file, less for a
    /// small value ([`Json::deserialize_small`]); named by the refusal.
    static LIMIT: Cell<usize> = const { Cell::new(MAX_VALUES) };
    /// The longest string (in bytes) a small value may hold (`usize::MAX` outside one).
    static MAX_STR: Cell<usize> = const { Cell::new(usize::MAX) };
}

thread_local! {
    /// How many objects the running read is inside (reset by each read).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// The key of the outermost object whose value is being read: a key given twice in the
    /// object under it is named with it (`duplicate key "matmul1" in "parallel_strategy_item"`),
    /// so a reader can say what the keys there are.
    static SECTION: RefCell<Option<String>> = const { RefCell::new(None) };
}

thread_local! {
    /// The items of the lists being read, innermost last: each list is built at its exact
    /// length from here, where a list grown by pushes keeps room for up to four times its
    /// items (a file of many one-item lists took 140 bytes of memory per item).
    static PENDING: RefCell<Vec<Json>> = const { RefCell::new(Vec::new()) };
}

/// Counts one value against [`MAX_VALUES`], or refuses it.
fn spend<E: de::Error>() -> Result<(), E> {
    LEFT.with(|left| match left.get() {
        0 => Err(E::custom(match LIMIT.with(Cell::get) {
            MAX_VALUES => format!(
                "more than {MAX_VALUES} JSON values (numbers, strings, lists and objects in all), the most a file read here may hold"
            ),
            limit => format!(
                "more than {limit} JSON values in one entry where a small value belongs (a name, a number or a short list)"
            ),
        })),
        n => {
            left.set(n - 1);
            Ok(())
        }
    })
}

/// Refuses a string longer than a small value's limit ([`Json::deserialize_small`]).
fn short_enough<E: de::Error>(s: &str) -> Result<(), E> {
    match MAX_STR.with(Cell::get) {
        max if s.len() > max => Err(E::custom(format!(
            "a string of {} bytes where a short one belongs (at most {max} bytes)",
            s.len()
        ))),
        _ => Ok(()),
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Json, E> {
        spend::<E>()?;
        Ok(Json::Null)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Json, E> {
        spend::<E>()?;
        Ok(Json::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Json, E> {
        spend::<E>()?;
        Ok(Json::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Json, E> {
        spend::<E>()?;
        Ok(i64::try_from(v).map_or(Json::UInt(v), Json::Int))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Json, E> {
        spend::<E>()?;
        Ok(Json::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Json, E> {
        spend::<E>()?;
        short_enough::<E>(v)?;
        Ok(Json::Str(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Json, E> {
        spend::<E>()?;
        short_enough::<E>(&v)?;
        Ok(Json::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        spend::<A::Error>()?;
        let start = PENDING.with(|pending| pending.borrow().len());
        loop {
            match seq.next_element() {
                Ok(Some(item)) => PENDING.with(|pending| pending.borrow_mut().push(item)),
                Ok(None) => break,
                Err(e) => {
                    PENDING.with(|pending| pending.borrow_mut().truncate(start));
                    return Err(e);
                }
            }
        }
        let items = PENDING.with(|pending| pending.borrow_mut().drain(start..).collect());
        Ok(Json::Arr(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        spend::<A::Error>()?;
        let depth = DEPTH.with(|d| d.replace(d.get() + 1));
        let mut entries: Vec<(String, Json)> = Vec::new();
        // A set beside the list: a linear scan per key made an object of n keys take n²/2
        // comparisons (a 14 MB strategy file of 100 000 parameters took 40 seconds).
        let mut keys: HashSet<String> = HashSet::new();
        while let Some(k) = map.next_key::<String>()? {
            // The key is a value of its own in memory.
            spend::<A::Error>()?;
            if !keys.insert(k.clone()) {
                let k = brief_name(&k);
                return Err(de::Error::custom(
                    match (depth, SECTION.with(|s| s.take())) {
                        (1, Some(section)) => {
                            format!("duplicate key {k:?} in {:?}", brief_name(&section))
                        }
                        _ => format!("duplicate key {k:?}"),
                    },
                ));
            }
            if depth == 0 {
                SECTION.with(|s| *s.borrow_mut() = Some(k.clone()));
            }
            let v = map.next_value::<Json>()?;
            entries.push((k, v));
        }
        DEPTH.with(|d| d.set(depth));
        entries.shrink_to_fit();
        Ok(Json::Obj(entries))
    }
}

/// Whether the first byte of `bytes` that is not white space is `{`: how a JSON file (every
/// JSON format here is one object) is told from a binary one.
pub(crate) fn starts_object(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// The top-level keys of a JSON object, in file order, and the string under `"format"` if
/// any: what the detection step needs, read without building the values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ObjectKeys {
    /// The keys.
    pub keys: Vec<String>,
    /// The value of `"format"` when it is a string.
    pub format: Option<String>,
}

impl ObjectKeys {
    /// Whether the object has `key`.
    pub(crate) fn has(&self, key: &str) -> bool {
        self.keys.iter().any(|k| k == key)
    }
}

/// Reads the top-level keys of `text`, which must be one JSON object.
pub(crate) fn object_keys(text: &str) -> Result<ObjectKeys, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let keys = de.deserialize_map(KeysVisitor)?;
    de.end()?;
    Ok(keys)
}

/// The value under top-level `key` of `text` (one JSON object), read without building the
/// others and whether or not the rest of the file is valid JSON: what a message about a file
/// that failed to read can add (a MindSpore file's `"current_stage"`).
pub(crate) fn top_level_value(text: &str, key: &str) -> Option<Json> {
    struct Small;
    impl<'de> de::DeserializeSeed<'de> for Small {
        type Value = Json;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Json, D::Error> {
            Json::deserialize_small(d, 64, 64)
        }
    }
    struct Find<'k>(&'k str, &'k RefCell<Option<Json>>);
    impl<'de> Visitor<'de> for Find<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(k) = map.next_key::<String>()? {
                if k == self.0 && self.1.borrow().is_none() {
                    *self.1.borrow_mut() = Some(map.next_value_seed(Small)?);
                } else {
                    map.next_value::<de::IgnoredAny>()?;
                }
            }
            Ok(())
        }
    }
    let found = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    // The rest of the file may be what failed to read: the value found before is kept.
    let _ = de.deserialize_map(Find(key, &found));
    found.into_inner()
}

/// `reason` (why a MindSpore JSON strategy or operator strategy file failed to read) with, when
/// it is a key given twice in a section keyed by operator name, what that key is and the
/// file's pipeline stage (`"current_stage"`): a repeated op name read as a bare JSON fault.
pub(crate) fn explain_duplicate_op(bytes: &[u8], reason: String) -> String {
    const OP_SECTIONS: [&str; 4] = [
        "parallel_strategy_item",
        "parallel_out_strategy_item",
        "parallel_layout_value_item",
        "parallel_out_layout_value_item",
    ];
    if !reason.contains("duplicate key")
        || !OP_SECTIONS
            .iter()
            .any(|s| reason.contains(&format!("in \"{s}\"")))
    {
        return reason;
    }
    let stage = std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| top_level_value(text, "current_stage"))
        .and_then(|v| v.as_u64())
        .map_or_else(
            || "the file gives no \"current_stage\"".to_string(),
            |s| format!("the file is pipeline stage {s} (\"current_stage\")"),
        );
    format!(
        "{reason}: that section is keyed by operator name, and an operator has one strategy record per pipeline stage; {stage}"
    )
}

struct KeysVisitor;

impl<'de> Visitor<'de> for KeysVisitor {
    type Value = ObjectKeys;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ObjectKeys, A::Error> {
        let mut out = ObjectKeys::default();
        while let Some(key) = map.next_key::<String>()? {
            if key == "format" {
                if let Json::Str(s) = map.next_value::<Json>()? {
                    out.format = Some(s);
                }
            } else {
                map.next_value::<de::IgnoredAny>()?;
            }
            out.keys.push(key);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_key_order_and_prints_like_python() {
        let v = Json::parse(r#"{"b": 1, "a": [1, 2], "c": {}}"#).unwrap();
        assert_eq!(v.as_obj().unwrap()[0].0, "b");
        assert_eq!(
            v.to_pretty(1),
            "{\n \"b\": 1,\n \"a\": [\n  1,\n  2\n ],\n \"c\": {}\n}"
        );
        assert!(Json::parse(r#"{"a": 1, "a": 2}"#).is_err());
    }

    #[test]
    fn refuses_more_values_than_the_limit() {
        // Lists of one number: two values each.
        let list = |n: usize| format!("[{}]", vec!["[1]"; n].join(","));
        let e = Json::parse(&list(MAX_VALUES / 2)).unwrap_err().to_string();
        assert!(e.contains("more than") && e.contains("JSON values"), "{e}");
        // The limit is per parse: the one refused above leaves nothing spent.
        assert!(Json::parse(&list(MAX_VALUES / 2 - 1)).is_ok());
    }

    #[test]
    fn object_keys_skip_the_values() {
        let k = object_keys(r#"{"b": [1, {"x": 2}], "format": "f", "a": null}"#).unwrap();
        assert_eq!(k.keys, ["b", "format", "a"]);
        assert_eq!(k.format.as_deref(), Some("f"));
        assert!(k.has("a") && !k.has("x"));
        assert!(object_keys("[1]").is_err());
        assert!(object_keys(r#"{"a": 1} x"#).is_err());
    }
}
