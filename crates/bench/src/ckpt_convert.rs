//! `tessera bench ckpt-convert`: converting 1 GiB of parameters from 8 ranks to 4, next to
//! `cp -r` + `sync` of the same source directory, measured in the same run.
//!
//! The source (8 × [8192, 4096] f32 over dev [2,4] map [1,0]) is written by Tessera's own writer
//! and is not timed. Each repetition times, interleaved, `cp -r SRC COPY && sync`, the
//! conversion (whose writes are fsynced file by file), `cp -r SRC COPY` without `sync` and the
//! conversion with `--no-fsync` (the like-for-like pair: nothing flushed); before each, the
//! previous output is removed and `sync` runs (not timed). Peak RSS is measured by `/usr/bin/time -v` around a separate `tessera ckpt convert`
//! process.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use layout::Layout;
use tensor::Tensor;

use crate::timing::{human_bytes, Summary};
use crate::{BenchError, Progress};

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CkptConvertRequest {
    /// Working directory to create (it must not exist; `None`: a fresh directory under the
    /// system temp dir). Removed at the end unless `keep`.
    pub dir: Option<PathBuf>,
    /// Keep the generated source, copy and output.
    pub keep: bool,
    /// Timed repetitions of each side.
    pub reps: usize,
    /// Number of [8192, 4096] f32 tensors (8 = 1 GiB).
    pub tensors: usize,
    /// The `tessera` binary whose `ckpt convert` is run as a separate process for its peak RSS.
    pub tessera: PathBuf,
}

const ROWS: usize = 8192;
const COLS: usize = 4096;

/// The four timed variants, in the order they run and are reported.
pub const VARIANTS: [&str; 4] = [
    "cp -r SRC COPY && sync",
    "tessera convert (fsynced)",
    "cp -r SRC COPY (no sync)",
    "tessera convert --no-fsync",
];

/// Peak RSS of a separate conversion process, as `/usr/bin/time -v` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct PeakRss {
    /// `Maximum resident set size (kbytes)` (NaN when missing).
    pub kbytes: f64,
    /// `Elapsed (wall clock) time` as printed (`?` when missing).
    pub wall: String,
}

/// The conversion's times next to `cp -r`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversionTimes {
    /// Tensors converted.
    pub tensors: usize,
    /// Timed repetitions of each variant.
    pub reps: usize,
    /// Each of [`VARIANTS`]' times, in that order.
    pub times: Vec<Summary>,
}

impl fmt::Display for ConversionTimes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total_bytes = self.tensors * ROWS * COLS * 4;
        writeln!(
            f,
            "checkpoint conversion: {} tensors [8192, 4096] f32 = {} over 8 ranks (dev [2,4] map [1,0]) -> 4 ranks (dev [2,2] map [0,1]), safetensors, warm cache",
            self.tensors,
            human_bytes(total_bytes)
        )?;
        writeln!(f, "{:<34} {:>9} {:>19}", "", "median", "min - max")?;
        for (label, s) in VARIANTS.iter().zip(&self.times) {
            writeln!(
                f,
                "{:<34} {:>8.3}s {:>8.3}s - {:.3}s",
                label,
                s.median.as_secs_f64(),
                s.min.as_secs_f64(),
                s.max.as_secs_f64()
            )?;
        }
        let medians: Vec<f64> = self.times.iter().map(|s| s.median.as_secs_f64()).collect();
        writeln!(
            f,
            "ratio tessera / (cp + sync): {:.2}; tessera --no-fsync / cp (no sync): {:.2} (medians over {} runs each, interleaved)",
            medians[1] / medians[0].max(1e-9),
            medians[3] / medians[2].max(1e-9),
            self.reps.max(1)
        )
    }
}

/// The report's last line: the peak RSS, or why it was not measured.
struct PeakRssLine<'a>(&'a Option<PeakRss>);

impl fmt::Display for PeakRssLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => writeln!(
                f,
                "peak RSS: not measured (/usr/bin/time is missing; install the `time` package)"
            ),
            Some(rss) => writeln!(
                f,
                "peak RSS of `tessera ckpt convert` (separate process, /usr/bin/time -v): {:.1} MiB; its wall time {}",
                rss.kbytes / 1024.0,
                rss.wall
            ),
        }
    }
}

/// The conversion's times and its peak RSS.
#[derive(Debug, Clone, PartialEq)]
pub struct CkptConvertReport {
    /// The timed variants.
    pub times: ConversionTimes,
    /// Peak RSS of a separate conversion (`None`: `/usr/bin/time` is missing).
    pub peak_rss: Option<PeakRss>,
}

