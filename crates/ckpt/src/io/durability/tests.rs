//! `fsync: false` writes the same bytes, issues no fsync at all, and is as atomic as ever.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use layout::Layout;
use tensor::Tensor;

use super::probe;
use crate::{ConvertOptions, Durability, Format, MergeOptions, Progress};

/// Rows of the split tensor `w`: divisible by every rank count used.
const ROWS: usize = 16;

/// A strategy over `n` ranks (`w` [ROWS, 3] split by rows, `b` [5] replicated) as bound
/// layouts, and written to `dir/<n>.json`.
fn strategy(dir: &Path, n: usize) -> (layout::TensorLayout, layout::TensorLayout) {
    let mesh = layout::Mesh::new(&[n], &["dp"], None).unwrap();
    let bind = |dims: Vec<Vec<usize>>, shape: &[usize]| {
        Layout::from_mesh(mesh.clone(), dims)
            .unwrap()
            .bind(shape)
            .unwrap()
    };
    let split = bind(vec![vec![0], vec![]], &[ROWS, 3]);
    let whole = bind(vec![vec![]], &[5]);
    let param =
        |name: &str, shape: Vec<usize>, layout: &layout::TensorLayout| crate::ResolvedParam {
            name: name.into(),
            shape,
            dtype: Some(tensor::DType::F32),
            placements: vec![crate::ParamLayout::new(0, layout.clone(), 1).unwrap()],
        };
    let resolved = crate::ResolvedStrategy::new(vec![
        param("w", vec![ROWS, 3], &split),
        param("b", vec![5], &whole),
    ])
    .unwrap();
    let path = dir.join(format!("{n}.json"));
    crate::save_param_strategy_file(&path, &resolved, &[], crate::StrategyFlavour::Tessera, true)
        .unwrap();
    (split, whole)
}

/// A checkpoint of 4 ranks in `dir/src` under `strategy(dir, 4)`, with one tensor outside
/// the strategy; also writes the strategy `dir/2.json`.
fn checkpoint(dir: &Path) -> PathBuf {
    strategy(dir, 2);
    let (split, _) = strategy(dir, 4);
    let w = Tensor::from_vec(&[ROWS, 3], (0..ROWS * 3).map(|x| x as f32).collect()).unwrap();
    let b = Tensor::from_vec(&[5], vec![0.5f32; 5]).unwrap();
    let step = Tensor::from_vec(&[1], vec![7f32]).unwrap();
    for r in 0..4 {
        let part = w.extract_box(&split.rank_box(r).unwrap()).unwrap();
        let tensors = [("w", &part), ("b", &b), ("step", &step)];
        crate::save_rank_checkpoint(&dir.join("src"), r, &tensors, false).unwrap();
    }
    dir.join("4.json")
}

/// Every file under `dir` by relative path, with the set id `id` blanked out (it differs
/// between two writes of the same set and nothing else may).
fn files(dir: &Path, id: &str) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, at: &Path, id: &[u8], out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for entry in std::fs::read_dir(at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, id, out);
                continue;
            }
            let mut bytes = std::fs::read(&path).unwrap();
            let mut i = 0;
            while i + id.len() <= bytes.len() {
                if &bytes[i..i + id.len()] == id {
                    bytes[i..i + id.len()].fill(b'#');
                    i += id.len();
                } else {
                    i += 1;
                }
            }
            out.insert(path.strip_prefix(root).unwrap().to_path_buf(), bytes);
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, id.as_bytes(), &mut out);
    out
}

fn set_id(dir: &Path) -> String {
    crate::SetMarker::read(dir).unwrap().expect("a set").id
}

/// Converts the 4-rank checkpoint in `dir` to 2 ranks in `dst` as `format`; the fsyncs issued
/// under `dir`.
fn convert(dir: &Path, dst: &str, format: Format, fsync: bool) -> usize {
    let watch = probe::watch(dir);
    let opts = ConvertOptions {
        format: Some(format),
        fsync,
        ..ConvertOptions::default()
    };
    crate::convert_checkpoints(
        &dir.join("src"),
        &dir.join("4.json"),
        &dir.join(dst),
        Some(&dir.join("2.json")),
        &opts,
    )
    .unwrap();
    watch.count()
}

