//! MindSpore options beyond the plain conversions, on the reference cases: encrypted `.ckpt`
//! files (`dec_key` / `dec_mode`), `unified_safetensors`' `file_suffix`, `choice_func` and
//! `split_dst_file`, `load_distributed_checkpoint` with a layout dict and with `name_map`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ckpt::{
    CheckpointFile, CipherMode, ConvertOptions, Decryption, LayoutList, MergeOptions, ParamChoice,
    Strategy,
};

use crate::util::{assert_same_tensors, case, read_all, tmp};

fn case1() -> PathBuf {
    case("case1_dp2mp4_to_2x2").expect("fixtures are part of the repository")
}

fn src_files(c: &Path) -> BTreeMap<usize, PathBuf> {
    (0..8)
        .map(|r| (r, c.join(format!("src_ckpt/rank_{r}/checkpoint_{r}.ckpt"))))
        .collect()
}

fn assert_same(x: &[(String, tensor::Tensor)], y: &[(String, tensor::Tensor)], what: &str) {
    assert!(!x.is_empty(), "{what}: nothing loaded");
    assert_eq!(x.len(), y.len(), "{what}");
    // Same tensors, in whatever order the strategies list them.
    let sorted = |v: &[(String, tensor::Tensor)]| {
        let mut v: Vec<(String, tensor::Tensor)> = v.to_vec();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let (x, y) = (sorted(x), sorted(y));
    for ((n1, t1), (n2, t2)) in x.iter().zip(&y) {
        assert_eq!(n1, n2, "{what}");
        assert_eq!(t1.shape(), t2.shape(), "{what}: {n1}");
        assert_eq!(t1.as_bytes(), t2.as_bytes(), "{what}: {n1}");
    }
}

#[test]
fn encrypted_ckpt_reads_back_the_same_tensors_in_every_mode() {
    let c = case1();
    let plain = c.join("full_ckpt/rank_0/full.ckpt");
    let dir = tmp();
    for (mode, key) in [
        (CipherMode::AesGcm, vec![5u8; 16]),
        (CipherMode::AesGcm, vec![6u8; 32]),
        (CipherMode::AesCbc, vec![7u8; 24]),
        (CipherMode::Sm4Cbc, vec![8u8; 16]),
    ] {
        let enc = dir.path().join(format!("{mode}-{}.ckpt", key.len()));
        ckpt::crypto::encrypt_file(&plain, &enc, &key, mode, false).unwrap();
        assert_ne!(std::fs::read(&enc).unwrap(), std::fs::read(&plain).unwrap());
        let dec = Decryption::new(&key, mode).unwrap();
        let f = CheckpointFile::open_with(&enc, Some(&dec)).unwrap();
        let g = CheckpointFile::open(&plain).unwrap();
        assert_eq!(f.tensors().len(), g.tensors().len());
        for t in g.tensors() {
            let (mut a, mut b) = (vec![0u8; t.n_bytes as usize], vec![0u8; t.n_bytes as usize]);
            g.read_bytes(t, 0, &mut a).unwrap();
            let ft = f.tensor(&t.name).unwrap();
            f.read_bytes(ft, 0, &mut b).unwrap();
            assert_eq!(a, b, "{mode}: {}", t.name);
        }
        // Without the key the file is refused, saying it is encrypted and with what.
        let err = CheckpointFile::open(&enc).unwrap_err().to_string();
        assert!(
            err.contains("encrypted") && err.contains(mode.name()),
            "{err}"
        );
        // A wrong key names the file.
        let wrong = Decryption::new(&vec![9u8; key.len()], mode).unwrap();
        let err = CheckpointFile::open_with(&enc, Some(&wrong))
            .unwrap_err()
            .to_string();
        assert!(err.contains(&enc.display().to_string()), "{err}");
    }
    // A key for a plain file is an error, not a silent plain read.
    let dec = Decryption::new(&[1u8; 16], CipherMode::AesGcm).unwrap();
    let err = CheckpointFile::open_with(&plain, Some(&dec))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not an encrypted"), "{err}");
}

#[test]
fn load_rank_from_encrypted_files_matches_the_plain_load() {
    let c = case1();
    let dir = tmp();
    let key = b"0123456789abcdef0123456789abcdef";
    let mut enc_files = BTreeMap::new();
    for (r, f) in src_files(&c) {
        let out = dir.path().join(format!("r{r}.ckpt"));
        ckpt::crypto::encrypt_file(&f, &out, key, CipherMode::AesCbc, false).unwrap();
        enc_files.insert(r, out);
    }
    let a = c.join("strategy/A.ckpt");
    let b = Strategy::load(&c.join("strategy/B.ckpt")).unwrap();
    let dec = Decryption::new(key, CipherMode::AesCbc).unwrap();
    for rank in 0..4 {
        let plain = ckpt::load_rank_from_files_with(&src_files(&c), Some(&a), Some(&b), rank, None)
            .unwrap();
        let got = ckpt::load_rank_from_files_with(&enc_files, Some(&a), Some(&b), rank, Some(&dec))
            .unwrap();
        assert_same(&plain, &got, &format!("rank {rank}"));
    }
    assert!(ckpt::load_rank_from_files_with(&enc_files, Some(&a), Some(&b), 0, None).is_err());
}

#[test]
fn layout_dict_is_the_strategy_file() {
    // MindSpore's own `_convert_to_list` output of B (recorded), as a layout dict.
    for name in ["case1_dp2mp4_to_2x2", "case3_opt_shard_to_4"] {
        let c = case(name).unwrap();
        let text = std::fs::read_to_string(c.join("expected/layout_list_B.json")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let ints = |v: &serde_json::Value| -> Vec<i64> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_i64().unwrap())
                .collect()
        };
        let items: Vec<(String, LayoutList)> = json
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k != "_fields")
            .map(|(k, v)| {
                (
                    k.clone(),
                    LayoutList {
                        dev_matrix: ints(&v[0]),
                        tensor_map: ints(&v[1]),
                        param_split_shape: ints(&v[2]),
                        field_size: v[3].as_i64().unwrap(),
                        opt_shard_step: v[4].as_i64().unwrap(),
                        opt_shard_size: v[5].as_i64().unwrap(),
                    },
                )
            })
            .collect();
        let dict = Strategy::from_layout_lists(Path::new("predict_strategy"), &items).unwrap();
        let file = Strategy::load(&c.join("strategy/B.ckpt")).unwrap();
        let unified = c.join("expected/unified_safetensors");
        let a = c.join("strategy/A.ckpt");
        let files: BTreeMap<usize, PathBuf> = (0..8)
            .map(|r| (r, c.join(format!("src_ckpt/rank_{r}/checkpoint_{r}.ckpt"))))
            .collect();
        for rank in file.resolve_scale_free().unwrap().ranks() {
            let x = ckpt::load_rank_from_unified_with(&unified, Some(&dict), rank).unwrap();
            let y = ckpt::load_rank_from_unified_with(&unified, Some(&file), rank).unwrap();
            assert_same(&x, &y, &format!("{name} rank {rank}"));
            let x =
                ckpt::load_rank_from_files_with(&files, Some(&a), Some(&dict), rank, None).unwrap();
            let y =
                ckpt::load_rank_from_files_with(&files, Some(&a), Some(&file), rank, None).unwrap();
            assert_same(&x, &y, &format!("{name} rank {rank}"));
        }
    }
    // A bad entry names the parameter.
    let bad = [(
        "w".to_string(),
        LayoutList {
            dev_matrix: vec![2, 0],
            tensor_map: vec![0],
            ..LayoutList::default()
        },
    )];
    let err = Strategy::from_layout_lists(Path::new("predict_strategy"), &bad).unwrap_err();
    assert!(err.to_string().contains("\"w\""), "{err}");
}

