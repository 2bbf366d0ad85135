//! A progress sink that asks to stop ([`Progress::stop_requested`]) ends every writing operation
//! with [`CkptError::Stopped`] before its commit: the sink hears no more of it, nothing the
//! operation created is left, and an existing destination is left as it was. Each operation is
//! stopped before its first chunk, after the first, halfway and after the last one (so only the
//! polls before the commit can catch it), on every writing path: `.ckpt` output (assembled and
//! written by a writer thread), safetensors output written from mapped pages on the calling
//! thread (`fsync: true`) and on two threads, a file each (`fsync: false`, on a machine with two
//! cores or more).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ckpt::{CkptError, ConvertOptions, Durability, Format, MergeOptions, NoProgress, Progress};
use layout::Layout;
use tensor::Tensor;

use crate::util::tmp;

/// Rows of `w`: divisible by every rank count used.
const ROWS: usize = 16;
/// One row of `w` (two `f32`): every chunk of a conversion is one row, so a file takes several.
const CHUNK: usize = 8;

/// Asks to stop once `after` advances, or `after_files` finished files, were reported;
/// records what it hears.
struct StopAfter {
    after: usize,
    after_files: usize,
    advances: Cell<usize>,
    files: Cell<usize>,
    finished: Cell<bool>,
}

impl StopAfter {
    fn new(after: usize) -> StopAfter {
        StopAfter {
            after,
            after_files: usize::MAX,
            advances: Cell::new(0),
            files: Cell::new(0),
            finished: Cell::new(false),
        }
    }

    fn after_files(files: usize) -> StopAfter {
        StopAfter {
            after_files: files,
            ..StopAfter::new(usize::MAX)
        }
    }
}

impl Progress for StopAfter {
    fn advance(&self, _bytes: u64) {
        self.advances.set(self.advances.get() + 1);
    }
    fn file_done(&self, _path: &Path) {
        self.files.set(self.files.get() + 1);
    }
    fn finish(&self) {
        self.finished.set(true);
    }
    fn stop_requested(&self) -> bool {
        self.advances.get() >= self.after || self.files.get() >= self.after_files
    }
}

/// Writes `dir/<n>.json`: `w` [ROWS, 2] split by rows over `n` ranks, `b` [5] replicated.
fn strategy(dir: &Path, n: usize) -> PathBuf {
    let mesh = layout::Mesh::new(&[n], &["dp"], None).unwrap();
    let bind = |dims: Vec<Vec<usize>>, shape: &[usize]| {
        Layout::from_mesh(mesh.clone(), dims)
            .unwrap()
            .bind(shape)
            .unwrap()
    };
    let param = |name: &str, layout: layout::TensorLayout, shape: Vec<usize>| ckpt::ResolvedParam {
        name: name.into(),
        shape,
        dtype: Some(tensor::DType::F32),
        placements: vec![ckpt::ParamLayout::new(0, layout, 1).unwrap()],
    };
    let resolved = ckpt::ResolvedStrategy::new(vec![
        param("w", bind(vec![vec![0], vec![]], &[ROWS, 2]), vec![ROWS, 2]),
        param("b", bind(vec![vec![]], &[5]), vec![5]),
    ])
    .unwrap();
    let path = dir.join(format!("{n}.json"));
    ckpt::save_param_strategy_file(&path, &resolved, &[], ckpt::StrategyFlavour::Tessera, true)
        .unwrap();
    path
}

/// A checkpoint of 4 ranks in `dir/src` (plus a tensor outside the strategy) and the
/// strategies `dir/4.json` (its own) and `dir/2.json`.
fn checkpoint(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let s2 = strategy(dir, 2);
    let s4 = strategy(dir, 4);
    let w = Tensor::from_vec(&[ROWS, 2], (0..ROWS * 2).map(|x| x as f32).collect()).unwrap();
    let b = Tensor::from_vec(&[5], vec![0.5f32; 5]).unwrap();
    let step = Tensor::from_vec(&[1], vec![7f32]).unwrap();
    let rows = ROWS / 4;
    for r in 0..4 {
        let part = Tensor::from_vec(
            &[rows, 2],
            w.as_f32().unwrap()[r * rows * 2..(r + 1) * rows * 2].to_vec(),
        )
        .unwrap();
        let tensors = [("w", &part), ("b", &b), ("step", &step)];
        ckpt::save_rank_checkpoint(&dir.join("src"), r, &tensors, false).unwrap();
    }
    (dir.join("src"), s4, s2)
}

