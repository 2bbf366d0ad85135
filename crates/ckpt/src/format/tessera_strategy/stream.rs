//! The streaming decoder of Tessera's strategy JSON: the file is walked once, each tensor is
//! decoded into a small raw record and handed to a sink that checks it and keeps what it builds,
//! so no tree of the whole file is ever held (such a tree capped a strategy at about 190 000
//! tensors, and a third of a load was freeing it).
//!
//! The decoding is lenient about kinds: a value of another kind than expected (a string where
//! a list belongs) is recorded as such, never a decoding error, so the checks that follow can
//! name the tensor and the rule whatever order the keys come in. Every list is read up to a cap
//! (past it only counted and checked, not kept), and every small value (a dtype, a mesh axis, a
//! dim's axis names) through [`Json::deserialize_small`], so what one record holds is bounded
//! by what the strategy builds. JSON's own rules stay: a key given twice in one object is an
//! error, as is anything after the value.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::error::CkptError;
use crate::format::codec::json::Json;
use crate::model::OpStrategyRecord;

/// The most JSON values a small value (a dtype, a mesh axis, a dim's axis names, a stage) may
/// hold: far above any real one.
const SMALL_VALUES: usize = 4096;
/// The longest string (bytes) a small value may hold.
const SMALL_STR_BYTES: usize = 1 << 16;
/// The longest tensor or op name (bytes) the reader takes: far above any real one, and it keeps
/// a file of one huge string from being copied.
pub(super) const MAX_NAME_BYTES: usize = 1 << 16;

/// A list read leniently: its first items up to a cap, its length, and whether every item
/// (counted ones included) was of the kind wanted. Once an item is not, no more are kept.
#[derive(Debug)]
pub(super) struct List<T> {
    /// The items kept (all of them when [`List::len`] equals their number and `ok` holds).
    pub items: Vec<T>,
    /// How many items the list had.
    pub len: usize,
    /// Whether every item was of the kind wanted.
    pub ok: bool,
}

impl<T> List<T> {
    /// The items when every one was of the kind wanted and none was past the cap.
    pub fn whole(&self) -> Option<&[T]> {
        (self.ok && self.items.len() == self.len).then_some(&self.items[..])
    }
}

/// A value that should be a list.
#[derive(Debug)]
pub(super) enum Listed<T> {
    /// `null`.
    Null,
    /// Neither a list nor `null`.
    Other,
    /// A list.
    List(List<T>),
}

impl<T> Listed<T> {
    /// The list, if the value is one.
    pub fn list(&self) -> Option<&List<T>> {
        match self {
            Listed::List(l) => Some(l),
            _ => None,
        }
    }
}

/// A name: a string of at most [`MAX_NAME_BYTES`], or why not.
#[derive(Debug, Default)]
pub(super) enum Name {
    /// Absent, or not a string.
    #[default]
    Missing,
    /// A string of this many bytes, over the limit (not copied).
    TooLong(usize),
    /// The name.
    Str(String),
}

/// One entry of `"tensors"`, as written; a value that is not an object reads as one without keys.
#[derive(Debug, Default)]
pub(super) struct RawTensor {
    pub name: Name,
    pub shape: Option<Listed<u64>>,
    pub dtype: Option<Json>,
    pub placements: Option<Listed<RawPlacement>>,
}

/// One entry of a tensor's `"placements"`.
#[derive(Debug, Default)]
pub(super) struct RawPlacement {
    pub stage: Option<Json>,
    pub mesh: Option<RawMesh>,
    pub dims: Option<Listed<Json>>,
    pub optimizer_shard: Option<Json>,
    pub rows: Option<Listed<u64>>,
}

/// A placement's `"mesh"`; a value that is not an object reads as one without keys.
#[derive(Debug, Default)]
pub(super) struct RawMesh {
    pub axes: Option<Listed<Json>>,
    pub rank_list: Option<Listed<u64>>,
    pub rank_range: Option<Json>,
}

/// One entry of `"ops"`.
#[derive(Debug, Default)]
pub(super) struct RawOp {
    pub name: Name,
    pub stage: Option<Json>,
    /// Split tuples; one that is not a list makes the outer list not `ok`.
    pub in_strategy: Option<Listed<List<u64>>>,
    pub out_strategy: Option<Listed<List<u64>>>,
}