#[test]
fn name_map_renames_written_tensors() {
    let c = case1();
    let unified = c.join("expected/unified_safetensors");
    let b = Strategy::load(&c.join("strategy/B.ckpt")).unwrap();
    let plain = tmp();
    ckpt::load_distributed_checkpoint_with(&unified, Some(&b), plain.path(), &Default::default())
        .unwrap();
    let first = read_all(&plain.path().join("rank_0/net.safetensors"))[0]
        .0
        .clone();
    let map = BTreeMap::from([(first.clone(), "renamed.weight".to_string())]);
    let out = tmp();
    let opts = ConvertOptions {
        name_map: Some(&map),
        ..Default::default()
    };
    ckpt::load_distributed_checkpoint_with(&unified, Some(&b), out.path(), &opts).unwrap();
    for r in 0..4 {
        let f = format!("rank_{r}/net.safetensors");
        let ours: BTreeMap<_, _> = read_all(&out.path().join(&f)).into_iter().collect();
        let mut want: BTreeMap<_, _> = read_all(&plain.path().join(&f)).into_iter().collect();
        let moved = want.remove(&first).unwrap();
        want.insert("renamed.weight".to_string(), moved);
        assert_eq!(ours, want, "{f}");
    }
    // Renaming onto another tensor's name is refused before anything is written.
    let second = read_all(&plain.path().join("rank_0/net.safetensors"))[1]
        .0
        .clone();
    let clash = BTreeMap::from([(first, second)]);
    let opts = ConvertOptions {
        name_map: Some(&clash),
        ..Default::default()
    };
    let out = tmp();
    let err =
        ckpt::load_distributed_checkpoint_with(&unified, Some(&b), &out.path().join("x"), &opts)
            .unwrap_err();
    assert!(err.to_string().contains("after renaming"), "{err}");
    assert!(!out.path().join("x/rank_0").exists());
}

