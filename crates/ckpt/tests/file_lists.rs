//! Per-rank source files named one by one (MindSpore's `checkpoint_filenames` list and
//! `checkpoint_files_map`) checked against the ranks of the strategy they were saved under:
//! too few, too many, gaps and ranks past the devices are refused with the argument, the count
//! given and the count needed, for flat and pipeline strategies (merged, and one stage's file).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ckpt::Strategy;
use ckpt::{CkptError, ConvertOptions, MsLayoutItem, MsStrategyFile, MsStrategyItem};
use tensor::{DType, Tensor};

use crate::util::{case, ms_layout, tmp};

/// The 8 source rank files of case1 (dev [2,4]).
fn case1() -> PathBuf {
    case("case1_dp2mp4_to_2x2").expect("fixtures")
}

fn src_file(c: &Path, rank: usize) -> PathBuf {
    c.join(format!("src_ckpt/rank_{rank}/checkpoint_{rank}.ckpt"))
}

/// `checkpoint_filenames` as the Python package builds it: list position = rank.
fn list(c: &Path, ranks: impl Iterator<Item = usize>) -> BTreeMap<usize, PathBuf> {
    ranks
        .enumerate()
        .map(|(i, s)| (i, src_file(c, s)))
        .collect()
}

fn load(files: &BTreeMap<usize, PathBuf>, src: &Path) -> ckpt::Result<Vec<(String, Tensor)>> {
    ckpt::load_rank_from_files_with(files, Some(src), None, 0, None)
}

/// The rule text of a [`CkptError::RankFileList`] for `argument`, or a panic naming what came.
fn rank_file_rule<T>(result: ckpt::Result<T>, argument: &str) -> String {
    match result {
        Err(CkptError::RankFileList { argument: a, rule }) if a == argument => {
            let text = CkptError::RankFileList { argument: a, rule }.to_string();
            assert!(text.starts_with(argument), "{text}");
            text
        }
        Err(other) => panic!("expected a {argument} error, got {other:?}"),
        Ok(_) => panic!("expected a {argument} error, but it succeeded"),
    }
}

#[test]
fn checkpoint_filenames_must_hold_one_file_per_training_rank() {
    let c = case1();
    let a = c.join("strategy/A.ckpt");
    // All 8: loads.
    assert!(!load(&list(&c, 0..8), &a).unwrap().is_empty());
    // 6 of an 8-device training: MindSpore refuses any other length; so does Tessera.
    let text = rank_file_rule(load(&list(&c, 0..6), &a), "checkpoint_filenames");
    assert!(
        text.contains("6 files given")
            && text.contains("8 devices")
            && text.contains("exactly 8 needed"),
        "{text}"
    );
    assert!(text.contains("A.ckpt"), "names the strategy: {text}");
    // 1 file: about the list, not about rank folders.
    let text = rank_file_rule(load(&list(&c, 0..1), &a), "checkpoint_filenames");
    assert!(
        text.contains("1 file given")
            && text.contains("exactly 8")
            && !text.contains("holds no checkpoint file"),
        "{text}"
    );
    // 9: one too many (rank 0's file again at the end).
    let text = rank_file_rule(
        load(&list(&c, (0..8).chain([0])), &a),
        "checkpoint_filenames",
    );
    assert!(
        text.contains("9 files given") && text.contains("8 needed"),
        "{text}"
    );
    // Empty.
    let text = rank_file_rule(load(&BTreeMap::new(), &a), "checkpoint_filenames");
    assert!(text.contains("0 files given"), "{text}");
    // A map with a gap and a rank past the devices (8 files, but not ranks 0..8).
    let mut gappy = list(&c, 0..8);
    gappy.remove(&3);
    gappy.insert(9, src_file(&c, 3));
    let text = rank_file_rule(load(&gappy, &a), "checkpoint_filenames");
    assert!(
        text.contains("ranks [3] have no file") && text.contains("ranks [9] are past"),
        "{text}"
    );
}

