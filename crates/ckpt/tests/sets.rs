//! Checkpoint sets and the checks before a conversion: a destination appears whole or not at
//! all, readers refuse uncommitted and mixed sets, a strategy must match the checkpoint's rank
//! folders, a conversion never overwrites its source or writes outside its destination, and
//! `verify` reports every fault of every rank once.

use std::path::{Path, PathBuf};

use ckpt::{CkptError, ConvertOptions};
use layout::Layout;
use tensor::Tensor;

use crate::util::tmp;

/// A checkpoint of `n` ranks in `dir/src` holding `w` ([4n, 2], split over the ranks) and the
/// strategy file describing it; `base` shifts the values.
fn checkpoint(dir: &Path, name: &str, n: usize, base: f32) -> PathBuf {
    let mesh = layout::Mesh::new(&[n], &["dp"], None).unwrap();
    let rows = 4 * n;
    let mp = Layout::from_mesh(mesh, vec![vec![0], vec![]])
        .unwrap()
        .bind(&[rows, 2])
        .unwrap();
    let full =
        Tensor::from_vec(&[rows, 2], (0..rows * 2).map(|x| x as f32 + base).collect()).unwrap();
    for r in 0..n {
        let part = full.extract_box(&mp.rank_box(r).unwrap()).unwrap();
        ckpt::save_rank_checkpoint(&dir.join(name), r, &[("w", &part)], false).unwrap();
    }
    let strategy = ckpt::ResolvedStrategy::new(vec![ckpt::ResolvedParam {
        name: "w".into(),
        shape: vec![rows, 2],
        dtype: Some(tensor::DType::F32),
        placements: vec![ckpt::ParamLayout::new(0, mp, 1).unwrap()],
    }])
    .unwrap();
    let path = dir.join(format!("{name}.json"));
    ckpt::save_param_strategy_file(&path, &strategy, &[], ckpt::StrategyFlavour::Tessera, true)
        .unwrap();
    path
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn convert(src: &Path, s: &Path, dst: &Path, d: Option<&Path>, force: bool) -> ckpt::Result<()> {
    let opts = ConvertOptions {
        force,
        ..ConvertOptions::default()
    };
    ckpt::convert_checkpoints(src, s, dst, d, &opts).map(|_| ())
}

#[test]
fn a_strategy_for_fewer_ranks_than_the_folders_is_refused() {
    let dir = tmp();
    checkpoint(dir.path(), "src", 4, 0.0);
    let small = checkpoint(dir.path(), "small", 2, 0.0);
    let out = dir.path().join("out");
    let err = convert(&dir.path().join("src"), &small, &out, None, false).unwrap_err();
    match &err {
        CkptError::RankCountMismatch {
            extra,
            n_ranks,
            reason,
            ..
        } => {
            assert_eq!((extra.as_slice(), *n_ranks), (&[2, 3][..], 2));
            assert!(reason.contains("rank_2/ holds \"w\""), "{reason}");
        }
        other => panic!("expected RankCountMismatch, got {other}"),
    }
    assert!(err.to_string().contains("small.json"), "{err}");
    assert!(!out.exists());
    // verify names the extra folders too.
    let r = ckpt::verify_checkpoints(&dir.path().join("src"), &small, false).unwrap();
    let extra: Vec<_> = r
        .faults
        .iter()
        .filter(|f| f.rule.contains("an extra rank folder"))
        .collect();
    assert_eq!(extra.len(), 2, "{:?}", r.faults);
}

/// A checkpoint of 2 ranks holding `w` (and `global_step`, outside the strategy) with two more
/// rank folders holding `trailing` each: what a pipeline whose last stage saves no parameter
/// writes when `trailing` is the step counter. Returns the source and its strategy.
fn with_trailing_ranks(dir: &Path, trailing: &[(&str, Tensor)]) -> (PathBuf, PathBuf) {
    let strategy = checkpoint(dir, "src", 2, 0.0);
    let src = dir.join("src");
    let step = Tensor::from_vec(&[1], vec![10i32]).unwrap();
    for r in 0..2 {
        let file = ckpt::rank_file_path(&src, r, "checkpoint_", ckpt::Format::Safetensors);
        let w = ckpt::CheckpointFile::open(&file)
            .unwrap()
            .read_tensor("w")
            .unwrap();
        ckpt::save_rank_checkpoint(&src, r, &[("w", &w), ("global_step", &step)], true).unwrap();
    }
    for r in 2..4 {
        let pairs: Vec<(&str, &Tensor)> = trailing.iter().map(|(n, t)| (*n, t)).collect();
        ckpt::save_rank_checkpoint(&src, r, &pairs, false).unwrap();
    }
    (src, strategy)
}

/// Probe E2: rank folders past the strategy's ranks that hold only what their home rank holds
/// outside the strategy (the step counter of pipeline stages saving no parameter) are read
/// past by every reader; one holding a tensor its home rank lacks is refused, naming it.
#[test]
fn rank_folders_past_the_strategy_holding_only_its_extras_are_read() {
    let dir = tmp();
    let step = Tensor::from_vec(&[1], vec![10i32]).unwrap();
    let (src, strategy) = with_trailing_ranks(dir.path(), &[("global_step", step.clone())]);
    let out = dir.path().join("out");
    convert(&src, &strategy, &out, None, false).unwrap();
    let merged = ckpt::rank_file_path(&out, 0, "checkpoint_", ckpt::Format::Safetensors);
    let merged = ckpt::CheckpointFile::open(&merged).unwrap();
    assert_eq!(
        merged.read_tensor("w").unwrap().as_f32().unwrap(),
        (0..16).map(|x| x as f32).collect::<Vec<_>>()
    );
    let r = ckpt::verify_checkpoints(&src, &strategy, true).unwrap();
    assert!(r.faults.is_empty(), "{:?}", r.faults);
    let side = ckpt::DiffSide {
        dir: &src,
        strategy: &strategy,
    };
    assert!(ckpt::diff_checkpoints(&side, &side, &mut |_| {})
        .unwrap()
        .bitwise_equal());

    // A tensor outside the strategy that the home rank does not hold would be lost: refused.
    let dir = tmp();
    let (src, strategy) = with_trailing_ranks(
        dir.path(),
        &[("global_step", step.clone()), ("lost", step.clone())],
    );
    let out = dir.path().join("out");
    let err = convert(&src, &strategy, &out, None, false).unwrap_err();
    match &err {
        CkptError::RankCountMismatch { extra, reason, .. } => {
            assert_eq!(extra, &[2, 3]);
            assert!(reason.contains("rank_2/ holds \"lost\""), "{reason}");
        }
        other => panic!("expected RankCountMismatch, got {other}"),
    }
    assert!(!out.exists());
    let r = ckpt::verify_checkpoints(&src, &strategy, false).unwrap();
    let extra: Vec<_> = r
        .faults
        .iter()
        .filter(|f| f.rule.contains("an extra rank folder") && f.rule.contains("\"lost\""))
        .collect();
    assert_eq!(extra.len(), 2, "{:?}", r.faults);
}

/// Writes at `path`, in `flavour`, the strategy of the file `strategy` with a second parameter
/// `ghost` (laid out as the first) that no checkpoint file holds.
fn with_ghost(strategy: &Path, path: &Path, flavour: ckpt::StrategyFlavour) {
    let resolved = ckpt::Strategy::load(strategy)
        .unwrap()
        .resolve_scale_free()
        .unwrap();
    let mut params = resolved.params().to_vec();
    let mut ghost = params[0].clone();
    ghost.name = "ghost".into();
    params.push(ghost);
    let with_shapes = flavour == ckpt::StrategyFlavour::Tessera;
    let strategy = ckpt::ResolvedStrategy::new(params).unwrap();
    ckpt::save_param_strategy_file(path, &strategy, &[], flavour, with_shapes).unwrap();
}

#[test]
fn a_strategy_parameter_no_file_holds_needs_allow_missing() {
    let dir = tmp();
    let s = checkpoint(dir.path(), "src", 2, 0.0);
    // MindSpore's protobuf has no shapes: the ghost's shape comes from no file.
    let s2 = dir.path().join("s2.ckpt");
    with_ghost(&s, &s2, ckpt::StrategyFlavour::MsProtobuf);
    let out = dir.path().join("out");
    let err = convert(&dir.path().join("src"), &s2, &out, None, false).unwrap_err();
    assert!(
        matches!(&err, CkptError::TensorMissing { tensor, .. } if tensor == "ghost"),
        "{err}"
    );
    assert!(!out.exists());
    let opts = ConvertOptions {
        allow_missing: true,
        ..ConvertOptions::default()
    };
    let report =
        ckpt::convert_checkpoints(&dir.path().join("src"), &s2, &out, None, &opts).unwrap();
    assert_eq!(report.skipped.len(), 1);
}

/// A destination strategy listing a parameter the source checkpoint lacks (another model's
/// strategy) is refused, naming the parameter and the strategy, and nothing is written; with
/// `allow_missing` the parameter is reported as skipped.
#[test]
fn a_destination_parameter_the_source_lacks_needs_allow_missing() {
    let dir = tmp();
    let s = checkpoint(dir.path(), "src", 2, 0.0);
    let dst = dir.path().join("dst.json");
    with_ghost(&s, &dst, ckpt::StrategyFlavour::Tessera);
    let (src, out) = (dir.path().join("src"), dir.path().join("out"));
    let err = convert(&src, &s, &out, Some(&dst), false).unwrap_err();
    match &err {
        CkptError::TensorMissing { tensor, rule, .. } => {
            assert_eq!(tensor, "ghost");
            assert!(
                rule.contains("dst.json") && rule.contains("--allow-missing"),
                "{rule}"
            );
        }
        other => panic!("expected TensorMissing, got {other}"),
    }
    assert!(!out.exists());
    let opts = ConvertOptions {
        allow_missing: true,
        ..ConvertOptions::default()
    };
    let report = ckpt::convert_checkpoints(&src, &s, &out, Some(&dst), &opts).unwrap();
    assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
    assert_eq!(report.skipped[0].0, "ghost");
}

/// `dedup` binds its strategy to the files as a conversion does: a strategy for fewer ranks
/// than the checkpoint's folders is refused (the extra ranks' shards would be lost), and
/// nothing is written.
#[test]
fn dedup_refuses_a_strategy_for_fewer_ranks() {
    let dir = tmp();
    checkpoint(dir.path(), "src", 4, 0.0);
    let small = checkpoint(dir.path(), "small", 2, 0.0);
    let out = dir.path().join("out");
    let err = ckpt::dedup_checkpoints(
        &dir.path().join("src"),
        &small,
        &out,
        false,
        ckpt::Durability::OsBuffered,
        &ckpt::NoProgress,
    )
    .unwrap_err();
    assert!(matches!(err, CkptError::RankCountMismatch { .. }), "{err}");
    assert!(!out.exists());
}

/// Without a source strategy the source is unsharded: a checkpoint with several rank folders
/// is refused (rank 0's shard is not the whole tensor), and nothing is written.
#[test]
fn a_sharded_source_without_its_strategy_is_refused() {
    let dir = tmp();
    let s = checkpoint(dir.path(), "src", 2, 0.0);
    let out = dir.path().join("out");
    let err = ckpt::convert_unsharded(
        &dir.path().join("src"),
        &out,
        &s,
        &ConvertOptions::default(),
    )
    .unwrap_err();
    match &err {
        CkptError::UnshardedSource { ranks } => assert_eq!(ranks, &[0, 1]),
        other => panic!("expected UnshardedSource, got {other}"),
    }
    assert!(err.to_string().contains("--src-strategy"), "{err}");
    assert!(!out.exists());
}

#[test]
fn a_conversion_never_overwrites_its_source_or_leaves_its_destination() {
    let dir = tmp();
    let s = checkpoint(dir.path(), "src", 2, 0.0);
    let src = dir.path().join("src");
    let before = names(&src.join("rank_0"));
    for dst in [src.clone(), src.join("rank_5"), dir.path().to_path_buf()] {
        let err = convert(&src, &s, &dst, None, true).unwrap_err();
        assert!(matches!(err, CkptError::UnsafeDestination { .. }), "{err}");
    }
    assert_eq!(names(&src.join("rank_0")), before);
    for prefix in ["../../x_", "a/b", ".."] {
        let opts = ConvertOptions {
            prefix,
            ..ConvertOptions::default()
        };
        let err =
            ckpt::convert_checkpoints(&src, &s, &dir.path().join("out"), None, &opts).unwrap_err();
        assert!(matches!(err, CkptError::UnsafeDestination { .. }), "{err}");
    }
    assert_eq!(names(dir.path()), vec!["src", "src.json"]);
}

/// A writer killed (SIGKILL) just after creating its staging directory, before the sentinel
/// existed, leaves the directory empty or holding only the sentinel's temporary file (what
/// `kill -9` of `tessera ckpt convert` left). The next conversion removes it: it never moves
/// that file into the destination (where every later set would carry it on as a foreign
/// entry), and never leaves the directory beside it.
#[test]
fn a_staging_directory_a_killed_writer_was_creating_is_removed() {
    let dir = tmp();
    let s = checkpoint(dir.path(), "src", 2, 0.0);
    let src = dir.path().join("src");
    let out = dir.path().join("out");
    convert(&src, &s, &out, None, false).unwrap();
    let before = names(&out);
    let killed = dir.path().join(".out.tessera-staging-00000000deadbeef");
    std::fs::create_dir(&killed).unwrap();
    std::fs::write(killed.join("..tessera-staging.4242-0.tmp"), b"").unwrap();
    convert(&src, &s, &out, None, true).unwrap();
    assert_eq!(names(&out), before);
    assert_eq!(names(dir.path()), vec!["out", "src", "src.json"]);
    // Killed before even the temporary file existed, with no destination yet.
    let fresh = dir.path().join("fresh");
    let killed = dir.path().join(".fresh.tessera-staging-00000000deadbeef");
    std::fs::create_dir(&killed).unwrap();
    convert(&src, &s, &fresh, None, false).unwrap();
    assert_eq!(names(&fresh), before);
    assert_eq!(names(dir.path()), vec!["fresh", "out", "src", "src.json"]);
}

/// A reader opens a set's files one by one; a writer that switches another set into the
/// directory meanwhile (same shapes, so same sizes, and `.ckpt` files carry no set id) must not
/// leave it reading the old set's rank 0 with the new set's rank 1.
#[test]
fn a_set_replaced_while_it_is_read_is_refused() {
    let dir = tmp();
    let s = checkpoint(dir.path(), "src", 2, 0.0);
    let s_other = checkpoint(dir.path(), "other", 2, 100.0);
    let a = dir.path().join("a");
    let to_ckpt = |src: &str, st: &Path, force: bool| {
        let opts = ConvertOptions {
            force,
            format: Some(ckpt::Format::Ckpt),
            ..ConvertOptions::default()
        };
        ckpt::convert_checkpoints(&dir.path().join(src), st, &a, Some(st), &opts).unwrap();
    };
    to_ckpt("src", &s, false);
    let sources = ckpt::SourceSet::rank_dirs(&a).unwrap();
    let rank0 = sources.rank_file(0).unwrap().unwrap();
    to_ckpt("other", &s_other, true);
    let err = sources.rank_file(1).unwrap_err();
    assert!(
        matches!(&err, CkptError::SetReplaced { path, removed: false } if path == &a),
        "{err}"
    );
    assert!(err.to_string().contains("replaced while it was being read"));
    // The file opened before the switch still reads the old set's values.
    assert_eq!(rank0.read_tensor("w").unwrap().as_f32().unwrap()[0], 0.0);
    // A reader that starts after the switch reads the new set whole.
    let fresh = ckpt::SourceSet::rank_dirs(&a).unwrap();
    for r in 0..2 {
        fresh.rank_file(r).unwrap().unwrap();
    }
}

/// `--src-strategy <set>/strategy.json`: a strategy inside the directory being read was
/// opened by path after the set's identity was taken, with no check, so a writer switching
/// another set in meanwhile gave the new set's strategy with the old set's rank files. It is
/// refused naming the set, as a rank file is; a strategy outside the set is read as before,
/// and one missing because its set went away says that the set was removed.
#[test]
fn a_strategy_inside_a_set_replaced_while_it_is_read_is_refused() {
    let dir = tmp();
    let s = checkpoint(dir.path(), "src", 2, 0.0);
    let s_other = checkpoint(dir.path(), "other", 2, 100.0);
    let a = dir.path().join("a");
    let into_a = |src: &str, st: &Path, force: bool| {
        let opts = ConvertOptions {
            force,
            format: Some(ckpt::Format::Ckpt),
            ..ConvertOptions::default()
        };
        ckpt::convert_checkpoints(&dir.path().join(src), st, &a, Some(st), &opts).unwrap();
    };
    into_a("src", &s, false);
    // The strategy lives in the set's directory (an entry no set lists: a writer carries it
    // into the set it switches in).
    let inside = a.join("strategy.json");
    std::fs::copy(&s, &inside).unwrap();
    let sources = ckpt::SourceSet::rank_dirs(&a).unwrap();
    sources.load_strategy(&inside).unwrap();
    into_a("other", &s_other, true);
    let err = sources.load_strategy(&inside).unwrap_err();
    assert!(
        matches!(&err, CkptError::SetReplaced { path, removed: false } if path == &a),
        "{err}"
    );
    // Outside the set: not the set's file, read as it is.
    sources.load_strategy(&s).unwrap();
    // A reader that starts after the switch reads the new set and its strategy.
    let fresh = ckpt::SourceSet::rank_dirs(&a).unwrap();
    fresh.load_strategy(&inside).unwrap();
    std::fs::rename(&a, dir.path().join("pruned")).unwrap();
    let err = fresh.load_strategy(&inside).unwrap_err();
    assert!(
        matches!(&err, CkptError::SetReplaced { path, removed: true } if path == &a),
        "{err}"
    );
}

/// A set removed while it is read (a periodic set pruned by `keep_checkpoint_max` under a
/// conversion reading it) failed with one rank file's "does not exist"; the error says the set
/// was removed.
#[test]
fn a_set_removed_while_it_is_read_is_named_as_removed() {
    let dir = tmp();
    let s = checkpoint(dir.path(), "src", 2, 0.0);
    let a = dir.path().join("a");
    convert(&dir.path().join("src"), &s, &a, Some(&s), false).unwrap();
    let sources = ckpt::SourceSet::rank_dirs(&a).unwrap();
    sources.rank_file(0).unwrap().unwrap();
    std::fs::rename(&a, dir.path().join("pruned")).unwrap();
    let err = sources.rank_file(1).unwrap_err();
    assert!(
        matches!(&err, CkptError::SetReplaced { path, removed: true } if path == &a),
        "{err}"
    );
    assert!(
        err.to_string().contains("removed while it was being read"),
        "{err}"
    );
}

#[test]
fn readers_refuse_mixed_and_uncommitted_sets() {
    let dir = tmp();
    let s = checkpoint(dir.path(), "src", 2, 0.0);
    let s_other = checkpoint(dir.path(), "other", 2, 100.0);
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    convert(&dir.path().join("src"), &s, &a, Some(&s), false).unwrap();
    convert(
        &dir.path().join("other"),
        &s_other,
        &b,
        Some(&s_other),
        false,
    )
    .unwrap();
    // The same shapes, so the same sizes: only the set id tells the files apart.
    let file = "rank_1/checkpoint_1.safetensors";
    std::fs::copy(b.join(file), a.join(file)).unwrap();
    let err = convert(&a, &s, &dir.path().join("c"), None, false).unwrap_err();
    assert!(matches!(err, CkptError::MixedSet { .. }), "{err}");
    let r = ckpt::verify_checkpoints(&a, &s, false).unwrap();
    assert!(
        r.faults.iter().any(|f| f.rule.contains("a mixed set")),
        "{:?}",
        r.faults
    );
    // A staging directory (an interrupted write) is refused by name and by its sentinel.
    let staging = dir.path().join(".c.tessera-staging-0123456789abcdef");
    std::fs::create_dir_all(staging.join("rank_0")).unwrap();
    std::fs::copy(
        a.join("rank_0/checkpoint_0.safetensors"),
        staging.join("rank_0/x.safetensors"),
    )
    .unwrap();
    let err = convert(&staging, &s, &dir.path().join("d"), None, false).unwrap_err();
    assert!(matches!(err, CkptError::UncommittedSet { .. }), "{err}");
}

#[test]
fn verify_reports_every_rank_fault_once() {
    let dir = tmp();
    let s = checkpoint(dir.path(), "src", 4, 0.0);
    let src = dir.path().join("src");
    for r in [1, 3] {
        let f = src.join(format!("rank_{r}/checkpoint_{r}.safetensors"));
        let bytes = std::fs::read(&f).unwrap();
        std::fs::write(&f, &bytes[..bytes.len() - 3]).unwrap();
    }
    let r = ckpt::verify_checkpoints(&src, &s, true).unwrap();
    // Both unreadable files, each once; the readable ranks are still checked.
    for rank in [1, 3] {
        let n = r
            .faults
            .iter()
            .filter(|f| {
                f.path
                    .ends_with(format!("rank_{rank}/checkpoint_{rank}.safetensors"))
            })
            .count();
        assert_eq!(n, 1, "{:?}", r.faults);
    }
    assert_eq!(r.n_params, 1);
    assert_eq!(r.n_slices, 2);
    let texts: Vec<String> = r.faults.iter().map(|f| f.to_string()).collect();
    let mut unique = texts.clone();
    unique.dedup();
    assert_eq!(texts, unique);
    // A missing rank folder is a fault of its own.
    std::fs::remove_dir_all(src.join("rank_2")).unwrap();
    let r = ckpt::verify_checkpoints(&src, &s, false).unwrap();
    assert!(
        r.faults
            .iter()
            .any(|f| f.rule.contains("rank_2/ holds no checkpoint file")),
        "{:?}",
        r.faults
    );
}

#[test]
fn a_wrong_safetensors_crc_num_stops_a_conversion() {
    let dir = tmp();
    let s = checkpoint(dir.path(), "src", 2, 0.0);
    // Rewrite rank 0's file with a crc_num in its metadata that does not match.
    let f = dir.path().join("src/rank_0/checkpoint_0.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header["__metadata__"]["crc_num"] = serde_json::Value::String("12345".into());
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(&f, out).unwrap();
    let err = convert(
        &dir.path().join("src"),
        &s,
        &dir.path().join("out"),
        None,
        false,
    )
    .unwrap_err();
    assert!(matches!(err, CkptError::CrcMismatch { .. }), "{err}");
    let r = ckpt::verify_checkpoints(&dir.path().join("src"), &s, false).unwrap();
    assert!(
        r.faults.iter().any(|x| x.rule.contains("CRC32")),
        "{:?}",
        r.faults
    );
}

/// A set as training commits it at `dir/name`: `w` ([8, 2], split over 2 ranks) and the
/// side files given (`model.json`, `train_state.json`); with the strategy file `s.json`
/// describing it (written once, beside the sets).
fn trained_set(dir: &Path, name: &str, sides: &[(&str, &[u8])]) -> (PathBuf, PathBuf) {
    let mesh = layout::Mesh::new(&[2], &["dp"], None).unwrap();
    let split = Layout::from_mesh(mesh, vec![vec![0], vec![]])
        .unwrap()
        .bind(&[8, 2])
        .unwrap();
    let full = Tensor::from_vec(&[8, 2], (0..16).map(|x| x as f32).collect()).unwrap();
    let strategy = ckpt::ResolvedStrategy::new(vec![ckpt::ResolvedParam {
        name: "w".into(),
        shape: vec![8, 2],
        dtype: Some(tensor::DType::F32),
        placements: vec![ckpt::ParamLayout::new(0, split.clone(), 1).unwrap()],
    }])
    .unwrap();
    let s = dir.join("s.json");
    ckpt::save_param_strategy_file(&s, &strategy, &[], ckpt::StrategyFlavour::Tessera, true)
        .unwrap();
    let src = dir.join(name);
    let set = ckpt::SetWriter::begin(&src, "train", false).unwrap();
    for r in 0..2 {
        let part = full.extract_box(&split.rank_box(r).unwrap()).unwrap();
        ckpt::save_rank_checkpoint_in_set(set.staging(), set.id(), r, &[("w", &part)]).unwrap();
    }
    for (file, bytes) in sides {
        ckpt::save_side_file(&set.staged(Path::new(file)), bytes, false).unwrap();
    }
    set.commit().unwrap();
    (src, s)
}

/// Whether the committed set at `dir` lists `file`, and its bytes when it does.
fn listed_side_file(dir: &Path, file: &str) -> Option<Vec<u8>> {
    let marker = ckpt::check_set(dir).unwrap().expect("a committed set");
    let listed = marker.files.iter().any(|f| f.path == file);
    assert_eq!(listed, dir.join(file).exists(), "{}: {file}", dir.display());
    listed.then(|| std::fs::read(dir.join(file)).unwrap())
}

#[test]
fn a_conversion_carries_the_set_s_model_and_training_state() {
    // `model.json` (the model's shape and tokenizer) and `train_state.json` (the training
    // loop's state) do not depend on the layout: a conversion, a merge and the merge sliced
    // again (`ckpt load`) hold them byte for byte, listed by their markers, so a run resumed
    // from the output continues the loop. The training state is never parsed here (these bytes
    // are not one; resume names the file). A set without them gets none.
    let dir = tmp();
    let description: &[u8] = b"{\"heads\": 2, \"hidden\": 8}\n";
    let state: &[u8] = b"{\"format\": \"tessera-train-state\", \"global_st";
    let sides = [("model.json", description), ("train_state.json", state)];
    for (name, with_sides) in [("trained", true), ("bare", false)] {
        let given: &[(&str, &[u8])] = if with_sides { &sides } else { &[] };
        let (src, s) = trained_set(dir.path(), name, given);
        let merged = dir.path().join(format!("{name}-merged"));
        convert(&src, &s, &merged, None, false).unwrap();
        let unified = dir.path().join(format!("{name}-unified"));
        ckpt::unified_safetensors(&src, &s, &unified, &ckpt::MergeOptions::default()).unwrap();
        let loaded = dir.path().join(format!("{name}-loaded"));
        ckpt::load_distributed_checkpoint(&unified, &s, &loaded, &ConvertOptions::default())
            .unwrap();
        for out in [&merged, &unified, &loaded] {
            for (file, bytes) in sides {
                let expected = with_sides.then(|| bytes.to_vec());
                assert_eq!(listed_side_file(out, file), expected, "{}", out.display());
            }
        }
        // Merged into rank 0, the set is read without a strategy (as unsharded); sliced for
        // one, it records it.
        assert_eq!(listed_side_file(&merged, "strategy.json"), None);
        assert!(listed_side_file(&loaded, "strategy.json").is_some());
    }
}

#[test]
fn a_conversion_for_a_destination_strategy_records_it_as_strategy_json() {
    // The destination strategy, given as MindSpore protobuf (no shapes, no dtypes), is written
    // into the output set as Tessera JSON under the name a resumed run reads, in either output
    // format: the set converted back under its own `strategy.json` gives the same tensor.
    let dir = tmp();
    let (src, s) = trained_set(dir.path(), "trained", &[("train_state.json", b"{}")]);
    let proto = dir.path().join("s.ckpt");
    let strategy = ckpt::Strategy::load(&s).unwrap();
    let source = ckpt::SourceSet::rank_dirs(&src).unwrap();
    let (resolved, _) = source.resolve_source(&strategy).unwrap();
    ckpt::save_param_strategy_file(
        &proto,
        &resolved,
        &[],
        ckpt::StrategyFlavour::MsProtobuf,
        true,
    )
    .unwrap();
    let whole = |dir: &Path, strategy: &Path| {
        let back = dir.with_extension("back");
        convert(dir, strategy, &back, None, true).unwrap();
        let file = ckpt::RankFiles::discover(&back).unwrap().files[&0].clone();
        ckpt::CheckpointFile::open(&file)
            .unwrap()
            .read_tensor("w")
            .unwrap()
    };
    let expected = whole(&src, &s);
    for format in [ckpt::Format::Safetensors, ckpt::Format::Ckpt] {
        let dst = dir.path().join(format!("sharded-{}", format.extension()));
        let opts = ConvertOptions {
            format: Some(format),
            ..ConvertOptions::default()
        };
        ckpt::convert_checkpoints(&src, &s, &dst, Some(&proto), &opts).unwrap();
        assert!(listed_side_file(&dst, "strategy.json").is_some());
        assert_eq!(
            listed_side_file(&dst, "train_state.json"),
            Some(b"{}".to_vec())
        );
        let written = ckpt::Strategy::load(&dst.join("strategy.json")).unwrap();
        assert_eq!(written.flavour, ckpt::StrategyFlavour::Tessera);
        assert_eq!(written.params[0].shape, Some(vec![8, 2]));
        assert_eq!(written.params[0].dtype, Some(tensor::DType::F32));
        assert_eq!(
            whole(&dst, &dst.join("strategy.json")),
            expected,
            "{format:?}"
        );
    }
}

#[test]
fn a_foreign_side_file_in_the_destination_is_never_replaced() {
    // The destination holds the user's own `strategy.json` (or `train_state.json`), which no
    // set there lists: a conversion that would write its own is refused, even with `force`,
    // naming the file, and the file is left as it was. One the destination's set lists (an
    // earlier conversion's) is that set's, replaced with the rest of it.
    let dir = tmp();
    let (src, s) = trained_set(dir.path(), "trained", &[("train_state.json", b"{}")]);
    for (file, dst_strategy) in [
        ("strategy.json", Some(s.as_path())),
        ("train_state.json", None),
    ] {
        let dst = dir.path().join(format!("out-{file}"));
        std::fs::create_dir(&dst).unwrap();
        std::fs::write(dst.join(file), b"mine").unwrap();
        let err = convert(&src, &s, &dst, dst_strategy, true).unwrap_err();
        assert!(
            matches!(&err, CkptError::UnsafeDestination { path, .. } if path.ends_with(file)),
            "{err}"
        );
        assert!(
            err.to_string().contains("no checkpoint set there lists it"),
            "{err}"
        );
        assert_eq!(std::fs::read(dst.join(file)).unwrap(), b"mine");
        assert_eq!(names(&dst), vec![file.to_string()]);
        assert_eq!(
            names(dir.path())
                .iter()
                .filter(|n| n.contains("staging"))
                .count(),
            0
        );
        std::fs::remove_file(dst.join(file)).unwrap();
        convert(&src, &s, &dst, dst_strategy, true).unwrap();
        convert(&src, &s, &dst, dst_strategy, true).unwrap();
        assert!(listed_side_file(&dst, file).is_some());
    }
}

#[test]
fn a_side_file_past_the_carry_bound_is_refused_before_anything_is_written() {
    // A `train_state.json` of more than 16 MiB is no training state: the conversion refuses
    // it, naming the file, and creates nothing.
    let dir = tmp();
    let huge = vec![b' '; (16 << 20) + 1];
    let (src, s) = trained_set(dir.path(), "trained", &[("train_state.json", &huge)]);
    let dst = dir.path().join("out");
    let err = convert(&src, &s, &dst, Some(&s), false).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&src.join("train_state.json").display().to_string())
            && text.contains("larger than"),
        "{text}"
    );
    assert!(!dst.exists());
}

