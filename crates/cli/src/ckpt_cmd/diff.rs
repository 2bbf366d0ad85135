//! `tessera ckpt diff`: two checkpoints of any strategies compared tensor by tensor.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};

use super::output::print;

/// Arguments of `tessera ckpt diff`.
#[derive(Debug, Args)]
pub(super) struct DiffArgs {
    /// Checkpoint A: a directory holding rank_<N>/ (a training run's output directory).
    a: PathBuf,
    /// Checkpoint B, of the same or another strategy.
    b: PathBuf,
    /// A's strategy file [default: A/strategy.json, as a training run saves it].
    #[arg(long)]
    strategy_a: Option<PathBuf>,
    /// B's strategy file [default: B/strategy.json].
    #[arg(long)]
    strategy_b: Option<PathBuf>,
    /// Accept tensors whose every element satisfies |a - b| <= T * max(1, |a|, |b|): an
    /// absolute tolerance for values up to 1 in magnitude, a relative one above. Without it,
    /// every tensor must be bitwise equal.
    #[arg(long, value_name = "T")]
    tolerance: Option<f64>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// The status word of one tensor of `tessera ckpt diff`.
fn diff_status(t: &ckpt::TensorDiff, tolerance: Option<f64>) -> &'static str {
    match &t.comparison {
        ckpt::TensorComparison::ShapeMismatch { .. } => "SHAPE",
        ckpt::TensorComparison::DTypeMismatch { .. } => "DTYPE",
        ckpt::TensorComparison::Compared(_) if t.bitwise_equal() => "EQUAL",
        ckpt::TensorComparison::Compared(_) if tolerance.is_some_and(|tol| t.within(tol)) => {
            "WITHIN"
        }
        ckpt::TensorComparison::Compared(_) => "DIFFERS",
    }
}

