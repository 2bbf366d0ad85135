//! `tessera bench ckpt-convert`: converting 1 GiB of parameters from 8 ranks to 4, next to
//! `cp -r` + `sync` of the same source directory, measured in the same run.
//!
//! The source (8 × [8192, 4096] f32 over dev [2,4] map [1,0]) is written by Tessera's own writer
//! and is not timed. Each repetition times, interleaved, `cp -r SRC COPY && sync`, the
//! conversion (whose writes are fsynced file by file), `cp -r SRC COPY` without `sync` and the
//! conversion with `--no-fsync` (the like-for-like pair: nothing flushed); before each, the
//! previous output is removed and `sync` runs (not timed). Peak RSS is measured by `/usr/bin/time -v` around a separate `tessera ckpt convert`
//! process.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use layout::Layout;
use tensor::Tensor;

/// Arguments of `tessera bench ckpt-convert`.
#[derive(Debug, Args)]
pub struct CkptConvertArgs {
    /// Working directory to create (it must not exist; default: a fresh directory under the
    /// system temp dir). Removed at the end unless `--keep`.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the generated source, copy and output.
    #[arg(long)]
    keep: bool,
    /// Timed repetitions of each side.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Number of [8192, 4096] f32 tensors (8 = 1 GiB).
    #[arg(long, default_value_t = 8)]
    tensors: usize,
}

const ROWS: usize = 8192;
const COLS: usize = 4096;