#[test]
fn a_side_file_edited_to_the_same_size_is_not_the_set_s() {
    // The marker lists the set's small top-level files with their CRC-32: a `model.json`
    // edited in place (`"heads": 2` → `"heads": 4`) or copied from another run of the same size
    // is caught, where its size alone passed.
    let dir = tmp();
    let src = dir.path().join("set");
    let set = ckpt::SetWriter::begin(&src, "train", false).unwrap();
    let w = Tensor::from_vec(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    ckpt::save_rank_checkpoint_in_set(set.staging(), set.id(), 0, &[("w", &w)]).unwrap();
    ckpt::save_side_file(
        &set.staged(Path::new("model.json")),
        b"{\"heads\": 2}\n",
        false,
    )
    .unwrap();
    let marker = set.commit().unwrap();
    let listed = marker
        .files
        .iter()
        .find(|f| f.path == "model.json")
        .unwrap();
    assert!(listed.crc32.is_some(), "{listed:?}");
    ckpt::check_set(&src).unwrap();
    std::fs::write(src.join("model.json"), b"{\"heads\": 4}\n").unwrap();
    let err = ckpt::check_set(&src).unwrap_err();
    assert!(
        matches!(&err, CkptError::MixedSet { reason, .. }
            if reason.contains("model.json") && reason.contains("CRC-32")),
        "{err}"
    );
}