/// Every entry under `dir`, hidden ones included, by relative path: a file's bytes, or `None`
/// for a directory.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    fn walk(root: &Path, at: &Path, out: &mut BTreeMap<PathBuf, Option<Vec<u8>>>) {
        for entry in std::fs::read_dir(at).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            if path.is_dir() {
                out.insert(rel, None);
                walk(root, &path, out);
            } else {
                out.insert(rel, Some(std::fs::read(&path).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// An operation writing to a destination (a directory or a file), replacing it when `force`.
type Op<'a> = &'a dyn Fn(&dyn Progress, &Path, bool) -> ckpt::Result<()>;

/// Stops `op` before its first chunk, after the first, halfway and after the last, writing to
/// `root/<out>` that does not exist, then that holds an earlier output: each time it fails with
/// [`CkptError::Stopped`], the sink hears no advance after the stop and no `finish`, and
/// nothing under `root` changed. The number of chunks is counted by a write elsewhere.
///
/// A `set` (several files committed at the end) is also stopped once its last file is
/// reported done, which only the poll before the set's commit can catch; a single file is
/// reported done once renamed into place, so a stop asked for then comes too late to apply.
fn stops_cleanly(what: &str, root: &Path, out: &str, set: bool, op: Op<'_>) {
    let probe = tmp();
    let counter = StopAfter::new(usize::MAX);
    op(&counter, &probe.path().join(out), false).unwrap();
    assert!(counter.finished.get(), "{what}");
    let (total, n_files) = (counter.advances.get(), counter.files.get());
    assert!(total >= 3, "{what}: only {total} chunks");
    assert_eq!(n_files > 1, set, "{what}: {n_files} files");
    // (chunks, files) after which the sink asks to stop.
    let mut stops: Vec<(usize, usize)> = [0, 1, total / 2, total]
        .into_iter()
        .map(|after| (after, usize::MAX))
        .collect();
    stops.dedup();
    if set {
        stops.push((usize::MAX, n_files));
    }
    let dst = root.join(out);
    for existing in [false, true] {
        if existing {
            op(&NoProgress, &dst, false).unwrap();
        }
        let before = tree(root);
        for &(after, after_files) in &stops {
            let sink = StopAfter {
                after_files,
                ..StopAfter::new(after)
            };
            let case = match sink.after_files {
                usize::MAX => format!("{what}, stopped after {} of {total} chunks", sink.after),
                n => format!("{what}, stopped after {n} of {n_files} files"),
            };
            let case = format!("{case}, existing output: {existing}");
            let err = op(&sink, &dst, existing).expect_err(&case);
            assert!(matches!(err, CkptError::Stopped), "{case}: {err}");
            assert_eq!(
                sink.advances.get(),
                total.min(sink.after),
                "{case}: events after the stop"
            );
            assert!(!sink.finished.get(), "{case}: finished");
            assert!(tree(root) == before, "{case}: the tree changed");
        }
    }
    if !set {
        let sink = StopAfter::after_files(1);
        op(&sink, &dst, true).unwrap();
        assert!(sink.finished.get(), "{what}: a stop after the commit");
    }
    // And without a stop the same write goes through.
    let sink = StopAfter::new(usize::MAX);
    op(&sink, &dst, true).unwrap();
    assert!(
        sink.finished.get() && sink.advances.get() == total,
        "{what}"
    );
}

#[test]
fn a_stopped_conversion_leaves_nothing_on_every_writing_path() {
    let dir = tmp();
    let (src, s4, s2) = checkpoint(dir.path());
    // (output format, fsync): `.ckpt` through the writer thread; safetensors from mapped pages,
    // one file at a time with fsync, two at once without (`fan_out`).
    for (format, fsync) in [
        (Format::Ckpt, true),
        (Format::Ckpt, false),
        (Format::Safetensors, true),
        (Format::Safetensors, false),
    ] {
        let op = |progress: &dyn Progress, dst: &Path, force: bool| {
            let opts = ConvertOptions {
                format: Some(format),
                force,
                fsync,
                chunk_bytes: CHUNK,
                progress,
                ..ConvertOptions::default()
            };
            ckpt::convert_checkpoints(&src, &s4, dst, Some(&s2), &opts).map(|_| ())
        };
        let what = format!("convert to {format:?}, fsync {fsync}");
        stops_cleanly(&what, dir.path(), &format!("{format:?}_{fsync}"), true, &op);
    }
}

#[test]
fn a_stopped_conversion_of_one_file_leaves_no_file() {
    let dir = tmp();
    let (src, s4, s2) = checkpoint(dir.path());
    let files: BTreeMap<usize, PathBuf> = (0..4)
        .map(|r| (r, src.join(format!("rank_{r}/checkpoint_{r}.safetensors"))))
        .collect();
    for name in ["out.ckpt", "out.safetensors"] {
        let op = |progress: &dyn Progress, dst: &Path, force: bool| {
            let opts = ConvertOptions {
                force,
                chunk_bytes: CHUNK,
                progress,
                ..ConvertOptions::default()
            };
            ckpt::convert_checkpoint_files(1, &files, Some(&s4), dst, Some(&s2), &opts).map(|_| ())
        };
        stops_cleanly(
            &format!("convert by file to {name}"),
            dir.path(),
            name,
            false,
            &op,
        );
    }
}

#[test]
fn a_stopped_merge_dedup_or_segment_merge_leaves_nothing() {
    let dir = tmp();
    let (src, s4, _) = checkpoint(dir.path());
    let merge = |progress: &dyn Progress, dst: &Path, force: bool| {
        let opts = MergeOptions {
            force,
            chunk_bytes: CHUNK,
            max_part_bytes: 64,
            progress,
            ..MergeOptions::default()
        };
        ckpt::unified_safetensors(&src, &s4, dst, &opts).map(|_| ())
    };
    stops_cleanly("unified_safetensors", dir.path(), "unified", true, &merge);
    let dedup = |progress: &dyn Progress, dst: &Path, force: bool| {
        ckpt::dedup_checkpoints(&src, &s4, dst, force, Durability::Fsync, progress).map(|_| ())
    };
    stops_cleanly("dedup", dir.path(), "dedup", true, &dedup);
    let entries = ckpt::load_segmented_checkpoints(&src.join("rank_0")).unwrap();
    let segments = |progress: &dyn Progress, dst: &Path, force: bool| {
        ckpt::write_segmented(&entries, dst, force, Durability::Fsync, progress).map(|_| ())
    };
    stops_cleanly(
        "write_segmented",
        dir.path(),
        "merged.ckpt",
        false,
        &segments,
    );
}

/// A split merge (`split_dst_file`) stopped before its first file leaves no directory it
/// created for its output; a directory it found stays.
#[test]
fn a_stopped_split_merge_leaves_no_directory_it_created() {
    let dir = tmp();
    let (src, s4, _) = checkpoint(dir.path());
    let merge = |dst: &Path| {
        let opts = MergeOptions {
            chunk_bytes: CHUNK,
            max_part_bytes: 64,
            split: Some((1, 2)),
            progress: &StopAfter::new(0),
            ..MergeOptions::default()
        };
        ckpt::unified_safetensors(&src, &s4, dst, &opts)
    };
    let err = merge(&dir.path().join("new/unified")).unwrap_err();
    assert!(matches!(err, CkptError::Stopped), "{err}");
    assert!(!dir.path().join("new").exists(), "new/ is left");
    let found = dir.path().join("found");
    std::fs::create_dir(&found).unwrap();
    assert!(matches!(merge(&found), Err(CkptError::Stopped)));
    assert!(found.is_dir());
}