#[test]
fn a_conversion_without_fsync_writes_the_same_files_and_never_syncs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    checkpoint(dir);
    for format in [Format::Safetensors, Format::Ckpt] {
        let ext = format.extension();
        let synced = convert(dir, &format!("on_{ext}"), format, true);
        let buffered = convert(dir, &format!("off_{ext}"), format, false);
        assert!(synced > 0, "{format:?}: a durable conversion fsyncs");
        assert_eq!(buffered, 0, "{format:?}: fsync: false issues no fsync");
        let (on, off) = (
            dir.join(format!("on_{ext}")),
            dir.join(format!("off_{ext}")),
        );
        let (on_files, off_files) = (files(&on, &set_id(&on)), files(&off, &set_id(&off)));
        // Two rank files, the destination strategy (written with the set's durability too)
        // and the marker.
        assert_eq!(on_files.len(), 4, "{:?}", on_files.keys());
        assert_eq!(on_files, off_files, "{format:?}");
        crate::check_set(&off).unwrap().expect("a committed set");
    }
}

#[test]
fn merge_dedup_and_segmented_writes_without_fsync_never_sync() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let strategy = checkpoint(dir);
    let src = dir.join("src");
    for fsync in [true, false] {
        let watch = probe::watch(dir);
        let opts = MergeOptions {
            fsync,
            ..MergeOptions::default()
        };
        crate::unified_safetensors(&src, &strategy, &dir.join(format!("merged_{fsync}")), &opts)
            .unwrap();
        let durability = Durability::from_fsync(fsync);
        crate::dedup_checkpoints(
            &src,
            &strategy,
            &dir.join(format!("dedup_{fsync}")),
            false,
            durability,
            &crate::NoProgress,
        )
        .unwrap();
        let entries = crate::load_segmented_checkpoints(&src.join("rank_0")).unwrap();
        let out = dir.join(format!("segmented_{fsync}.safetensors"));
        crate::write_segmented(&entries, &out, false, durability, &crate::NoProgress).unwrap();
        assert_eq!(watch.count() > 0, fsync, "fsync: {fsync}");
    }
}

/// Panics when the `n`-th file of a write is finished.
struct PanicAt(usize, std::cell::Cell<usize>);

impl Progress for PanicAt {
    fn file_done(&self, path: &Path) {
        self.1.set(self.1.get() + 1);
        if self.1.get() == self.0 {
            panic!("injected failure after {}", path.display());
        }
    }
}

#[test]
fn a_conversion_failing_midway_without_fsync_leaves_the_old_set_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    checkpoint(dir);
    // The old set: the source itself converted 4 → 4.
    let dst = dir.join("dst");
    let opts = ConvertOptions {
        fsync: false,
        ..ConvertOptions::default()
    };
    let (src, s4) = (dir.join("src"), dir.join("4.json"));
    crate::convert_checkpoints(&src, &s4, &dst, Some(&s4), &opts).unwrap();
    let old_id = set_id(&dst);
    let old = files(&dst, &old_id);
    // Safetensors output is written two files at a time, `.ckpt` output one at a time.
    for (format, at) in [Format::Ckpt, Format::Safetensors]
        .into_iter()
        .flat_map(|f| (1..=4).map(move |at| (f, at)))
    {
        let progress = PanicAt(at, std::cell::Cell::new(0));
        let opts = ConvertOptions {
            fsync: false,
            force: true,
            format: Some(format),
            progress: &progress,
            ..ConvertOptions::default()
        };
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::convert_checkpoints(&src, &s4, &dst, Some(&s4), &opts)
        }));
        assert!(
            run.is_err(),
            "{format:?}: the failure was injected at file {at}"
        );
        // The destination still holds the old set, whole; nothing is left beside it.
        assert_eq!(set_id(&dst), old_id);
        assert_eq!(files(&dst, &old_id), old);
        crate::check_set(&dst).unwrap().expect("a committed set");
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["2.json", "4.json", "dst", "src"]);
    }
}