#[test]
fn checkpoint_files_map_refuses_ranks_past_the_devices_and_names_missing_ones() {
    let c = case1();
    let (a, b) = (c.join("strategy/A.ckpt"), c.join("strategy/B.ckpt"));
    let out = tmp();
    let dst = out.path().join("out.ckpt");
    let convert = |files: &BTreeMap<usize, PathBuf>| {
        ckpt::convert_checkpoint_files(
            0,
            files,
            Some(&a),
            &dst,
            Some(&b),
            &ConvertOptions::default(),
        )
    };
    // Every rank plus a rank 8 the 8-device strategy has not: refused, nothing written.
    let mut files = list(&c, 0..8);
    files.insert(8, src_file(&c, 0));
    let text = rank_file_rule(convert(&files), "checkpoint_files_map");
    assert!(
        text.contains("9 files given") && text.contains("8 devices") && text.contains("[8]"),
        "{text}"
    );
    assert!(!dst.exists());
    // A rank the destination needs is absent: said in terms of the map, not of rank folders.
    let needed = ckpt::minimal_rank_list(
        &Strategy::load(&a).unwrap(),
        Some(&Strategy::load(&b).unwrap()),
        0,
    )
    .unwrap()
    .ranks;
    let mut files: BTreeMap<usize, PathBuf> =
        needed.iter().map(|&s| (s, src_file(&c, s))).collect();
    let gone = needed[needed.len() - 1];
    files.remove(&gone);
    let text = rank_file_rule(convert(&files), "checkpoint_files_map");
    assert!(
        text.contains(&format!("needs source rank {gone}, which has no file"))
            && !text.contains("holds no checkpoint file"),
        "{text}"
    );
    assert!(!dst.exists());
    // The needed ranks alone still convert.
    files.insert(gone, src_file(&c, gone));
    convert(&files).unwrap();
}

#[test]
fn an_unsharded_source_is_one_file() {
    let c = case1();
    let files = list(&c, 0..2);
    let text = rank_file_rule(
        ckpt::load_rank_from_files_with(&files, None, None, 0, None),
        "checkpoint_filenames",
    );
    assert!(
        text.contains("2 files given") && text.contains("exactly 1"),
        "{text}"
    );
}

/// One stage's MindSpore strategy file of a 2-stage × 4-device pipeline (dev [2,2] per stage).
fn stage_file(stage: u32) -> MsStrategyFile {
    MsStrategyFile {
        current_stage: 1,
        strategy_items: vec![MsStrategyItem {
            node_name: format!("Default/network-Net/stage{stage}/MatMul-op{stage}"),
            stage,
            strategies: vec![vec![2, 2]],
        }],
        layout_items: vec![MsLayoutItem {
            param_name: format!("s{stage}.w"),
            layout: ms_layout(&[2, 2], &[1, 0]),
        }],
    }
}

/// A 2-stage × 4-device checkpoint: the per-stage strategy files, the merged one and the eight
/// rank files (rank → file).
struct Pipeline {
    _dir: tempfile::TempDir,
    stage0: PathBuf,
    stage1: PathBuf,
    merged: PathBuf,
    files: BTreeMap<usize, PathBuf>,
}

/// The strategy file at `path` resolved with every parameter a global f32 `[8, 4]`.
fn resolve_8x4(path: &Path) -> (ckpt::ResolvedStrategy, Vec<String>) {
    Strategy::load(path)
        .unwrap()
        .resolve(|_, _| {
            Ok(Some(ckpt::ShapeHint {
                shape: vec![8, 4],
                is_global: true,
                dtype: Some(DType::F32),
                source: "the test".into(),
            }))
        })
        .unwrap()
}

fn pipeline() -> Pipeline {
    let dir = tmp();
    let stages = dir.path().join("stages");
    std::fs::create_dir_all(&stages).unwrap();
    let (stage0, stage1) = (stages.join("s0.ckpt"), stages.join("s1.ckpt"));
    std::fs::write(&stage0, stage_file(0).encode()).unwrap();
    std::fs::write(&stage1, stage_file(1).encode()).unwrap();
    let merged = dir.path().join("merged.ckpt");
    ckpt::merge_pipeline_strategies(&stages, &merged, false).unwrap();
    let (resolved, unknown) = resolve_8x4(&merged);
    assert!(unknown.is_empty());
    let src = dir.path().join("src");
    let mut files = BTreeMap::new();
    for rank in 0..8 {
        let mut tensors = Vec::new();
        for (i, p) in resolved.params().iter().enumerate() {
            if let Some((pl, slot)) = p.placement_of_rank(rank) {
                let full =
                    Tensor::from_vec(&p.shape, (0..32).map(|x| (i * 100 + x) as f32).collect())
                        .unwrap();
                tensors.push((
                    p.name.clone(),
                    full.extract_box(&pl.held.slot_box(slot)).unwrap(),
                ));
            }
        }
        let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        files.insert(
            rank,
            ckpt::save_rank_checkpoint(&src, rank, &refs, false).unwrap(),
        );
    }
    Pipeline {
        _dir: dir,
        stage0,
        stage1,
        merged,
        files,
    }
}