/// Runs the benchmark.
pub fn run(args: &CkptConvertArgs) -> anyhow::Result<()> {
    let dir = match &args.dir {
        Some(d) => {
            if std::fs::symlink_metadata(d).is_ok() {
                bail!(
                    "--dir {}: exists; the benchmark only works in a directory it creates (and removes), so give a path that does not exist",
                    d.display()
                );
            }
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            d.clone()
        }
        None => fresh_temp_dir()?,
    };
    let result = bench(&dir, args);
    if !args.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// A directory under the system temp dir that did not exist before.
fn fresh_temp_dir() -> anyhow::Result<PathBuf> {
    let base = std::env::temp_dir();
    for n in 0..1000 {
        let dir = base.join(format!("tessera-bench-ckpt-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    bail!("no fresh directory name under {}", base.display())
}

fn strategy(dev: &[usize], map: &[i64], n: usize) -> anyhow::Result<ckpt::ResolvedStrategy> {
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
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(ckpt::ResolvedStrategy::new(params)?)
}

/// One timed variant: writes its output to the given path.
type Timed<'a> = dyn Fn(&Path) -> anyhow::Result<()> + 'a;

fn sync() -> anyhow::Result<()> {
    let status = Command::new("sync").status().context("running sync")?;
    if !status.success() {
        bail!("sync failed");
    }
    Ok(())
}

fn remove(path: &Path) {
    let _ = std::fs::remove_dir_all(path);
}

fn summary(times: &mut [Duration]) -> (Duration, Duration, Duration) {
    times.sort_unstable();
    (times[times.len() / 2], times[0], times[times.len() - 1])
}

fn bench(dir: &Path, args: &CkptConvertArgs) -> anyhow::Result<()> {
    let (src, copy, dst) = (dir.join("src"), dir.join("copy"), dir.join("dst"));
    let (sa, sb) = (dir.join("A.ckpt"), dir.join("B.ckpt"));
    let a = strategy(&[2, 4], &[1, 0], args.tensors)?;
    let b = strategy(&[2, 2], &[0, 1], args.tensors)?;
    ckpt::save_param_strategy_file(&sa, &a, &[], ckpt::StrategyFlavour::MsProtobuf, true)?;
    ckpt::save_param_strategy_file(&sb, &b, &[], ckpt::StrategyFlavour::MsProtobuf, true)?;
    // The source: each rank's slices, values = global element index + tensor offset.
    eprintln!("generating the source in {} (not timed)…", src.display());
    remove(&src);
    for rank in 0..8 {
        let mut tensors = Vec::new();
        for p in a.params() {
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
        ckpt::save_rank_checkpoint(&src, rank, &refs, true)?;
    }
    let total_bytes = (args.tensors * ROWS * COLS * 4) as u64;
    // Warm the page cache: read every source file once.
    for entry in walk(&src)? {
        std::fs::read(&entry)?;
    }
    sync()?;
    let cp = |out: &Path, then_sync: bool| -> anyhow::Result<()> {
        let status = Command::new("cp").arg("-r").arg(&src).arg(out).status()?;
        if then_sync {
            sync()?;
        }
        if !status.success() {
            bail!("cp -r failed");
        }
        Ok(())
    };
    let convert = |out: &Path, fsync: bool| -> anyhow::Result<()> {
        let opts = ckpt::ConvertOptions {
            format: Some(ckpt::Format::Safetensors),
            fsync,
            ..Default::default()
        };
        ckpt::convert_checkpoints(&src, &sa, out, Some(&sb), &opts)?;
        Ok(())
    };
    // Each timed as a pair: flushed to disk before it returns, and left in the page cache.
    let variants: [(&str, &Timed<'_>); 4] = [
        ("cp -r SRC COPY && sync", &|out| cp(out, true)),
        ("tessera convert (fsynced)", &|out| convert(out, true)),
        ("cp -r SRC COPY (no sync)", &|out| cp(out, false)),
        ("tessera convert --no-fsync", &|out| convert(out, false)),
    ];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    for _ in 0..args.reps.max(1) {
        for ((label, run), times) in variants.iter().zip(&mut times) {
            let out = if label.starts_with("cp") { &copy } else { &dst };
            remove(out);
            // Not timed: the previous variant's (and this removal's) writes reach the disk.
            sync()?;
            let t = Instant::now();
            run(out)?;
            times.push(t.elapsed());
        }
    }
    println!(
        "checkpoint conversion: {} tensors [8192, 4096] f32 = {} over 8 ranks (dev [2,4] map [1,0]) -> 4 ranks (dev [2,2] map [0,1]), safetensors, warm cache",
        args.tensors,
        crate::bench_cmd::human_bytes(total_bytes as usize)
    );
    println!("{:<34} {:>9} {:>19}", "", "median", "min - max");
    let mut medians = Vec::new();
    for ((label, _), times) in variants.iter().zip(&mut times) {
        let (med, min, max) = summary(times);
        medians.push(med.as_secs_f64());
        println!(
            "{:<34} {:>8.3}s {:>8.3}s - {:.3}s",
            label,
            med.as_secs_f64(),
            min.as_secs_f64(),
            max.as_secs_f64()
        );
    }
    println!(
        "ratio tessera / (cp + sync): {:.2}; tessera --no-fsync / cp (no sync): {:.2} (medians over {} runs each, interleaved)",
        medians[1] / medians[0].max(1e-9),
        medians[3] / medians[2].max(1e-9),
        args.reps.max(1)
    );
    // Peak RSS of a separate conversion process.
    let time_bin = Path::new("/usr/bin/time");
    if !time_bin.exists() {
        println!("peak RSS: not measured (/usr/bin/time is missing; install the `time` package)");
        return Ok(());
    }
    remove(&dst);
    sync()?;
    let exe = std::env::current_exe()?;
    let out = Command::new(time_bin)
        .arg("-v")
        .arg(&exe)
        .args([
            "ckpt",
            "convert",
            "--quiet",
            "--format",
            "safetensors",
            "--src",
        ])
        .arg(&src)
        .arg("--src-strategy")
        .arg(&sa)
        .arg("--dst")
        .arg(&dst)
        .arg("--dst-strategy")
        .arg(&sb)
        .output()?;
    if !out.status.success() {
        bail!(
            "the measured conversion failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let report = String::from_utf8_lossy(&out.stderr);
    let field = |name: &str| {
        report
            .lines()
            .find_map(|l| l.trim().strip_prefix(name).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| "?".to_string())
    };
    let rss_kb: f64 = field("Maximum resident set size (kbytes):")
        .parse()
        .unwrap_or(f64::NAN);
    println!(
        "peak RSS of `tessera ckpt convert` (separate process, /usr/bin/time -v): {:.1} MiB; its wall time {}",
        rss_kb / 1024.0,
        field("Elapsed (wall clock) time (h:mm:ss or m:ss):")
    );
    Ok(())
}

fn walk(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
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