/// The caps of the lists, set by the caller.
#[derive(Debug, Clone, Copy)]
pub(super) struct Caps {
    /// Sizes of a `"shape"`, factors of a split tuple, entries of `"dims"`.
    pub dims: usize,
    /// Placements of one tensor.
    pub placements: usize,
    /// Axes of one mesh.
    pub axes: usize,
    /// Ranks of a `"rank_list"`, rows of `"rows"`.
    pub ranks: usize,
    /// Split tuples of one op's in- or out-strategy.
    pub tuples: usize,
    /// Entries of `"ops"`.
    pub ops: usize,
}

/// The top level of the file, past its tensors (which went to the sink).
#[derive(Debug, Default)]
pub(super) struct RawTop {
    pub version: Option<Json>,
    /// `None`: no `"tensors"`; `Some(false)`: not a list; `Some(true)`: a list.
    pub tensors: Option<bool>,
    /// The records of `"ops"`, checked as they were read (the list is not `ok` when one broke a
    /// rule: then no more were kept).
    pub ops: Option<Listed<OpStrategyRecord>>,
    /// The first `"ops"` entry that broke a rule: its index and the rule.
    pub op_error: Option<(usize, String)>,
}

/// What checks each `"ops"` entry as it is read: its record, or the rule it breaks.
pub(super) type OpCheck = fn(&RawOp) -> Result<OpStrategyRecord, String>;

/// What receives each tensor as it is decoded: the `"version"` read so far (if it came first),
/// the tensor's index and the tensor. An error stops the read and is returned as it is.
pub(super) type Sink<'a> = dyn FnMut(Option<&Json>, usize, RawTensor) -> Result<(), CkptError> + 'a;

/// Why a read stopped.
pub(super) enum Stop {
    /// The text is not JSON (or breaks a decoding bound); serde_json's words, with the place.
    Json(serde_json::Error),
    /// The sink refused a tensor.
    Sink(CkptError),
}

/// Walks `text`, one Tessera strategy object, giving each tensor to `sink`.
/// Each `"ops"` entry is checked by `check_op` as it is read.
pub(super) fn decode(
    text: &str,
    caps: Caps,
    sink: &mut Sink<'_>,
    check_op: OpCheck,
) -> Result<RawTop, Stop> {
    let mut failed = None;
    let mut de = serde_json::Deserializer::from_str(text);
    let top = de
        .deserialize_any(TopVisitor {
            caps,
            check_op,
            sink,
            failed: &mut failed,
        })
        .and_then(|top| de.end().map(|()| top));
    Json::release_buffers();
    match (top, failed) {
        (_, Some(e)) => Err(Stop::Sink(e)),
        (Ok(top), None) => Ok(top),
        (Err(e), None) => Err(Stop::Json(e)),
    }
}

/// Tracks an object's keys to refuse one given twice: known keys by bit, others in a set made
/// only when one appears.
struct Seen {
    known: u64,
    others: Option<HashSet<String>>,
}

impl Seen {
    fn new() -> Seen {
        Seen {
            known: 0,
            others: None,
        }
    }

    fn first<E: de::Error>(&mut self, key: &Key, names: &[&str]) -> Result<(), E> {
        let again = match key {
            Key::Known(i) => {
                let bit = 1 << i;
                let again = self.known & bit != 0;
                self.known |= bit;
                again
            }
            Key::Other(k) => !self
                .others
                .get_or_insert_with(HashSet::new)
                .insert(k.clone()),
        };
        if again {
            let k = match key {
                Key::Known(i) => names[*i],
                Key::Other(k) => k,
            };
            return Err(E::custom(format!(
                "duplicate key {:?}",
                crate::error::brief_name(k)
            )));
        }
        Ok(())
    }
}

/// An object key: the index of one of the keys a record knows, or another key.
enum Key {
    Known(usize),
    Other(String),
}