#[test]
fn pipeline_device_counts_merged_and_per_stage() {
    let p = pipeline();
    let first = |n: usize| -> BTreeMap<usize, PathBuf> {
        p.files.range(..n).map(|(r, f)| (*r, f.clone())).collect()
    };
    // Merged: every stage's ranks, 8 files; both stages' parameters come whole.
    let got = load(&p.files, &p.merged).unwrap();
    assert!(got.iter().any(|(n, _)| n == "s0.w") && got.iter().any(|(n, _)| n == "s1.w"));
    // Merged with one stage's 4 files: refused, counting both stages.
    let text = rank_file_rule(load(&first(4), &p.merged), "checkpoint_filenames");
    assert!(
        text.contains("4 files given")
            && text.contains("8 devices")
            && text.contains("2 pipeline stages"),
        "{text}"
    );
    // Stage 0's own file lists its 4 ranks: its 4 files load (MindSpore counts the same).
    let got = load(&first(4), &p.stage0).unwrap();
    assert!(got.iter().any(|(n, _)| n == "s0.w"));
    // Stage 0's file with all 8 files: too many, with the hint to merge the stages' files.
    let text = rank_file_rule(load(&p.files, &p.stage0), "checkpoint_filenames");
    assert!(
        text.contains("8 files given")
            && text.contains("4 devices")
            && text.contains("merge-stages"),
        "{text}"
    );
    // Stage 1's file alone cannot say how many devices came before it: refused, asking for
    // the merged file, whatever the list's length.
    for files in [first(4), p.files.clone()] {
        let err = load(&files, &p.stage1).unwrap_err();
        assert!(err.to_string().contains("merge-stages"), "{err}");
    }
}

#[test]
fn one_file_for_two_ranks_only_when_they_are_replicas() {
    let c = case1();
    let a = c.join("strategy/A.ckpt");
    // Rank 0's file given again as rank 1: rank 1 holds other slices, so loading would read
    // rank 0's shards as rank 1's. Refused, naming both ranks and the file.
    let dup = list(&c, [0, 0, 2, 3, 4, 5, 6, 7].into_iter());
    let text = rank_file_rule(load(&dup, &a), "checkpoint_filenames");
    assert!(
        text.contains("ranks 0 and 1 are given the same file") && text.contains("checkpoint_0"),
        "{text}"
    );
    // The same through another spelling of the path.
    let mut dup = list(&c, 0..8);
    let other = c.join("src_ckpt/rank_1/../rank_0/checkpoint_0.ckpt");
    dup.insert(1, other);
    rank_file_rule(load(&dup, &a), "checkpoint_filenames");
    // checkpoint_files_map alike.
    let out = tmp();
    let mut map = list(&c, 0..8);
    map.insert(5, src_file(&c, 4));
    let text = rank_file_rule(
        ckpt::convert_checkpoint_files(
            0,
            &map,
            Some(&a),
            &out.path().join("o.ckpt"),
            Some(&c.join("strategy/B.ckpt")),
            &ConvertOptions::default(),
        ),
        "checkpoint_files_map",
    );
    assert!(text.contains("ranks 4 and 5"), "{text}");

    // Pure data parallelism (dev [2], every parameter replicated): ranks 0 and 1 hold the same
    // data, so one file may serve both.
    let dir = tmp();
    let strategy = dir.path().join("dp.ckpt");
    let file = MsStrategyFile {
        current_stage: 1,
        strategy_items: vec![MsStrategyItem {
            node_name: "Default/network-Net/MatMul-op0".into(),
            stage: 0,
            strategies: vec![vec![1, 1]],
        }],
        layout_items: vec![MsLayoutItem {
            param_name: "w".into(),
            layout: ms_layout(&[2], &[-1, -1]),
        }],
    };
    std::fs::write(&strategy, file.encode()).unwrap();
    let w = Tensor::from_vec(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let f = ckpt::save_rank_checkpoint(&dir.path().join("src"), 0, &[("w", &w)], false).unwrap();
    let files: BTreeMap<usize, PathBuf> = [(0, f.clone()), (1, f)].into_iter().collect();
    let got = load(&files, &strategy).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1.as_bytes(), w.as_bytes());
}