fn merge(src: &Path, dst: &Path, opts: &MergeOptions<'_>) -> ckpt::Result<ckpt::MergeReport> {
    ckpt::unified_safetensors(src, &case1().join("strategy/A.ckpt"), dst, opts)
}

#[test]
fn choice_func_drops_and_renames() {
    let c = case1();
    let base = tmp();
    merge(
        &c.join("src_safetensors"),
        base.path(),
        &MergeOptions::default(),
    )
    .unwrap();
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(base.path().join("param_name_map.json")).unwrap(),
    )
    .unwrap();
    let names: Vec<String> = index["weight_map"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert!(names.len() >= 2);
    let (drop, rename) = (names[0].clone(), names[1].clone());
    let choice = |n: &str| -> ckpt::Result<ParamChoice> {
        Ok(if n == drop {
            ParamChoice::Drop
        } else if n == rename {
            ParamChoice::Rename(format!("new.{n}"))
        } else {
            ParamChoice::Keep
        })
    };
    let out = tmp();
    let opts = MergeOptions {
        choice: Some(&choice),
        ..Default::default()
    };
    let report = merge(&c.join("src_safetensors"), out.path(), &opts).unwrap();
    assert!(report
        .skipped
        .iter()
        .any(|(n, why)| *n == drop && why.contains("choice_func")));
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("param_name_map.json")).unwrap(),
    )
    .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    assert!(!map.contains_key(&drop) && !map.contains_key(&rename));
    assert!(map.contains_key(&format!("new.{rename}")));
    // The renamed tensor holds the original's bytes, in the part file the index names.
    let part = out
        .path()
        .join(map[&format!("new.{rename}")].as_str().unwrap());
    let base_part = base.path().join(index_file(base.path(), &rename));
    let got: BTreeMap<_, _> = read_all(&part).into_iter().collect();
    let want: BTreeMap<_, _> = read_all(&base_part).into_iter().collect();
    assert_eq!(got[&format!("new.{rename}")], want[&rename]);
    assert!(!got.contains_key(&drop));
    // An error from the filter stops the merge.
    let failing = |_: &str| -> ckpt::Result<ParamChoice> {
        Err(ckpt::CkptError::ChoiceFunc {
            param: "w".to_string(),
            source: "no".into(),
        })
    };
    let opts = MergeOptions {
        choice: Some(&failing),
        ..Default::default()
    };
    assert!(merge(&c.join("src_safetensors"), &tmp().path().join("f"), &opts).is_err());
}

