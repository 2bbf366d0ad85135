//! MindSpore group-info files (`ParallelGroupMap`): every communication group a rank created,
//! and `ckpt_restore_rank_list`, the ranks holding identical copies of all its parameters.

use std::path::{Path, PathBuf};

use crate::error::{io_err, CkptError, Result};
use crate::ms_strategy::decode_dims;
use crate::wire::{expect_bytes, expect_string, Reader, WireError, Writer};

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
        let bytes = std::fs::read(path).map_err(io_err(path, "read"))?;
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

    /// Writes the file atomically.
    pub fn write(&self, path: &Path, force: bool) -> Result<PathBuf> {
        crate::atomic_write::write_file(path, &self.encode(), force)
    }
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
            crate::wire::WireValue::Bytes(b) => out.push((field, b, at)),
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
        .map(|v| crate::wire::as_uint32(v, at, "rank"))
        .collect()
}
