//! The set marker `tessera_set.json`: the commit record of a checkpoint set.
//!
//! ```json
//! {
//!   "format": "tessera-checkpoint-set",
//!   "version": 1,
//!   "id": "5f3a…",
//!   "tool": "ckpt convert",
//!   "ranks": [0, 1, 2, 3],
//!   "entries": ["rank_0", "rank_1", "rank_2", "rank_3", "strategy.json"],
//!   "files": [{"path": "rank_0/checkpoint_0.safetensors", "bytes": 4096}, …]
//! }
//! ```
//!
//! `entries` are the top-level names the set owns (everything else in the directory is not the
//! set's and is never removed by a writer); `files` every file of the set with its size;
//! `ranks` the numbers of its `rank_<N>/` folders. Safetensors files of the set carry the id
//! in their metadata (`"tessera_set"`), so a file from another set is caught even when its size
//! matches.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{io_err, CkptError, Result};

/// The marker's file name inside a set directory.
pub const SET_MARKER: &str = "tessera_set.json";
/// The `format` value of a marker.
const FORMAT: &str = "tessera-checkpoint-set";
/// The largest marker read (a million files fit in well under this).
const MAX_MARKER_BYTES: u64 = 256 << 20;
/// The safetensors metadata key that holds a file's set id.
pub const SET_ID_KEY: &str = "tessera_set";

/// One file of a set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetFile {
    /// Path relative to the set directory, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// CRC-32 of the contents, for the set's small top-level files other than safetensors
    /// (the model description, the training state, a small strategy: at most
    /// [`CHECKSUMMED_BYTES`]), whose size alone does not tell an edited or swapped copy from the
    /// set's own. Absent for rank files and safetensors files (which carry the set id), and in
    /// markers written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32: Option<u32>,
}

/// The largest top-level file of a set whose CRC-32 its marker records.
pub const CHECKSUMMED_BYTES: u64 = 1 << 20;

/// The CRC-32 of the file at `path`.
pub(crate) fn file_crc32(path: &Path) -> Result<u32> {
    let bytes = std::fs::read(path).map_err(io_err(path, "read"))?;
    Ok(crc32fast::hash(&bytes))
}

/// A parsed `tessera_set.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetMarker {
    /// Always `"tessera-checkpoint-set"`.
    pub format: String,
    /// Format version (1).
    pub version: u32,
    /// The set's id, also stored in each of its safetensors files.
    pub id: String,
    /// The operation that wrote the set (`"train"`, `"ckpt convert"`, …).
    pub tool: String,
    /// The numbers of the set's `rank_<N>/` folders.
    pub ranks: Vec<usize>,
    /// The top-level names the set owns.
    pub entries: Vec<String>,
    /// Every file of the set.
    pub files: Vec<SetFile>,
}

impl SetMarker {
    /// A marker for the files found under `dir` (a staging directory).
    pub(crate) fn describe(dir: &Path, id: &str, tool: &str) -> Result<SetMarker> {
        let mut entries = Vec::new();
        let mut ranks = Vec::new();
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io_err(dir, "list directory"))? {
            let entry = entry.map_err(io_err(dir, "list directory"))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == SET_MARKER || name == super::STAGING_SENTINEL {
                continue;
            }
            if let Some(rank) = super::rank_of_entry(&name) {
                ranks.push(rank);
            }
            collect_files(&entry.path(), &name, &mut files)?;
            entries.push(name);
        }
        entries.sort();
        ranks.sort_unstable();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(SetMarker {
            format: FORMAT.to_string(),
            version: 1,
            id: id.to_string(),
            tool: tool.to_string(),
            ranks,
            entries,
            files,
        })
    }

    /// The marker as pretty JSON.
    pub(crate) fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("a marker serialises");
        text.push('\n');
        text
    }

    /// Reads `dir/tessera_set.json`; `None` when there is none.
    pub fn read(dir: &Path) -> Result<Option<SetMarker>> {
        let path = dir.join(SET_MARKER);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(&path, "stat")(e)),
        };
        let bad = |reason: String| CkptError::InvalidSet {
            path: path.clone(),
            reason,
        };
        if !meta.is_file() {
            return Err(bad("the set marker is not a regular file".to_string()));
        }
        if meta.len() > MAX_MARKER_BYTES {
            return Err(bad(format!(
                "the set marker is {} bytes, over the {MAX_MARKER_BYTES}-byte limit",
                meta.len()
            )));
        }
        let text = layout::limits::read_text_bounded(&path, MAX_MARKER_BYTES)
            .map_err(io_err(&path, "read"))?;
        let marker: SetMarker = serde_json::from_str(&text)
            .map_err(|e| bad(format!("not a valid set marker ({e})")))?;
        if marker.format != FORMAT || marker.version != 1 {
            return Err(bad(format!(
                "format {:?} version {} is not {FORMAT:?} version 1",
                marker.format, marker.version
            )));
        }
        for f in &marker.files {
            if !is_inside(&f.path) {
                return Err(bad(format!(
                    "file {:?} does not stay inside the set directory",
                    f.path
                )));
            }
        }
        for e in &marker.entries {
            if !is_inside(e) || e.contains('/') {
                return Err(bad(format!("entry {e:?} is not a name in the directory")));
            }
        }
        Ok(Some(marker))
    }

    /// Where `file` lives under `dir`.
    pub fn file_path(dir: &Path, file: &SetFile) -> PathBuf {
        dir.join(&file.path)
    }
}

/// Whether a `/`-separated relative path stays inside its directory.
fn is_inside(rel: &str) -> bool {
    let path = Path::new(rel);
    !rel.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)))
}

fn collect_files(path: &Path, rel: &str, out: &mut Vec<SetFile>) -> Result<()> {
    let meta = std::fs::symlink_metadata(path).map_err(io_err(path, "stat"))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).map_err(io_err(path, "list directory"))? {
            let entry = entry.map_err(io_err(path, "list directory"))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            collect_files(&entry.path(), &format!("{rel}/{name}"), out)?;
        }
    } else {
        // Safetensors files carry the set id, which already tells them apart.
        let side_file = !rel.contains('/') && !rel.ends_with(".safetensors");
        let crc32 = match side_file && meta.len() <= CHECKSUMMED_BYTES {
            true => Some(file_crc32(path)?),
            false => None,
        };
        out.push(SetFile {
            path: rel.to_string(),
            bytes: meta.len(),
            crc32,
        });
    }
    Ok(())
}