fn index_file(dir: &Path, name: &str) -> String {
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("param_name_map.json")).unwrap())
            .unwrap();
    index["weight_map"][name].as_str().unwrap().to_string()
}

#[test]
fn split_runs_together_write_the_whole_merge() {
    let c = case1();
    let whole = tmp();
    // Small parts so there are several to split.
    let opts = MergeOptions {
        max_part_bytes: 64,
        ..Default::default()
    };
    let report = merge(&c.join("src_safetensors"), whole.path(), &opts).unwrap();
    let n_parts = report.parts.len();
    assert!(n_parts >= 3, "{n_parts} parts");
    let out = tmp();
    let dst = out.path().join("split");
    for k in [2, 1, 3] {
        let opts = MergeOptions {
            max_part_bytes: 64,
            split: Some((k, 3)),
            ..Default::default()
        };
        let r = merge(&c.join("src_safetensors"), &dst, &opts).unwrap();
        let range = ckpt::split_range(n_parts, k, 3);
        let written: Vec<String> = r
            .parts
            .iter()
            .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        let want: Vec<String> = range.map(|i| format!("part{i}.safetensors")).collect();
        assert_eq!(written, want, "run {k}");
        // The index (and hyper-parameter file) come with run 1, whenever it runs.
        let run_1_done = k != 2;
        assert_eq!(
            dst.join("param_name_map.json").exists(),
            run_1_done,
            "run {k}"
        );
    }
    for (p, _) in &report.parts {
        let name = p.file_name().unwrap();
        assert_same_tensors(&dst.join(name), p, true);
    }
    assert_eq!(
        std::fs::read(dst.join("param_name_map.json")).unwrap(),
        std::fs::read(whole.path().join("param_name_map.json")).unwrap()
    );
    assert!(dst.join("hyper_param.safetensors").exists());
    // A second run of a part already written is refused without force.
    let opts = MergeOptions {
        max_part_bytes: 64,
        split: Some((2, 3)),
        ..Default::default()
    };
    assert!(merge(&c.join("src_safetensors"), &dst, &opts).is_err());
    // Bad (k, total).
    for split in [(0, 2), (3, 2), (1, 0)] {
        let opts = MergeOptions {
            split: Some(split),
            ..Default::default()
        };
        let err = merge(&c.join("src_safetensors"), &tmp().path().join("x"), &opts).unwrap_err();
        assert!(err.to_string().contains("split_dst_file"), "{err}");
    }
}

