//! Parsing the layout spellings shared by `tessera layout` and `tessera reshard`.

use anyhow::Context;
use layout::{DimSpec, Layout, TensorLayout};

/// Parses a mesh `dp=2,mp=4` into axis sizes and names.
pub fn parse_mesh(text: &str) -> anyhow::Result<(Vec<usize>, Vec<String>)> {
    let mut sizes = Vec::new();
    let mut names = Vec::new();
    for part in text.split(',') {
        let (name, size) = part
            .split_once('=')
            .with_context(|| format!("mesh entry {part:?} is not of the form name=size"))?;
        let size: usize = size
            .trim()
            .parse()
            .with_context(|| format!("mesh entry {part:?}: {size:?} is not a device count"))?;
        names.push(name.trim().to_string());
        sizes.push(size);
    }
    Ok((sizes, names))
}

/// Parses a comma-separated list of non-negative integers (empty text: an empty list).
pub fn parse_usizes(text: &str, what: &str) -> anyhow::Result<Vec<usize>> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|p| {
            p.trim()
                .parse::<usize>()
                .with_context(|| format!("{what}: {p:?} is not a non-negative integer"))
        })
        .collect()
}

/// Parses a map `dp,None,mp+sp`: per dim an axis, `None`, or several axes joined by `+`.
pub fn parse_map(text: &str) -> Vec<DimSpec> {
    if text.trim().is_empty() {
        Vec::new()
    } else {
        text.split(',').map(|e| DimSpec::parse(e.trim())).collect()
    }
}

/// A layout of `shape` from a mesh (plus optional extra trailing axes, e.g. the interleaved
/// one), a map and an optional rank list.
pub fn parse_layout(
    mesh: &str,
    extra_axes: &[(usize, &str)],
    map: &str,
    rank_list: Option<&str>,
    shape: &[usize],
) -> anyhow::Result<TensorLayout> {
    let (mut sizes, mut names) = parse_mesh(mesh)?;
    for &(size, name) in extra_axes {
        sizes.push(size);
        names.push(name.to_string());
    }
    let rank_list = rank_list
        .map(|r| parse_usizes(r, "rank list"))
        .transpose()?;
    let layout = Layout::new(&sizes, &names, rank_list)
        .and_then(|l| l.apply(&parse_map(map)))
        .context("invalid layout")?;
    layout.bind(shape).context("invalid layout for this shape")
}

/// The value parser of a count flag of type `usize`: a value outside `range` is refused as a
/// usage error naming the flag and the range, before anything runs (a zero count that would
/// time nothing, a huge one that would allocate, loop or spawn past the machine).
pub(crate) fn count(
    range: std::ops::RangeInclusive<u64>,
) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(range)
}

/// The value parser of a count flag of type `u64` within `range`.
pub(crate) fn count_u64(
    range: std::ops::RangeInclusive<u64>,
) -> clap::builder::RangedU64ValueParser<u64> {
    clap::builder::RangedU64ValueParser::<u64>::new().range(range)
}