impl fmt::Display for CkptConvertReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.times.fmt(f)?;
        PeakRssLine(&self.peak_rss).fmt(f)
    }
}

/// Runs `tessera bench ckpt-convert`: creates the working directory (refusing one that
/// exists), measures, and removes the directory unless `keep`.
pub fn ckpt_convert(
    request: &CkptConvertRequest,
    progress: &mut dyn Progress,
) -> Result<CkptConvertReport, BenchError> {
    let dir = match &request.dir {
        Some(d) => {
            if std::fs::symlink_metadata(d).is_ok() {
                return Err(BenchError::DirExists(d.clone()));
            }
            std::fs::create_dir_all(d)
                .map_err(|e| BenchError::io_at(format!("creating {}", d.display()), e))?;
            d.clone()
        }
        None => fresh_temp_dir()?,
    };
    let result = bench(&dir, request, progress);
    if !request.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// A directory under the system temp dir that did not exist before.
fn fresh_temp_dir() -> Result<PathBuf, BenchError> {
    let base = std::env::temp_dir();
    for n in 0..1000 {
        let dir = base.join(format!("tessera-bench-ckpt-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(BenchError::io_at(format!("creating {}", dir.display()), e)),
        }
    }
    Err(BenchError::NoFreshDir(base))
}

fn strategy(dev: &[usize], map: &[i64], n: usize) -> Result<ckpt::ResolvedStrategy, BenchError> {
    let params = (0..n)
        .map(|i| {
            let mp = Layout::from_ms_flat(dev, map, None)?.bind(&[ROWS, COLS])?;
            Ok(ckpt::ResolvedParam {
                name: format!("layer{i}.weight"),
                shape: vec![ROWS, COLS],
                dtype: Some(tensor::DType::F32),
                placements: vec![ckpt::ParamLayout::new(0, mp, 1)?],
            })
        })
        .collect::<Result<Vec<_>, BenchError>>()?;
    Ok(ckpt::ResolvedStrategy::new(params)?)
}

/// One timed variant: writes its output to the given path.
type Timed<'a> = dyn Fn(&Path) -> Result<(), BenchError> + 'a;

fn sync() -> Result<(), BenchError> {
    let status = Command::new("sync")
        .status()
        .map_err(|e| BenchError::io_at("running sync", e))?;
    if !status.success() {
        return Err(BenchError::ToolFailed("sync"));
    }
    Ok(())
}

fn remove(path: &Path) {
    let _ = std::fs::remove_dir_all(path);
}

/// Writes the source: each rank's slices, values = global element index + tensor offset.
fn write_source(src: &Path, strategy: &ckpt::ResolvedStrategy) -> Result<(), BenchError> {
    for rank in 0..8 {
        let mut tensors = Vec::new();
        for p in strategy.params() {
            let region = p.placements[0].held.rank_box(rank)?;
            let base = p.name.len() as f32;
            let (r0, c0) = (region.offset[0], region.offset[1]);
            let (nr, nc) = (region.shape[0], region.shape[1]);
            let mut data = Vec::with_capacity(nr * nc);
            for i in 0..nr {
                for j in 0..nc {
                    data.push(((r0 + i) * COLS + c0 + j) as f32 + base);
                }
            }
            tensors.push((p.name.clone(), Tensor::from_vec(&region.shape, data)?));
        }
        let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        ckpt::save_rank_checkpoint(src, rank, &refs, true)?;
    }
    Ok(())
}

fn bench(
    dir: &Path,
    request: &CkptConvertRequest,
    progress: &mut dyn Progress,
) -> Result<CkptConvertReport, BenchError> {
    let (src, copy, dst) = (dir.join("src"), dir.join("copy"), dir.join("dst"));
    let (sa, sb) = (dir.join("A.ckpt"), dir.join("B.ckpt"));
    let a = strategy(&[2, 4], &[1, 0], request.tensors)?;
    let b = strategy(&[2, 2], &[0, 1], request.tensors)?;
    ckpt::save_param_strategy_file(&sa, &a, &[], ckpt::StrategyFlavour::MsProtobuf, true)?;
    ckpt::save_param_strategy_file(&sb, &b, &[], ckpt::StrategyFlavour::MsProtobuf, true)?;
    crate::go_on(progress)?;
    progress.note(&format_args!(
        "generating the source in {} (not timed)…",
        src.display()
    ));
    remove(&src);
    write_source(&src, &a)?;
    // Warm the page cache: read every source file once.
    for entry in walk(&src)? {
        std::fs::read(&entry)?;
    }
    sync()?;
    let cp = |out: &Path, then_sync: bool| -> Result<(), BenchError> {
        let status = Command::new("cp").arg("-r").arg(&src).arg(out).status()?;
        if then_sync {
            sync()?;
        }
        if !status.success() {
            return Err(BenchError::ToolFailed("cp -r"));
        }
        Ok(())
    };
    let convert = |out: &Path, fsync: bool| -> Result<(), BenchError> {
        let opts = ckpt::ConvertOptions {
            format: Some(ckpt::Format::Safetensors),
            fsync,
            ..Default::default()
        };
        ckpt::convert_checkpoints(&src, &sa, out, Some(&sb), &opts)?;
        Ok(())
    };
    // Each timed as a pair: flushed to disk before it returns, and left in the page cache.
    let variants: [&Timed<'_>; 4] = [
        &|out| cp(out, true),
        &|out| convert(out, true),
        &|out| cp(out, false),
        &|out| convert(out, false),
    ];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    for _ in 0..request.reps.max(1) {
        for ((label, run), times) in VARIANTS.iter().zip(variants).zip(&mut times) {
            crate::go_on(progress)?;
            let out = if label.starts_with("cp") { &copy } else { &dst };
            remove(out);
            // Not timed: the previous variant's (and this removal's) writes reach the disk.
            sync()?;
            let t = Instant::now();
            run(out)?;
            times.push(t.elapsed());
        }
    }
    let times = ConversionTimes {
        tensors: request.tensors,
        reps: request.reps,
        times: times.iter().map(|t| Summary::of(t)).collect(),
    };
    progress.piece(&times);
    crate::go_on(progress)?;
    let peak_rss = peak_rss(request, (&src, &dst), (&sa, &sb))?;
    progress.piece(&PeakRssLine(&peak_rss));
    Ok(CkptConvertReport { times, peak_rss })
}

/// Peak RSS of a separate conversion process (`None`: `/usr/bin/time` is missing).
fn peak_rss(
    request: &CkptConvertRequest,
    (src, dst): (&Path, &Path),
    (sa, sb): (&Path, &Path),
) -> Result<Option<PeakRss>, BenchError> {
    let time_bin = Path::new("/usr/bin/time");
    if !time_bin.exists() {
        return Ok(None);
    }
    remove(dst);
    sync()?;
    let out = Command::new(time_bin)
        .arg("-v")
        .arg(&request.tessera)
        .args([
            "ckpt",
            "convert",
            "--quiet",
            "--format",
            "safetensors",
            "--src",
        ])
        .arg(src)
        .arg("--src-strategy")
        .arg(sa)
        .arg("--dst")
        .arg(dst)
        .arg("--dst-strategy")
        .arg(sb)
        .output()?;
    if !out.status.success() {
        return Err(BenchError::MeasuredConversion(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    let report = String::from_utf8_lossy(&out.stderr);
    let field = |name: &str| {
        report
            .lines()
            .find_map(|l| l.trim().strip_prefix(name).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| "?".to_string())
    };
    Ok(Some(PeakRss {
        kbytes: field("Maximum resident set size (kbytes):")
            .parse()
            .unwrap_or(f64::NAN),
        wall: field("Elapsed (wall clock) time (h:mm:ss or m:ss):"),
    }))
}

fn walk(dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            out.extend(walk(&p)?);
        } else {
            out.push(p);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reader gone before anything was measured (`tessera bench ckpt-convert | head`):
    /// the benchmark generated its 128 MiB source and ran every repetition anyway; it stops at
    /// once and still removes the working directory it created.
    #[test]
    fn a_reader_gone_stops_before_the_source_and_removes_the_dir() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("work");
        let request = CkptConvertRequest {
            dir: Some(dir.clone()),
            keep: false,
            reps: 100,
            tensors: 1,
            tessera: PathBuf::from("/nonexistent/tessera"),
        };
        let mut gone = crate::testing::GoneAfter::new(0);
        let err = ckpt_convert(&request, &mut gone).unwrap_err();
        assert!(matches!(err, BenchError::Stopped), "{err}");
        assert_eq!(gone.asked, 1);
        assert!(!dir.exists(), "{} was left behind", dir.display());
    }
}