/// A split merge killed (SIGKILL) while writing a part leaves its hidden temporary file
/// (`.part0.safetensors.<pid>-<n>.tmp`, here with pids no process can have, up to a part's size); the next split run into that
/// directory removes it and says so, but keeps a live writer's (locked) temporary file and
/// every file that is not one of the merge's temporaries.
#[test]
fn a_split_run_removes_the_temporary_files_of_a_killed_run() {
    use std::os::fd::AsRawFd;
    let c = case1();
    let out = tmp();
    let dst = out.path().join("split");
    std::fs::create_dir(&dst).unwrap();
    let stale = [
        ".part0.safetensors.999999942-0.tmp",
        ".param_name_map.json.999999942-3.tmp",
    ];
    let kept = [
        ".part1.safetensors.999999943-1.tmp", // locked below: a live writer's
        ".notes.txt.999999942-0.tmp",
        ".part0.safetensors.tmp",
        "part0.safetensors.999999942-0.tmp",
    ];
    for name in stale.iter().chain(&kept) {
        std::fs::write(dst.join(name), b"half a part").unwrap();
    }
    let live = std::fs::File::open(dst.join(kept[0])).unwrap();
    // SAFETY: `live` is an open descriptor.
    assert_eq!(
        unsafe { libc::flock(live.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    let opts = MergeOptions {
        max_part_bytes: 64,
        split: Some((1, 1)),
        ..Default::default()
    };
    let report = merge(&c.join("src_safetensors"), &dst, &opts).unwrap();
    for name in stale {
        assert!(!dst.join(name).exists(), "{name} was left");
        assert!(
            report.warnings.iter().any(|w| w.contains(name)),
            "{:?}",
            report.warnings
        );
    }
    for name in kept {
        assert!(dst.join(name).exists(), "{name} was removed");
    }
    assert!(dst.join("part0.safetensors").exists());
    drop(live);
}

#[test]
fn file_suffix_picks_the_files_to_merge() {
    let c = case1();
    // A copy of the sources where each rank also holds a stale file of another step.
    let src = tmp();
    for r in 0..8 {
        let dir = src.path().join(format!("rank_{r}"));
        std::fs::create_dir_all(&dir).unwrap();
        let orig = c.join(format!(
            "src_safetensors/rank_{r}/checkpoint_{r}.safetensors"
        ));
        std::fs::copy(&orig, dir.join(format!("net_rank_{r}-1_10.safetensors"))).unwrap();
        // The stale file: rank 0's slices everywhere (so picking it changes the output).
        let stale = c.join("src_safetensors/rank_0/checkpoint_0.safetensors");
        std::fs::copy(&stale, dir.join(format!("net_rank_{r}-2_20.safetensors"))).unwrap();
    }
    let base = tmp();
    merge(
        &c.join("src_safetensors"),
        base.path(),
        &MergeOptions::default(),
    )
    .unwrap();
    let out = tmp();
    let opts = MergeOptions {
        file_suffix: Some("1_10"),
        ..Default::default()
    };
    merge(src.path(), out.path(), &opts).unwrap();
    assert_same_tensors(
        &out.path().join("part0.safetensors"),
        &base.path().join("part0.safetensors"),
        true,
    );
    // Without the suffix the newest step (the stale copies) is taken, and differs.
    let newest = tmp();
    merge(src.path(), newest.path(), &MergeOptions::default()).unwrap();
    assert_ne!(
        read_all(&newest.path().join("part0.safetensors")),
        read_all(&base.path().join("part0.safetensors"))
    );
    // A suffix no file has names the rank directory.
    let opts = MergeOptions {
        file_suffix: Some("9_99"),
        ..Default::default()
    };
    let err = merge(src.path(), &tmp().path().join("x"), &opts)
        .unwrap_err()
        .to_string();
    assert!(err.contains("rank_") && err.contains("9_99"), "{err}");
}

#[test]
fn an_unsharded_source_file_loads_like_the_sharded_ones() {
    let c = case1();
    let full = BTreeMap::from([(0usize, c.join("full_ckpt/rank_0/full.ckpt"))]);
    let a = c.join("strategy/A.ckpt");
    let b = Strategy::load(&c.join("strategy/B.ckpt")).unwrap();
    for rank in 0..4 {
        let sharded =
            ckpt::load_rank_from_files_with(&src_files(&c), Some(&a), Some(&b), rank, None)
                .unwrap();
        let unsharded = ckpt::load_rank_from_files_with(&full, None, Some(&b), rank, None).unwrap();
        let unsharded: Vec<_> = unsharded
            .into_iter()
            .filter(|(n, _)| sharded.iter().any(|(m, _)| m == n))
            .collect();
        assert_same(&sharded, &unsharded, &format!("rank {rank}"));
    }
    // Without a destination strategy every tensor comes whole, on rank 0 only.
    let whole = ckpt::load_rank_from_files_with(&src_files(&c), Some(&a), None, 0, None).unwrap();
    let want = ckpt::load_rank_from_files_with(&full, None, None, 0, None).unwrap();
    assert_same(&want, &whole, "whole");
    let err = ckpt::load_rank_from_files_with(&full, None, None, 1, None).unwrap_err();
    assert!(err.to_string().contains("rank 1"), "{err}");
    // An unsharded source is one file, as rank 0.
    let two = BTreeMap::from([(0usize, full[&0].clone()), (1, full[&0].clone())]);
    let err = ckpt::load_rank_from_files_with(&two, None, Some(&b), 0, None).unwrap_err();
    assert!(err.to_string().contains("unsharded"), "{err}");
}