/// Runs `tessera ckpt diff`; fails unless every tensor is equal (or within the tolerance)
/// and both sides hold the same tensors.
pub(super) fn diff(a: &DiffArgs) -> anyhow::Result<()> {
    if let Some(tol) = a.tolerance {
        if !(tol.is_finite() && tol >= 0.0) {
            bail!("--tolerance {tol} must be a finite number >= 0");
        }
    }
    for (dir, what) in [(&a.a, "checkpoint A"), (&a.b, "checkpoint B")] {
        runtime::check_input_path(
            what,
            dir,
            runtime::PathKind::Directory,
            "a directory (a training run's output directory: rank_<N>/ and strategy.json)",
        )?;
    }
    for (flag, path) in [
        ("--strategy-a", &a.strategy_a),
        ("--strategy-b", &a.strategy_b),
    ] {
        super::flags::check_optional_file(flag, path.as_deref(), super::flags::STRATEGY_FILE)?;
    }
    let strategy_a = a
        .strategy_a
        .clone()
        .unwrap_or_else(|| a.a.join("strategy.json"));
    let strategy_b = a
        .strategy_b
        .clone()
        .unwrap_or_else(|| a.b.join("strategy.json"));
    for (dir, strategy, flag) in [(&a.a, &strategy_a, "a"), (&a.b, &strategy_b, "b")] {
        if !strategy.is_file() {
            bail!(
                "{}: no strategy file {} (a training run saves strategy.json beside its \
                 rank folders; name another with --strategy-{flag})",
                dir.display(),
                strategy.display()
            );
        }
    }
    let side_a = ckpt::DiffSide {
        dir: &a.a,
        strategy: &strategy_a,
    };
    let side_b = ckpt::DiffSide {
        dir: &a.b,
        strategy: &strategy_b,
    };
    let report = ckpt::diff_checkpoints(&side_a, &side_b, &mut |_| {})
        .with_context(|| format!("comparing {} with {}", a.a.display(), a.b.display()))?;
    let ok = match a.tolerance {
        Some(tol) => report.within(tol),
        None => report.bitwise_equal(),
    };
    let mut text = String::new();
    let width = report
        .tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(0);
    for t in &report.tensors {
        let dtype = t.dtype.map_or("?".to_string(), |d| d.to_string());
        let detail = match &t.comparison {
            ckpt::TensorComparison::Compared(s) => format!(
                "max abs {:.3e}  max rel {:.3e}  {} of {} elements differ",
                s.max_abs,
                s.max_rel,
                s.n_differing,
                t.shape.iter().product::<usize>()
            ),
            ckpt::TensorComparison::ShapeMismatch { a: sa, b: sb } => {
                format!("shape {sa:?} in A but {sb:?} in B")
            }
            ckpt::TensorComparison::DTypeMismatch { a: da, b: db } => {
                format!("dtype {da} in A but {db} in B")
            }
        };
        text.push_str(&format!(
            "{:<7}  {:<width$}  {:<16}  {detail}\n",
            diff_status(t, a.tolerance),
            t.name,
            format!("{dtype}{:?}", t.shape),
        ));
    }
    for name in &report.only_in_a {
        text.push_str(&format!("ONLY-A   {name}  (not in {})\n", a.b.display()));
    }
    for name in &report.only_in_b {
        text.push_str(&format!("ONLY-B   {name}  (not in {})\n", a.a.display()));
    }
    let count = |status: &str| {
        report
            .tensors
            .iter()
            .filter(|t| diff_status(t, a.tolerance) == status)
            .count()
    };
    let n_bad: Vec<&str> = report
        .tensors
        .iter()
        .filter(|t| !matches!(diff_status(t, a.tolerance), "EQUAL" | "WITHIN"))
        .map(|t| t.name.as_str())
        .collect();
    text.push_str(&format!(
        "{} tensors compared: {} bitwise equal, {} within tolerance, {} different; {} only in \
         A, {} only in B\n{}\n",
        report.tensors.len(),
        count("EQUAL"),
        count("WITHIN"),
        n_bad.len(),
        report.only_in_a.len(),
        report.only_in_b.len(),
        if ok { "OK" } else { "DIFFERENT" }
    ));
    let tensors: Vec<Value> = report
        .tensors
        .iter()
        .map(|t| {
            let mut v = json!({
                "name": t.name,
                "shape": t.shape,
                "dtype": t.dtype.map(|d| d.to_string()),
                "status": diff_status(t, a.tolerance).to_lowercase(),
                "bitwise_equal": t.bitwise_equal(),
            });
            match &t.comparison {
                ckpt::TensorComparison::Compared(s) => {
                    v["differing_elements"] = json!(s.n_differing);
                    v["max_abs"] = json!(s.max_abs);
                    v["max_rel"] = json!(s.max_rel);
                    v["max_scaled"] = json!(s.max_scaled);
                }
                ckpt::TensorComparison::ShapeMismatch { a: sa, b: sb } => {
                    v["shape_b"] = json!(sb);
                    v["shape"] = json!(sa);
                }
                ckpt::TensorComparison::DTypeMismatch { a: da, b: db } => {
                    v["dtype"] = json!(da.to_string());
                    v["dtype_b"] = json!(db.to_string());
                }
            }
            v
        })
        .collect();
    print(
        a.json,
        json!({
            "ok": ok,
            "bitwise_equal": report.bitwise_equal(),
            "tolerance": a.tolerance,
            "tensors": tensors,
            "only_in_a": report.only_in_a,
            "only_in_b": report.only_in_b,
        }),
        text,
    )?;
    if ok {
        return Ok(());
    }
    let mut reasons = Vec::new();
    let list = |names: &[&str]| {
        let shown: Vec<&str> = names.iter().take(8).copied().collect();
        let more = names.len().saturating_sub(shown.len());
        let mut s = shown.join(", ");
        if more > 0 {
            s.push_str(&format!(" and {more} more"));
        }
        s
    };
    if !n_bad.is_empty() {
        let what = match a.tolerance {
            Some(tol) => format!("beyond the tolerance {tol}"),
            None => "not bitwise equal".to_string(),
        };
        reasons.push(format!(
            "{} tensor(s) {what}: {}",
            n_bad.len(),
            list(&n_bad)
        ));
    }
    for (names, here, there) in [
        (&report.only_in_a, &a.a, &a.b),
        (&report.only_in_b, &a.b, &a.a),
    ] {
        if !names.is_empty() {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            reasons.push(format!(
                "{} tensor(s) only in {} (missing from {}): {}",
                names.len(),
                here.display(),
                there.display(),
                list(&names)
            ));
        }
    }
    bail!("the checkpoints differ: {}", reasons.join("; "))
}