/// `tessera ckpt convert --rank 1 --rank 1` (`ConvertOptions::ranks` listing a rank twice):
/// the rank is converted and reported once, not planned and written twice into one file.
#[test]
fn a_destination_rank_listed_twice_is_converted_once() {
    let c = case1();
    let out = tmp();
    let convert = |ranks: &[usize], dst: &str| {
        let opts = ConvertOptions {
            ranks: Some(ranks),
            ..ConvertOptions::default()
        };
        ckpt::convert_checkpoints(
            &c.join("src_ckpt"),
            &c.join("strategy/A.ckpt"),
            &out.path().join(dst),
            Some(&c.join("strategy/B.ckpt")),
            &opts,
        )
    };
    let report = convert(&[1, 1, 0, 1], "dst").unwrap();
    let done: Vec<usize> = report.ranks.iter().map(|r| r.rank).collect();
    assert_eq!(done, vec![1, 0]);
    // Still refused: a rank the destination has not.
    let err = convert(&[1, 9], "dst2").unwrap_err();
    assert!(
        err.to_string().contains("rank 9 is not a destination rank"),
        "{err}"
    );
}

/// A pipeline whose second stage saves no parameter (a GPT's loss stage): its strategy places
/// parameters on ranks 0..4 only, yet ranks 4..8 trained and saved their step counter. Their
/// files are ranks of the training and load; a parameter shard among them is refused.
#[test]
fn files_past_the_strategy_holding_only_the_step_counter_are_ranks_of_the_training() {
    let dir = tmp();
    let strategy = dir.path().join("stage0.ckpt");
    std::fs::write(&strategy, stage_file(0).encode()).unwrap();
    let (resolved, _) = resolve_8x4(&strategy);
    let p = &resolved.params()[0];
    let full = Tensor::from_vec(&[8, 4], (0..32).map(|x| x as f32).collect()).unwrap();
    let step = Tensor::from_vec(&[1], vec![7i32]).unwrap();
    let src = dir.path().join("src");
    let mut files = BTreeMap::new();
    for rank in 0..8 {
        let shard = p
            .placement_of_rank(rank)
            .map(|(pl, slot)| full.extract_box(&pl.held.slot_box(slot)).unwrap());
        let mut tensors: Vec<(&str, &Tensor)> = vec![("step", &step)];
        if let Some(t) = &shard {
            tensors.push(("s0.w", t));
        }
        files.insert(
            rank,
            ckpt::save_rank_checkpoint(&src, rank, &tensors, false).unwrap(),
        );
    }
    let got = load(&files, &strategy).unwrap();
    let (_, w) = got.iter().find(|(n, _)| n == "s0.w").unwrap();
    assert_eq!(w.as_bytes(), full.as_bytes());
    // Rank 5's file replaced by a shard: data the strategy does not account for.
    let mut shard_past = files.clone();
    shard_past.insert(5, files[&1].clone());
    let text = rank_file_rule(load(&shard_past, &strategy), "checkpoint_filenames");
    assert!(
        text.contains("8 files given")
            && text.contains("4 devices")
            && text.contains("ranks [5] are past")
            && text.contains("the file of rank 5"),
        "{text}"
    );
    // A step counter past the devices that the home rank's file lacks: refused too.
    let lonely = Tensor::from_vec(&[1], vec![1i32]).unwrap();
    let other = ckpt::save_rank_checkpoint(&dir.path().join("other"), 6, &[("lr", &lonely)], false)
        .unwrap();
    let mut extra = files.clone();
    extra.insert(6, other);
    let text = rank_file_rule(load(&extra, &strategy), "checkpoint_filenames");
    assert!(
        text.contains("ranks [6] are past") && text.contains("\"lr\""),
        "{text}"
    );
}