/// Reads a key against the known `names` (no copy for a known one).
#[derive(Clone, Copy)]
struct KeySeed(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Key;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(match self.0.iter().position(|k| *k == v) {
            Some(i) => Key::Known(i),
            None => Key::Other(v.to_string()),
        })
    }
}

/// Consumes the rest of a list or an object without keeping it.
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// The visitor methods of a lenient reader for the scalars it does not expect (booleans and
/// numbers): each gives `$other`.
macro_rules! other_kinds {
    ($value:ty, $other:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<$value, E> {
            Ok($other)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<$value, E> {
            Ok($other)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<$value, E> {
            Ok($other)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<$value, E> {
            Ok($other)
        }
    };
}

/// A small value, read whole as [`Json`] within bounds.
#[derive(Clone, Copy)]
struct Small;

impl<'de> DeserializeSeed<'de> for Small {
    type Value = Option<Json>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<Json>, D::Error> {
        Json::deserialize_small(d, SMALL_VALUES, SMALL_STR_BYTES).map(Some)
    }
}

/// A non-negative integer of at least `min` as [`Json::as_u64`] reads one (`None`: not one).
#[derive(Clone, Copy)]
struct Num {
    min: u64,
}

impl<'de> DeserializeSeed<'de> for Num {
    type Value = Option<u64>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Num {
    type Value = Option<u64>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a non-negative integer")
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<u64>, E> {
        Ok(Some(v).filter(|&v| i64::try_from(v).is_ok() && v >= self.min))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Option<u64>, E> {
        Ok(u64::try_from(v).ok().filter(|&v| v >= self.min))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Option<u64>, E> {
        Ok(Json::Float(v).as_u64().filter(|&v| v >= self.min))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Option<u64>, A::Error> {
        drain_seq(seq).map(|()| None)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<u64>, A::Error> {
        drain_map(map).map(|()| None)
    }
}

/// A list of items read by `item` (whose `None` marks an item of another kind), keeping at most
/// `cap` of them.
#[derive(Clone, Copy)]
struct ListOf<S> {
    cap: usize,
    item: S,
}

impl<'de, T, S> DeserializeSeed<'de> for ListOf<S>
where
    S: DeserializeSeed<'de, Value = Option<T>> + Copy,
{
    type Value = Listed<T>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Listed<T>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, T, S> Visitor<'de> for ListOf<S>
where
    S: DeserializeSeed<'de, Value = Option<T>> + Copy,
{
    type Value = Listed<T>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }
    other_kinds!(Listed<T>, Listed::Other);
    fn visit_unit<E: de::Error>(self) -> Result<Listed<T>, E> {
        Ok(Listed::Null)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Listed<T>, E> {
        Ok(Listed::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Listed<T>, A::Error> {
        let mut list = List {
            items: Vec::new(),
            len: 0,
            ok: true,
        };
        while let Some(item) = seq.next_element_seed(self.item)? {
            list.len += 1;
            match item {
                Some(v) if list.ok && list.items.len() < self.cap => list.items.push(v),
                Some(_) => {}
                None if list.ok => {
                    list.ok = false;
                    list.items = Vec::new();
                }
                None => {}
            }
        }
        Ok(Listed::List(list))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Listed<T>, A::Error> {
        drain_map(map).map(|()| Listed::Other)
    }
}

/// A split tuple: a list of positive factors (`None`: not a list).
#[derive(Clone, Copy)]
struct Tuple {
    cap: usize,
}

impl<'de> DeserializeSeed<'de> for Tuple {
    type Value = Option<List<u64>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<List<u64>>, D::Error> {
        let list = ListOf {
            cap: self.cap,
            item: Num { min: 1 },
        }
        .deserialize(d)?;
        Ok(match list {
            Listed::List(l) => Some(l),
            _ => None,
        })
    }
}

/// A name (a string), not copied when over [`MAX_NAME_BYTES`].
struct NameSeed;

impl<'de> DeserializeSeed<'de> for NameSeed {
    type Value = Name;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Name, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NameSeed {
    type Value = Name;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a name")
    }
    other_kinds!(Name, Name::Missing);
    fn visit_unit<E: de::Error>(self) -> Result<Name, E> {
        Ok(Name::Missing)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Name, E> {
        Ok(if v.len() > MAX_NAME_BYTES {
            Name::TooLong(v.len())
        } else {
            Name::Str(v.to_string())
        })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Name, A::Error> {
        drain_seq(seq).map(|()| Name::Missing)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Name, A::Error> {
        drain_map(map).map(|()| Name::Missing)
    }
}

/// Reads an object leniently: `$fields` is the list of known keys and `$read` reads the value
/// of the known key at an index into `$out`; another kind of value reads as an empty object.
macro_rules! record_visitor {
    ($visitor:ident, $value:ty, $names:expr, |$self_:ident, $out:ident, $map:ident, $index:ident| $read:block) => {
        impl<'de> Visitor<'de> for $visitor {
            type Value = $value;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            other_kinds!($value, <$value>::default());
            fn visit_unit<E: de::Error>(self) -> Result<$value, E> {
                Ok(<$value>::default())
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<$value, E> {
                Ok(<$value>::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<$value, A::Error> {
                drain_seq(seq).map(|()| <$value>::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut $map: A) -> Result<$value, A::Error> {
                let $self_ = self;
                let mut $out = <$value>::default();
                let mut seen = Seen::new();
                while let Some(key) = $map.next_key_seed(KeySeed($names))? {
                    seen.first::<A::Error>(&key, $names)?;
                    match key {
                        Key::Known($index) => $read,
                        Key::Other(_) => {
                            $map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok($out)
            }
        }
        impl<'de> DeserializeSeed<'de> for $visitor {
            type Value = $value;
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<$value, D::Error> {
                d.deserialize_any(self)
            }
        }
    };
}

#[derive(Clone, Copy)]
struct TensorSeed(Caps);

record_visitor!(
    TensorSeed,
    RawTensor,
    &["name", "shape", "dtype", "placements"],
    |this, out, map, i| {
        let caps = this.0;
        match i {
            0 => out.name = map.next_value_seed(NameSeed)?,
            1 => {
                out.shape = Some(map.next_value_seed(ListOf {
                    cap: caps.dims,
                    item: Num { min: 0 },
                })?)
            }
            2 => out.dtype = map.next_value_seed(Small)?,
            _ => {
                out.placements = Some(map.next_value_seed(ListOf {
                    cap: caps.placements,
                    item: Some_(PlacementSeed(caps)),
                })?)
            }
        }
    }
);

#[derive(Clone, Copy)]
struct PlacementSeed(Caps);

record_visitor!(
    PlacementSeed,
    RawPlacement,
    &["stage", "mesh", "dims", "optimizer_shard", "rows"],
    |this, out, map, i| {
        let caps = this.0;
        match i {
            0 => out.stage = map.next_value_seed(Small)?,
            1 => out.mesh = Some(map.next_value_seed(MeshSeed(caps))?),
            2 => {
                out.dims = Some(map.next_value_seed(ListOf {
                    cap: caps.dims,
                    item: Small,
                })?)
            }
            3 => out.optimizer_shard = map.next_value_seed(Small)?,
            _ => {
                out.rows = Some(map.next_value_seed(ListOf {
                    cap: caps.ranks,
                    item: Num { min: 1 },
                })?)
            }
        }
    }
);

#[derive(Clone, Copy)]
struct MeshSeed(Caps);

record_visitor!(
    MeshSeed,
    RawMesh,
    &["axes", "rank_list", "rank_range"],
    |this, out, map, i| {
        let caps = this.0;
        match i {
            0 => {
                out.axes = Some(map.next_value_seed(ListOf {
                    cap: caps.axes,
                    item: Small,
                })?)
            }
            1 => {
                out.rank_list = Some(map.next_value_seed(ListOf {
                    cap: caps.ranks,
                    item: Num { min: 0 },
                })?)
            }
            _ => out.rank_range = map.next_value_seed(Small)?,
        }
    }
);

#[derive(Clone, Copy)]
struct OpSeed(Caps);

record_visitor!(
    OpSeed,
    RawOp,
    &["name", "stage", "in_strategy", "out_strategy"],
    |this, out, map, i| {
        let caps = this.0;
        let tuples = ListOf {
            cap: caps.tuples,
            item: Tuple { cap: caps.dims },
        };
        match i {
            0 => out.name = map.next_value_seed(NameSeed)?,
            1 => out.stage = map.next_value_seed(Small)?,
            2 => out.in_strategy = Some(map.next_value_seed(tuples)?),
            _ => out.out_strategy = Some(map.next_value_seed(tuples)?),
        }
    }
);

/// A seed whose every value counts as of the kind wanted (for [`ListOf`]).
#[derive(Clone, Copy)]
struct Some_<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Some_<S> {
    type Value = Option<S::Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<S::Value>, D::Error> {
        self.0.deserialize(d).map(Some)
    }
}

/// One `"ops"` entry, checked as soon as it is read: the raw entry (its lists as written) is
/// dropped at once, so the entries cost what their records do. An entry that breaks a rule
/// reads as `None` (which [`ListOf`] takes for an item of another kind, keeping no more), and
/// the first one's index and rule go to `first_error`.
#[derive(Clone, Copy)]
struct OpsSeed<'a> {
    caps: Caps,
    check: OpCheck,
    /// Entries read so far, and the first rule broken.
    state: &'a RefCell<(usize, Option<(usize, String)>)>,
}

impl<'de> DeserializeSeed<'de> for OpsSeed<'_> {
    type Value = Option<OpStrategyRecord>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<OpStrategyRecord>, D::Error> {
        let raw = OpSeed(self.caps).deserialize(d)?;
        let mut state = self.state.borrow_mut();
        let i = state.0;
        state.0 += 1;
        if state.1.is_some() {
            return Ok(None);
        }
        match (self.check)(&raw) {
            Ok(record) => Ok(Some(record)),
            Err(rule) => {
                state.1 = Some((i, rule));
                Ok(None)
            }
        }
    }
}

/// The top-level object.
struct TopVisitor<'a, 'b> {
    caps: Caps,
    check_op: OpCheck,
    sink: &'a mut Sink<'b>,
    failed: &'a mut Option<CkptError>,
}

const TOP_KEYS: &[&str] = &["version", "tensors", "ops"];

impl<'de> Visitor<'de> for TopVisitor<'_, '_> {
    type Value = RawTop;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Tessera strategy object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawTop, A::Error> {
        let mut out = RawTop::default();
        let mut version = None;
        let mut seen = Seen::new();
        while let Some(key) = map.next_key_seed(KeySeed(TOP_KEYS))? {
            seen.first::<A::Error>(&key, TOP_KEYS)?;
            match key {
                Key::Known(0) => version = map.next_value_seed(Small)?,
                Key::Known(1) => {
                    out.tensors = Some(map.next_value_seed(TensorsSeed {
                        caps: self.caps,
                        version: version.as_ref(),
                        sink: &mut *self.sink,
                        failed: &mut *self.failed,
                    })?)
                }
                Key::Known(_) => {
                    let state = RefCell::new((0, None));
                    out.ops = Some(map.next_value_seed(ListOf {
                        cap: self.caps.ops,
                        item: OpsSeed {
                            caps: self.caps,
                            check: self.check_op,
                            state: &state,
                        },
                    })?);
                    out.op_error = state.into_inner().1;
                }
                Key::Other(_) => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        out.version = version;
        Ok(out)
    }
}

/// `"tensors"`: each entry goes to the sink as soon as it is read (`true`: a list).
struct TensorsSeed<'a, 'b> {
    caps: Caps,
    version: Option<&'a Json>,
    sink: &'a mut Sink<'b>,
    failed: &'a mut Option<CkptError>,
}

impl<'de> DeserializeSeed<'de> for TensorsSeed<'_, '_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TensorsSeed<'_, '_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of tensors")
    }
    other_kinds!(bool, false);
    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<bool, A::Error> {
        drain_map(map).map(|()| false)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let mut i = 0;
        while let Some(tensor) = seq.next_element_seed(TensorSeed(self.caps))? {
            if let Err(e) = (self.sink)(self.version, i, tensor) {
                *self.failed = Some(e);
                return Err(de::Error::custom("refused by the strategy checks"));
            }
            i += 1;
        }
        Ok(true)
    }
}
