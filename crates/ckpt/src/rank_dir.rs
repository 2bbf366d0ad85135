//! Per-rank checkpoint directories: `DIR/rank_<N>/` with one checkpoint file each, resolved the
//! way MindSpore resolves them.
//!
//! - The rank number comes from the directory name; other entries are ignored.
//! - With several `.ckpt` files the lexicographically last is used; with several
//!   `.safetensors` files, the one whose last two numbers in the name are largest (then the
//!   lexicographically last). Temporary files (`*.tmp`) are ignored.
//! - `.ckpt` and `.safetensors` may not be mixed, in one directory or across ranks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::ckpt_file::Format;
use crate::error::{io_err, CkptError, Result};

/// The checkpoint file of every rank found under a directory.
#[derive(Debug, Clone)]
pub struct RankFiles {
    /// The directory holding `rank_<N>/`.
    pub root: PathBuf,
    /// The format all files share.
    pub format: Format,
    /// Rank → its checkpoint file.
    pub files: BTreeMap<usize, PathBuf>,
}

impl RankFiles {
    /// Finds `root/rank_<N>/<file>` for every rank.
    pub fn discover(root: &Path) -> Result<RankFiles> {
        let entries = std::fs::read_dir(root).map_err(io_err(root, "list directory"))?;
        let mut files = BTreeMap::new();
        let mut format: Option<(Format, PathBuf)> = None;
        for entry in entries {
            let entry = entry.map_err(io_err(root, "list directory"))?;
            let name = entry.file_name();
            let Some(rank) = name
                .to_str()
                .and_then(|n| n.strip_prefix("rank_"))
                .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            let dir = entry.path();
            if !dir.is_dir() {
                continue;
            }
            let Some((fmt, file)) = pick_file(&dir)? else {
                continue;
            };
            match &format {
                None => format = Some((fmt, file.clone())),
                Some((f, first)) if *f != fmt => {
                    return Err(CkptError::MixedFormats {
                        path: root.to_path_buf(),
                        detail: format!("{} and {}", first.display(), file.display()),
                    })
                }
                _ => {}
            }
            files.insert(rank, file);
        }
        let Some((format, _)) = format else {
            return Err(CkptError::NoRankDirs {
                path: root.to_path_buf(),
            });
        };
        Ok(RankFiles {
            root: root.to_path_buf(),
            format,
            files,
        })
    }

    /// The file of `rank`, or [`CkptError::MissingRank`].
    pub fn file(&self, rank: usize) -> Result<&Path> {
        self.files
            .get(&rank)
            .map(PathBuf::as_path)
            .ok_or(CkptError::MissingRank {
                path: self.root.clone(),
                rank,
            })
    }
}

/// The checkpoint file MindSpore would pick in one rank directory.
fn pick_file(dir: &Path) -> Result<Option<(Format, PathBuf)>> {
    let mut ckpt = Vec::new();
    let mut st = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err(dir, "list directory"))? {
        let path = entry.map_err(io_err(dir, "list directory"))?.path();
        if !path.is_file() {
            continue;
        }
        match Format::from_path(&path) {
            Some(Format::Ckpt) => ckpt.push(path),
            Some(Format::Safetensors) => st.push(path),
            None => {}
        }
    }
    match (ckpt.is_empty(), st.is_empty()) {
        (true, true) => Ok(None),
        (false, false) => Err(CkptError::MixedFormats {
            path: dir.to_path_buf(),
            detail: format!("{} and {}", ckpt[0].display(), st[0].display()),
        }),
        (false, true) => {
            ckpt.sort();
            Ok(ckpt.pop().map(|p| (Format::Ckpt, p)))
        }
        (true, false) => {
            st.sort_by(|a, b| last_two_numbers(a).cmp(&last_two_numbers(b)).then(a.cmp(b)));
            Ok(st.pop().map(|p| (Format::Safetensors, p)))
        }
    }
}

/// The last two runs of digits in a file name (missing ones count as 0), e.g.
/// `net-10_32.safetensors` → `(10, 32)`.
fn last_two_numbers(path: &Path) -> (u128, u128) {
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let numbers: Vec<u128> = name
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap_or(u128::MAX))
        .collect();
    match numbers.as_slice() {
        [] => (0, 0),
        [a] => (0, *a),
        [.., a, b] => (*a, *b),
    }
}

/// `dir/rank_<rank>/<prefix><rank>.<ext>`: the path of a converted rank's file.
pub fn rank_file_path(dir: &Path, rank: usize, prefix: &str, format: Format) -> PathBuf {
    dir.join(format!("rank_{rank}"))
        .join(format!("{prefix}{rank}.{}", format.extension()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_names() {
        assert_eq!(
            last_two_numbers(Path::new("net-10_32.safetensors")),
            (10, 32)
        );
        assert_eq!(last_two_numbers(Path::new("net_7.safetensors")), (0, 7));
        assert_eq!(last_two_numbers(Path::new("net.safetensors")), (0, 0));
    }
}
