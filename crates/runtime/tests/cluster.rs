//! Cluster-facing training features (issue 19): group-info files, parameter broadcast and lazy
//! parameter initialisation.

use ckpt::{group_name, GroupInfo};

use crate::run_util::{adam_gpt, train_steps, DP2, DP2_MP2};

/// Trains `parallel` for 2 steps writing group-info files under `template`; returns every
/// rank's decoded file.
fn group_infos(parallel: &str, template: &str, devices: usize) -> Vec<GroupInfo> {
    let dir = tempfile::tempdir().unwrap();
    let key = format!("output.group_info_file=\"{template}\"");
    let config = adam_gpt(dir.path(), parallel, 2, &[&key]);
    train_steps(&config, 2);
    (0..devices)
        .map(|r| {
            let path = runtime::group_info_path(&config.output().dir, template, r);
            GroupInfo::read(&path).unwrap_or_else(|e| panic!("rank {r}'s file: {e}"))
        })
        .collect()
}

/// Pure data parallel: every rank can restore every other, and the gradient all-reduce group
/// of both ranks is named as MindSpore names it.
#[test]
fn group_info_under_data_parallel_lists_every_rank() {
    let infos = group_infos(DP2, "group_info.pb", 2);
    for info in &infos {
        assert_eq!(info.restore_rank_list, Some(vec![0, 1]));
        let all = info.groups.iter().find(|g| g.ranks == [0, 1]).expect("the dp group");
        assert_eq!(all.group_name, group_name(&[0, 1]));
    }
}

/// Model parallel splits the weights: only the ranks of the same model-parallel coordinate
/// (rank, rank + 2) hold this rank's shards, and each rank created both its data-parallel and
/// its model-parallel group.
#[test]
fn group_info_under_model_parallel_lists_the_replica_ranks() {
    let infos = group_infos(DP2_MP2, "gi/{rank}.pb", 4);
    for (rank, info) in infos.iter().enumerate() {
        let mp = (rank % 2) as u32;
        assert_eq!(info.restore_rank_list, Some(vec![mp, mp + 2]), "rank {rank}");
        let dp_group = vec![mp, mp + 2];
        let first = (rank as u32 / 2) * 2;
        let mp_group = vec![first, first + 1];
        for group in [dp_group, mp_group] {
            assert!(
                info.groups.iter().any(|g| g.ranks == group),
                "rank {rank} lacks group {group:?}: {:?}",
                info.groups
            );
        }
        for g in &info.groups {
            assert_eq!(g.group_name, group_name(&g.ranks));
        }
    }
}

/// Optimizer sharding over the whole data-parallel group leaves every rank the only holder of
/// its optimizer pieces.
#[test]
fn group_info_with_full_optimizer_sharding_lists_only_the_rank() {
    let parallel = format!("{DP2}[parallel.hsdp]\nthreshold = 0");
    let infos = group_infos(&parallel, "group_info.pb", 2);
    for (rank, info) in infos.iter().enumerate() {
        assert_eq!(info.restore_rank_list, Some(vec![rank as u32]));
    }
}

/// The file reads back through the strategy tool's reader (`restore_group_info_list`).
#[test]
fn group_info_reads_back_with_restore_group_info_list() {
    let dir = tempfile::tempdir().unwrap();
    let config = adam_gpt(
        dir.path(),
        DP2_MP2,
        1,
        &["output.group_info_file=\"group_info.pb\""],
    );
    train_steps(&config, 1);
    let path = dir.path().join("group_info_3.pb");
    assert_eq!(ckpt::restore_group_info_list(&path).unwrap(), vec![1, 3]);
}
