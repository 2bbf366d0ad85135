//! `tessera layout`: show a tensor layout.

use std::fmt::Write as _;

use anyhow::bail;
use clap::Args;
use layout::{MsDimMap, SliceBox, TensorLayout, INTERLEAVED_ALIAS};
use serde::Serialize;
use serde_json::{json, Value};

use crate::grid;
use crate::parse::{parse_layout, parse_usizes};

/// Arguments of `tessera layout`.
#[derive(Debug, Args)]
pub struct LayoutArgs {
    /// The device mesh: `name=size` per axis, outermost first, e.g. `dp=2,mp=4`.
    #[arg(long)]
    mesh: String,
    /// One entry per tensor dim: an axis name, `None`, or `a+b` for a dim split over several axes
    /// (first listed outermost), e.g. `dp+mp,None`.
    #[arg(long)]
    map: String,
    /// The global tensor shape, e.g. `8,16`.
    #[arg(long)]
    shape: String,
    /// Explicit rank list (one rank per mesh position), e.g. `7,6,5,4,3,2,1,0`.
    #[arg(long)]
    rank_list: Option<String>,
    /// Add MindSpore's virtual `interleaved_parallel` axis of this size as the last mesh axis.
    #[arg(long)]
    interleaved: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera layout`.
pub fn run(args: &LayoutArgs) -> anyhow::Result<()> {
    let tensor_layout = build(args)?;
    let out = if args.json {
        json_text(&tensor_layout)?
    } else {
        render_text(&tensor_layout)?
    };
    crate::stdout::write_stdout(&out)
}

/// Parses the arguments into a validated layout bound to the shape.
fn build(args: &LayoutArgs) -> anyhow::Result<TensorLayout> {
    let extra: Vec<(usize, &str)> = match args.interleaved {
        Some(0) => bail!("--interleaved must be at least 1"),
        Some(k) => vec![(k, INTERLEAVED_ALIAS)],
        None => Vec::new(),
    };
    let shape = parse_usizes(&args.shape, "--shape")?;
    parse_layout(
        &args.mesh,
        &extra,
        &args.map,
        args.rank_list.as_deref(),
        &shape,
    )
}

fn ms_map_json(maps: &[MsDimMap]) -> Value {
    Value::Array(
        maps.iter()
            .map(|m| match m {
                MsDimMap::Single(v) => json!(v),
                MsDimMap::Multi(vs) => json!(vs),
            })
            .collect(),
    )
}

/// The `--json` document, serialized as it is written: one small struct per slot rather than a
/// `serde_json::Value` object each (over a million ranks those took 2 GB for 179 MB of text).
/// Field names are listed in sorted order, the order `serde_json` writes the keys of a `Value`
/// object, so the text is what serialising the equivalent `Value` gives.
#[derive(Serialize)]
struct LayoutJson<'a> {
    alias_name: Vec<String>,
    device_matrix: Vec<usize>,
    interleaved_parallel: bool,
    rank_list: Vec<usize>,
    replica_groups: Vec<Vec<usize>>,
    shape: &'a [usize],
    sharding_strategy: Vec<usize>,
    slice_shape: &'a [usize],
    slices: Vec<SliceJson>,
    tensor_map: Value,
}

/// One slot of [`LayoutJson::slices`]: its rank, its box (`offset` and `shape`) and, on an
/// interleaved mesh, which of the device's copies it is (`interleave_index`).
struct SliceJson {
    interleave_index: Option<usize>,
    rank: usize,
    region: SliceBox,
}

impl Serialize for SliceJson {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut st = s.serialize_struct(
            "SliceJson",
            3 + usize::from(self.interleave_index.is_some()),
        )?;
        if let Some(index) = self.interleave_index {
            st.serialize_field("interleave_index", &index)?;
        }
        st.serialize_field("offset", &self.region.offset[..])?;
        st.serialize_field("rank", &self.rank)?;
        st.serialize_field("shape", &self.region.shape[..])?;
        st.end()
    }
}

/// The `--json` text, with its final newline.
fn json_text(t: &TensorLayout) -> anyhow::Result<String> {
    let mut s = serde_json::to_string_pretty(&to_json(t)?)?;
    s.push('\n');
    Ok(s)
}

/// The `--json` object.
fn to_json(t: &TensorLayout) -> anyhow::Result<LayoutJson<'_>> {
    let dict = t.layout().to_dict()?;
    let mesh = t.mesh();
    let k = mesh.interleave_factor();
    let slices: Vec<SliceJson> = (0..mesh.n_slots())
        .map(|slot| SliceJson {
            interleave_index: (k > 1).then_some(slot % k),
            rank: mesh.device_of_slot(slot),
            region: t.slot_box(slot),
        })
        .collect();
    Ok(LayoutJson {
        alias_name: dict.alias_name,
        device_matrix: dict.device_matrix,
        interleaved_parallel: dict.interleaved_parallel,
        rank_list: dict.rank_list,
        replica_groups: replica_groups_by_device(t),
        shape: t.shape(),
        sharding_strategy: t.split_factors(),
        slice_shape: t.slice_shape(),
        slices,
        tensor_map: ms_map_json(&dict.tensor_map),
    })
}

/// Replica groups as device ranks (an interleaved mesh's virtual copies collapse onto their
/// device).
fn replica_groups_by_device(t: &TensorLayout) -> Vec<Vec<usize>> {
    let mesh = t.mesh();
    t.replica_slot_groups()
        .into_iter()
        .map(|g| {
            let mut ranks: Vec<usize> = g.iter().map(|&s| mesh.device_of_slot(s)).collect();
            ranks.dedup();
            ranks
        })
        .collect()
}

/// The human-readable report.
fn render_text(t: &TensorLayout) -> anyhow::Result<String> {
    let mesh = t.mesh();
    let layout = t.layout();
    let mut out = String::new();
    let k = mesh.interleave_factor();
    writeln!(
        out,
        "layout {} of a {:?} tensor over mesh {} ({} device{}{})",
        layout.describe_map(),
        t.shape(),
        mesh,
        mesh.n_devices(),
        if mesh.n_devices() == 1 { "" } else { "s" },
        if k > 1 {
            format!(", {k} interleaved copies each")
        } else {
            String::new()
        }
    )?;
    writeln!(
        out,
        "MindSpore tensor_map {}  sharding_strategy {:?}  slice shape {:?}  copies of each element {}",
        serde_json::to_string(&ms_map_json(&layout.ms_dim_maps()?))?,
        t.split_factors(),
        t.slice_shape(),
        t.replica_count()
    )?;
    writeln!(out)?;
    let coord_width = mesh
        .axes()
        .iter()
        .map(|a| a.name.len() + 1 + a.size.to_string().len())
        .sum::<usize>()
        + mesh.n_axes().saturating_sub(1);
    writeln!(
        out,
        "{:>6}  {}  slice",
        "rank",
        pad("coordinate", coord_width)
    )?;
    for slot in 0..mesh.n_slots() {
        let coord: Vec<String> = mesh
            .coord(slot)
            .iter()
            .zip(mesh.axes())
            .map(|(c, a)| format!("{}={}", a.name, c))
            .collect();
        writeln!(
            out,
            "{:>6}  {}  {}",
            grid::slot_label(mesh, slot),
            pad(&coord.join(","), coord_width),
            t.slot_box(slot)
        )?;
    }
    writeln!(out)?;
    let groups = replica_groups_by_device(t);
    writeln!(
        out,
        "replica groups ({} group{} of {} rank{}):",
        groups.len(),
        if groups.len() == 1 { "" } else { "s" },
        groups.first().map_or(0, Vec::len),
        if groups.first().map_or(0, Vec::len) == 1 {
            ""
        } else {
            "s"
        }
    )?;
    let rendered: Vec<String> = groups.iter().map(|g| format!("{g:?}")).collect();
    writeln!(out, "  {}", rendered.join(" "))?;
    writeln!(out)?;
    out.push_str(&grid::render(t));
    Ok(out)
}

/// `text` left-aligned in `width` columns. (A `{:<width$}` format panics for widths above
/// `u16::MAX`, which long axis names reach.)
fn pad(text: &str, width: usize) -> String {
    let n_chars = text.chars().count();
    let mut out = String::with_capacity(text.len() + width.saturating_sub(n_chars));
    out.push_str(text);
    out.extend(std::iter::repeat_n(' ', width.saturating_sub(n_chars)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(mesh: &str, map: &str, shape: &str) -> LayoutArgs {
        LayoutArgs {
            mesh: mesh.into(),
            map: map.into(),
            shape: shape.into(),
            rank_list: None,
            interleaved: None,
            json: true,
        }
    }

    #[test]
    fn json_has_the_documented_fields() {
        let t = build(&args("dp=2,mp=4", "dp,mp", "8,16")).unwrap();
        let v = serde_json::to_value(to_json(&t).unwrap()).unwrap();
        assert_eq!(v["device_matrix"], json!([2, 4]));
        assert_eq!(v["tensor_map"], json!([1, 0]));
        assert_eq!(
            v["slices"][5],
            json!({"rank": 5, "offset": [4, 4], "shape": [4, 4]})
        );
        assert_eq!(v["replica_groups"].as_array().unwrap().len(), 8);
        let multi = build(&args("dp=2,mp=4", "dp+mp,None", "8,16")).unwrap();
        let v = serde_json::to_value(to_json(&multi).unwrap()).unwrap();
        assert_eq!(v["tensor_map"], json!([[1, 0], -1]));
    }

    /// The `--json` document as it was built before, one `Value` per slot: the reference the
    /// serialized structs must match byte for byte.
    fn layout_value(t: &TensorLayout) -> Value {
        let dict = t.layout().to_dict().unwrap();
        let mesh = t.mesh();
        let k = mesh.interleave_factor();
        let slices: Vec<Value> = (0..mesh.n_slots())
            .map(|slot| {
                let b = t.slot_box(slot);
                let mut v = json!({
                    "rank": mesh.device_of_slot(slot),
                    "offset": &b.offset[..],
                    "shape": &b.shape[..],
                });
                if k > 1 {
                    v["interleave_index"] = json!(slot % k);
                }
                v
            })
            .collect();
        json!({
            "device_matrix": dict.device_matrix,
            "alias_name": dict.alias_name,
            "tensor_map": ms_map_json(&dict.tensor_map),
            "interleaved_parallel": dict.interleaved_parallel,
            "rank_list": dict.rank_list,
            "shape": t.shape(),
            "sharding_strategy": t.split_factors(),
            "slice_shape": t.slice_shape(),
            "slices": slices,
            "replica_groups": replica_groups_by_device(t),
        })
    }

    /// `--json` writes, byte for byte, what serializing one `Value` per slot wrote: plain,
    /// multi-axis, rank-listed, interleaved and scalar layouts.
    #[test]
    fn the_json_text_is_the_value_it_replaced() {
        let cases = [
            ("dp=2,mp=4", "dp,mp", "8,16", None, None),
            (
                "dp=2,sp=2,mp=2",
                "dp+sp,mp",
                "8,16",
                Some("7,6,5,4,3,2,1,0"),
                None,
            ),
            ("dp=2", "dp", "8", None, Some(2)),
            ("dp=2", "dp+interleaved_parallel,None", "8,4", None, Some(2)),
            ("dp=2", "", "", None, None),
        ];
        for (mesh, map, shape, rank_list, interleaved) in cases {
            let t = build(&LayoutArgs {
                rank_list: rank_list.map(str::to_string),
                interleaved,
                ..args(mesh, map, shape)
            })
            .unwrap();
            assert_eq!(
                json_text(&t).unwrap(),
                format!(
                    "{}\n",
                    serde_json::to_string_pretty(&layout_value(&t)).unwrap()
                ),
                "{mesh} {map} {shape}"
            );
        }
    }

    #[test]
    fn bad_input_is_an_error_with_a_reason() {
        let err = build(&args("dp=2,mp=4", "dp,xx", "8,16")).unwrap_err();
        assert!(format!("{err:#}").contains("The axis xx is not found"));
        let err = build(&args("dp=2,mp=4", "dp,mp", "8,15")).unwrap_err();
        assert!(format!("{err:#}").contains("dim 1 of shape [8, 15]"));
        assert!(build(&args("dp2", "dp", "8")).is_err());
    }
}
