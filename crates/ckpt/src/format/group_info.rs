//! MindSpore group-info files (`ParallelGroupMap`): every communication group a rank created,
//! and `ckpt_restore_rank_list`, the ranks holding identical copies of all its parameters.

use std::path::{Path, PathBuf};

use super::codec::wire::{
    as_uint32, decode_dims, expect_bytes, expect_string, peek_field, Reader, WireError, WireValue,
    Writer,
};
use crate::error::{io_err, CkptError, Result};
use crate::io::atomic_write::write_file;

/// One communication group: its hashed name and its ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupItem {
    /// `"<size>-<hash>"`.
    pub group_name: String,
    /// The ranks.
    pub ranks: Vec<u32>,
}

/// A decoded `ParallelGroupMap`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupInfo {
    /// Every group created.
    pub groups: Vec<GroupItem>,
    /// `ckpt_restore_rank_list`, absent in a file that lacks the field.
    pub restore_rank_list: Option<Vec<u32>>,
}

impl GroupInfo {
    /// Decodes protobuf bytes.
    pub fn decode(path: &Path, bytes: &[u8]) -> Result<GroupInfo> {
        decode(bytes).map_err(|e| CkptError::Protobuf {
            path: path.to_path_buf(),
            offset: e.offset as u64,
            reason: e.reason,
        })
    }

    /// Reads a group-info file.
    pub fn read(path: &Path) -> Result<GroupInfo> {
        let bytes = layout::limits::read_bounded(path, layout::limits::MAX_STRATEGY_FILE_BYTES)
            .map_err(io_err(path, "read"))?;
        GroupInfo::decode(path, &bytes)
    }

    /// Encodes as MindSpore does (repeated ranks unpacked).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        for g in &self.groups {
            w.message(1, |w| {
                w.bytes(1, g.group_name.as_bytes());
                w.message(2, |w| g.ranks.iter().for_each(|&r| w.uint(1, u64::from(r))));
            });
        }
        if let Some(list) = &self.restore_rank_list {
            w.message(2, |w| list.iter().for_each(|&r| w.uint(1, u64::from(r))));
        }
        w.buf
    }

    /// Whether `bytes` hold only the fields of a group-info file (as a file a run may replace
    /// with its own).
    pub fn is_group_info(bytes: &[u8]) -> bool {
        has_only_group_info_fields(bytes).is_ok()
    }

    /// Writes the file atomically.
    pub fn write(&self, path: &Path, force: bool) -> Result<PathBuf> {
        write_file(path, &self.encode(), force)
    }
}

impl GroupInfo {
    /// The group-info file of a rank that created the communication groups `groups` (world
    /// ranks, each group ascending) and whose checkpoint the ranks `restore` can supply: the
    /// groups named as MindSpore names them ([`group_name`]), in ascending rank-list order,
    /// each once.
    pub fn for_rank(groups: &[Vec<usize>], restore: &[usize]) -> GroupInfo {
        let mut lists: Vec<Vec<u32>> = groups
            .iter()
            .map(|g| g.iter().map(|&r| r as u32).collect())
            .collect();
        lists.sort();
        lists.dedup();
        GroupInfo {
            groups: lists
                .into_iter()
                .map(|ranks| GroupItem {
                    group_name: group_name(&ranks),
                    ranks,
                })
                .collect(),
            restore_rank_list: Some(restore.iter().map(|&r| r as u32).collect()),
        }
    }
}

/// MindSpore's name of the communication group of `ranks`
/// (`DeviceManager::GenerateGroupNameByRanks`): `"<size>-<hash>"`, the hash being the C++
/// standard library's `std::hash<std::string>` of `"r0-r1-…"`, as MindSpore built with GCC
/// computes it (libstdc++'s `_Hash_bytes`, a 64-bit Murmur variant, seed `0xc70f6907`).
pub fn group_name(ranks: &[u32]) -> String {
    let key: Vec<String> = ranks.iter().map(u32::to_string).collect();
    let key = key.join("-");
    format!("{}-{}", ranks.len(), libstdcxx_hash(key.as_bytes()))
}

/// libstdc++'s `std::_Hash_bytes(ptr, len, 0xc70f6907)` on a 64-bit target.
fn libstdcxx_hash(bytes: &[u8]) -> u64 {
    const MUL: u64 = (0xc6a4_a793_u64 << 32) + 0x5bd1_e995;
    const SEED: u64 = 0xc70f_6907;
    let shift_mix = |v: u64| v ^ (v >> 47);
    let mut hash = SEED ^ (bytes.len() as u64).wrapping_mul(MUL);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let data = shift_mix(u64::from_le_bytes(word).wrapping_mul(MUL)).wrapping_mul(MUL);
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        let data = tail
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8).wrapping_add(u64::from(b)));
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    shift_mix(shift_mix(hash).wrapping_mul(MUL))
}

/// MindSpore's `restore_group_info_list`: the ranks that can supply this rank's checkpoint.
///
/// Unlike MindSpore 2.10, which returns `[]`, a file without `ckpt_restore_rank_list` is an
/// error ([`CkptError::MissingRestoreList`]), as MindSpore's documentation promises.
pub fn restore_group_info_list(path: &Path) -> Result<Vec<u32>> {
    GroupInfo::read(path)?
        .restore_rank_list
        .ok_or_else(|| CkptError::MissingRestoreList {
            path: path.to_path_buf(),
        })
}

