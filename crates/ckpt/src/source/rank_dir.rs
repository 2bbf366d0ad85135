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

use crate::error::{io_err, CkptError, Result};
use crate::format::Format;

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
        RankFiles::discover_with_suffix(root, None)
    }

    /// [`RankFiles::discover`], taking in each rank directory only the safetensors files whose
    /// names end in `<file_suffix>.safetensors` (MindSpore's `unified_safetensors(…,
    /// file_suffix=…)`): a rank directory without one is an error, and among several the one
    /// MindSpore would pick (MindSpore 2.10's `_find_most_matching_file`).
    pub fn discover_with_suffix(root: &Path, file_suffix: Option<&str>) -> Result<RankFiles> {
        let entries = std::fs::read_dir(root).map_err(io_err(root, "list directory"))?;
        let mut files = BTreeMap::new();
        // Rank → the name of the directory its file came from.
        let mut dirs: BTreeMap<usize, String> = BTreeMap::new();
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
            let Some((fmt, file)) = pick_file(&dir, file_suffix)? else {
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
            let dir_name = name.to_string_lossy().into_owned();
            if let Some(other) = dirs.insert(rank, dir_name.clone()) {
                let (first, second) = match other < dir_name {
                    true => (other, dir_name),
                    false => (dir_name, other),
                };
                return Err(CkptError::DuplicateRankDir {
                    path: root.to_path_buf(),
                    rank,
                    first,
                    second,
                });
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
fn pick_file(dir: &Path, file_suffix: Option<&str>) -> Result<Option<(Format, PathBuf)>> {
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
    if let Some(suffix) = file_suffix {
        if let (false, Some(first)) = (st.is_empty(), ckpt.first()) {
            return Err(CkptError::MixedFormats {
                path: dir.to_path_buf(),
                detail: format!("{} and {}", first.display(), st[0].display()),
            });
        }
        let ending = format!("{suffix}.safetensors");
        let candidates: Vec<PathBuf> = st
            .into_iter()
            .filter(|p| file_name(p).ends_with(&ending))
            .collect();
        return pick_by_suffix(dir, candidates, suffix).map(|p| Some((Format::Safetensors, p)));
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

fn file_name(p: &Path) -> &str {
    p.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// `<task>-<epoch>_<step>` (digits).
fn is_task_epoch_step(s: &str) -> bool {
    s.split_once('-').is_some_and(|(task, rest)| {
        is_number(task)
            && rest
                .split_once('_')
                .is_some_and(|(e, st)| is_number(e) && is_number(st))
    })
}

/// `<epoch>_<step>` (digits).
fn is_epoch_step(s: &str) -> bool {
    s.split_once('_')
        .is_some_and(|(e, st)| is_number(e) && is_number(st))
}

/// The file of one rank directory among the safetensors `candidates` whose names end in
/// `<suffix>.safetensors`, as MindSpore 2.10's `_find_most_matching_file` picks it: one
/// candidate is taken; among several, a suffix naming a step (`_<task>-<epoch>_<step>`,
/// `-<epoch>_<step>`, `_<step>`, the separator optional) is completed with its separator and
/// matched again (`…rank_<task>-…` excluded for the first form), and the shortest name wins.
/// No candidate, or no single winner, is an error naming the directory and the suffix.
pub(crate) fn pick_by_suffix(
    dir: &Path,
    candidates: Vec<PathBuf>,
    suffix: &str,
) -> Result<PathBuf> {
    let names = || {
        candidates
            .iter()
            .map(|p| file_name(p).to_string())
            .collect::<Vec<_>>()
    };
    let err = |reason: String| CkptError::FileSuffix {
        path: dir.to_path_buf(),
        suffix: suffix.to_string(),
        reason,
    };
    match candidates.len() {
        0 => return Err(err("no safetensors file ends with it".to_string())),
        1 => return Ok(candidates.into_iter().next().expect("one")),
        _ => {}
    }
    let bare = suffix.strip_prefix(['_', '-']).unwrap_or(suffix);
    let (completed, exclude_rank) = if is_task_epoch_step(bare) && !suffix.starts_with('-') {
        (format!("_{bare}"), true)
    } else if is_epoch_step(bare) && !suffix.starts_with('_') {
        (format!("-{bare}"), false)
    } else if is_number(bare) && !suffix.starts_with('-') {
        (format!("_{bare}"), false)
    } else {
        return Err(err(format!(
            "several files end with it ({:?}) and it names no step to tell them apart",
            names()
        )));
    };
    let ending = format!("{completed}.safetensors");
    let rank_ending = format!("rank{ending}");
    let matched: Vec<&PathBuf> = candidates
        .iter()
        .filter(|p| {
            let n = file_name(p);
            n.ends_with(&ending) && !(exclude_rank && n.ends_with(&rank_ending))
        })
        .collect();
    let Some(shortest) = matched.iter().map(|p| file_name(p).len()).min() else {
        return Err(err(format!(
            "several files end with it ({:?}) but none ends with {ending:?}",
            names()
        )));
    };
    let winners: Vec<&&PathBuf> = matched
        .iter()
        .filter(|p| file_name(p).len() == shortest)
        .collect();
    match winners.as_slice() {
        [one] => Ok((**one).clone()),
        _ => Err(err(format!(
            "several files end with {ending:?} and more than one is shortest ({:?})",
            winners.iter().map(|p| file_name(p)).collect::<Vec<_>>()
        ))),
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
    fn suffix_picks_as_mindspore() {
        let dir = Path::new("d");
        let p = |names: &[&str]| names.iter().map(PathBuf::from).collect::<Vec<_>>();
        let pick = |names: &[&str], suffix: &str| {
            pick_by_suffix(dir, p(names), suffix).map(|f| f.display().to_string())
        };
        assert_eq!(
            pick(&["net-1_10.safetensors"], "1_10").unwrap(),
            "net-1_10.safetensors"
        );
        // A step suffix completed with its separator: "_10" does not match "net-110".
        assert_eq!(
            pick(&["net-1_10.safetensors", "net-1_110.safetensors"], "10").unwrap(),
            "net-1_10.safetensors"
        );
        assert_eq!(
            pick(&["a-2_10.safetensors", "bb-2_10.safetensors"], "2_10").unwrap(),
            "a-2_10.safetensors"
        );
        assert!(pick(&["a-2_10.safetensors", "b-2_10.safetensors"], "2_10").is_err());
        assert!(pick(&[], "x")
            .unwrap_err()
            .to_string()
            .contains("no safetensors file"));
        assert!(pick(&["ax.safetensors", "bx.safetensors"], "x").is_err());
        // `_<task>-<epoch>_<step>`: names ending in rank_<task>-… are not taken.
        assert_eq!(
            pick(
                &["rank_0-1_2.safetensors", "net_0-1_2.safetensors"],
                "0-1_2"
            )
            .unwrap(),
            "net_0-1_2.safetensors"
        );
    }

    /// `rank_0/` and `rank_00/` each holding a checkpoint are refused, naming both; an empty
    /// `rank_00/` beside them is passed over as before.
    #[test]
    fn two_directories_of_one_rank_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let put = |dir: &str, file: Option<&str>| {
            let d = root.path().join(dir);
            std::fs::create_dir(&d).unwrap();
            if let Some(file) = file {
                std::fs::write(d.join(file), b"x").unwrap();
            }
        };
        put("rank_0", Some("net.ckpt"));
        put("rank_1", Some("net.ckpt"));
        put("rank_01", None);
        let found = RankFiles::discover(root.path()).unwrap();
        assert_eq!(found.files.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
        put("rank_00", Some("other.ckpt"));
        let err = RankFiles::discover(root.path()).unwrap_err().to_string();
        for part in ["rank_0/", "rank_00/", "rank 0", "keep one"] {
            assert!(err.contains(part), "{err}");
        }
    }

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
