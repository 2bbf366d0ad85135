//! `output.group_info_file` (MindSpore's `set_group_ckpt_save_file`): each rank writes a
//! group-info file (`ParallelGroupMap`) naming the communication groups it created and the
//! ranks that hold identical copies of everything it trains (`ckpt_restore_rank_list`), so
//! after a failure any of those ranks can supply its checkpoint.

use std::path::{Path, PathBuf};

use parallel::Program;

use crate::error::RuntimeError;

/// Where rank `rank` writes its group-info file for the configured `template`: `{rank}`
/// replaced by the rank; a template without `{rank}` gets `_<rank>` before its extension
/// (`group_info.pb` → `group_info_3.pb`). A relative result lies under the run directory
/// `out_dir` (never in its `rank_<N>/` folders, which belong to the checkpoint set).
pub fn group_info_path(out_dir: &Path, template: &str, rank: usize) -> PathBuf {
    let path = if template.contains("{rank}") {
        PathBuf::from(template.replace("{rank}", &rank.to_string()))
    } else {
        let given = Path::new(template);
        let stem = given
            .file_stem()
            .unwrap_or(given.as_os_str())
            .to_string_lossy();
        let name = match given.extension() {
            Some(ext) => format!("{stem}_{rank}.{}", ext.to_string_lossy()),
            None => format!("{stem}_{rank}"),
        };
        given.with_file_name(name)
    };
    out_dir.join(path)
}

/// MindSpore's `ckpt_restore_rank_list` of `rank`: the ranks holding the same box as `rank` of
/// every trainable parameter it holds — of its optimizer piece, when `hsdp` shards the
/// parameter's optimizer state — ascending. In pure data parallel that is every rank; a fully
/// sharded parameter leaves `rank` alone.
pub fn restore_ranks(program: &Program, rank: usize) -> Vec<usize> {
    let mut ranks: Option<Vec<usize>> = None;
    for p in program.params.iter().filter(|p| p.trainable) {
        let layout = p.optimizer_shard().map_or(&p.layout, |shard| &shard.layout);
        let Some(holders) = layout.replica_ranks(rank) else {
            continue;
        };
        ranks = Some(match ranks {
            None => holders,
            Some(so_far) => so_far
                .into_iter()
                .filter(|r| holders.binary_search(r).is_ok())
                .collect(),
        });
    }
    ranks.unwrap_or_else(|| vec![rank])
}

/// Writes `rank`'s group-info file to `path` (atomically, replacing an earlier run's): the
/// sub-groups `groups` it created and its restore list. A file already there that is not a
/// group-info file is refused, never replaced.
pub fn write_group_info(
    path: &Path,
    program: &Program,
    rank: usize,
    groups: &[Vec<usize>],
) -> Result<(), RuntimeError> {
    check_replaceable(path)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| RuntimeError::Io {
            path: dir.to_path_buf(),
            source: e,
        })?;
    }
    let info = ckpt::GroupInfo::for_rank(groups, &restore_ranks(program, rank));
    info.write(path, true)?;
    Ok(())
}

/// Nothing at `path`, or an earlier run's group-info file: what a run may write there.
pub fn check_replaceable(path: &Path) -> Result<(), RuntimeError> {
    if path.exists() && !is_group_info_file(path) {
        return Err(RuntimeError::Unusable {
            what: "output.group_info_file".to_string(),
            path: path.to_path_buf(),
            reason: "exists and is not a group-info file; refusing to replace it".to_string(),
        });
    }
    Ok(())
}

/// Whether `path` is a file holding a group-info message (an earlier run's).
fn is_group_info_file(path: &Path) -> bool {
    path.is_file()
        && layout::limits::read_bounded(path, layout::limits::MAX_STRATEGY_FILE_BYTES)
            .is_ok_and(|bytes| ckpt::GroupInfo::is_group_info(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_substitute_the_rank_or_use_rank_directories() {
        let out = Path::new("/run");
        assert_eq!(
            group_info_path(out, "groups/{rank}.pb", 3),
            Path::new("/run/groups/3.pb")
        );
        assert_eq!(
            group_info_path(out, "group_info.pb", 1),
            Path::new("/run/group_info_1.pb")
        );
        assert_eq!(
            group_info_path(out, "/abs/gi_{rank}.pb", 0),
            Path::new("/abs/gi_0.pb")
        );
        assert_eq!(group_info_path(out, "/abs/gi", 2), Path::new("/abs/gi_2"));
    }
}