fn decode(bytes: &[u8]) -> Result<GroupInfo, WireError> {
    let mut info = GroupInfo::default();
    let mut r = Reader::new(bytes);
    while let Some(f) = r.next_field() {
        let (field, value, at) = f?;
        match field {
            1 => {
                let mut item = GroupItem {
                    group_name: String::new(),
                    ranks: Vec::new(),
                };
                let mut g = Reader::nested(expect_bytes(value, at, "parallel_group_item")?, at);
                while let Some(f) = g.next_field() {
                    let (field, value, at) = f?;
                    match field {
                        1 => item.group_name = expect_string(value, at, "group_name")?,
                        2 => {
                            item.ranks =
                                ranks(expect_bytes(value, at, "parallel_group_ranks")?, at)?
                        }
                        _ => {}
                    }
                }
                info.groups.push(item);
            }
            2 => {
                info.restore_rank_list = Some(ranks(
                    expect_bytes(value, at, "ckpt_restore_rank_list")?,
                    at,
                )?)
            }
            _ => {}
        }
    }
    Ok(info)
}

/// Whether `bytes` hold only the fields a group-info file has (a `.ckpt` checkpoint is also
/// valid protobuf of a similar shape, so the lenient decoder alone would accept one): groups
/// with a printable name and rank lists with nothing but ranks.
pub(crate) fn has_only_group_info_fields(bytes: &[u8]) -> std::result::Result<(), String> {
    for (field, data, at) in length_delimited_fields(bytes, 0)? {
        match field {
            1 => {
                for (inner, value, at) in length_delimited_fields(data, at)? {
                    match inner {
                        1 if !value.is_empty() && value.iter().all(|b| b.is_ascii_graphic()) => {}
                        1 => return Err(format!("group name at byte {at} is not printable text")),
                        2 => check_ranks_only(value, at)?,
                        other => return Err(format!("unknown group field {other} at byte {at}")),
                    }
                }
            }
            2 => check_ranks_only(data, at)?,
            other => return Err(format!("unknown field {other} at byte {at}")),
        }
    }
    Ok(())
}

/// Whether `head`, the first bytes of a file, starts like a group-info file: every top-level
/// field it holds whole (at least one) is a group-info field, checked as
/// [`has_only_group_info_fields`] does. The evidence, or why not (for the detection step).
pub(crate) fn sniff(head: &[u8]) -> std::result::Result<String, String> {
    let mut whole = 0usize;
    while let Some(f) = head.get(whole..).and_then(peek_field) {
        if !f.complete {
            break;
        }
        whole += f.len as usize;
    }
    if whole == 0 {
        return Err(
            "not a MindSpore group-info file: it does not start with a whole ParallelGroupMap field"
                .to_string(),
        );
    }
    has_only_group_info_fields(&head[..whole])
        .map_err(|why| format!("not a MindSpore group-info file: {why}"))?;
    Ok(
        "protobuf with only ParallelGroupMap fields (parallel_group_item, ckpt_restore_rank_list)"
            .to_string(),
    )
}

/// A length-delimited field: its number, its bytes and its offset.
type Field<'a> = (u32, &'a [u8], usize);

/// Every field of a message, each of which must be length-delimited.
fn length_delimited_fields(
    bytes: &[u8],
    base: usize,
) -> std::result::Result<Vec<Field<'_>>, String> {
    let mut r = Reader::nested(bytes, base);
    let mut out = Vec::new();
    while let Some(f) = r.next_field() {
        let (field, value, at) = f.map_err(|e| e.reason)?;
        match value {
            WireValue::Bytes(b) => out.push((field, b, at)),
            _ => {
                return Err(format!(
                    "field {field} at byte {at} is not length-delimited"
                ))
            }
        }
    }
    Ok(out)
}

fn check_ranks_only(bytes: &[u8], base: usize) -> std::result::Result<(), String> {
    let mut r = Reader::nested(bytes, base);
    while let Some(f) = r.next_field() {
        let (field, _, at) = f.map_err(|e| e.reason)?;
        if field != 1 {
            return Err(format!("a rank list holds field {field} at byte {at}"));
        }
    }
    Ok(())
}

fn ranks(bytes: &[u8], at: usize) -> Result<Vec<u32>, WireError> {
    decode_dims(bytes, at)?
        .into_iter()
        .map(|v| as_uint32(v, at, "rank"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names libstdc++ 12 (g++ -O1, x86-64) gives these keys' `std::hash<std::string>`;
    /// `4-6301172352641561019` also names MindSpore's group of ranks 0–3 in the reference
    /// group-info file.
    #[test]
    fn group_names_match_libstdcxx() {
        assert_eq!(group_name(&[0, 1, 2, 3]), "4-6301172352641561019");
        assert_eq!(group_name(&[0, 4]), "2-16453000547691086251");
        // Keys of 8 bytes and more go through the word loop as well as the tail.
        let eight: Vec<u32> = (0..8).collect();
        assert_eq!(group_name(&eight), "8-12158923167718251343");
        let nine: Vec<u32> = (8..17).collect();
        assert_eq!(group_name(&nine), "9-15821168632925674071");
    }

    #[test]
    fn for_rank_round_trips_and_names_each_group_once() {
        let info = GroupInfo::for_rank(&[vec![0, 1, 2, 3], vec![0, 2], vec![0, 1, 2, 3]], &[0, 2]);
        assert_eq!(info.groups.len(), 2);
        assert_eq!(info.groups[0].ranks, vec![0, 1, 2, 3]);
        assert_eq!(info.groups[1].group_name, group_name(&[0, 2]));
        let decoded = GroupInfo::decode(Path::new("mem"), &info.encode()).unwrap();
        assert_eq!(decoded, info);
    }
}
