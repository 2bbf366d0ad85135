//! Drawing a tensor layout as a grid of blocks labelled with the ranks that hold them.
//!
//! A 2-D tensor is one grid; an N-D tensor is a series of 2-D planes, one per block of the
//! leading dims; a 1-D tensor is one row of blocks.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use layout::{Mesh, TensorLayout};

/// Most planes drawn before the rest are summarised.
const MAX_PLANES: usize = 16;
/// Most block columns drawn in one plane.
const MAX_COLUMNS: usize = 64;
/// Most block rows drawn in one plane.
const MAX_ROWS: usize = 256;

/// How a slot is named in tables and drawings: its rank, or `rank.copy` on an interleaved mesh.
pub fn slot_label(mesh: &Mesh, slot: usize) -> String {
    let k = mesh.interleave_factor();
    if k > 1 {
        format!("{}.{}", mesh.device_of_slot(slot), slot % k)
    } else {
        mesh.rank_of_slot(slot).to_string()
    }
}

/// A list of ranks, with runs of three or more consecutive ranks written `a-b`.
fn compress_ranks(ranks: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        if j >= i + 2 {
            parts.push(format!("{}-{}", ranks[i], ranks[j]));
        } else {
            parts.extend(ranks[i..=j].iter().map(usize::to_string));
        }
        i = j + 1;
    }
    parts.join(",")
}

/// The label of a block: the ranks holding it.
fn block_label(mesh: &Mesh, slots: &[usize]) -> String {
    if mesh.interleave_factor() > 1 {
        slots
            .iter()
            .map(|&s| slot_label(mesh, s))
            .collect::<Vec<_>>()
            .join(",")
    } else {
        let mut ranks: Vec<usize> = slots.iter().map(|&s| mesh.rank_of_slot(s)).collect();
        ranks.sort_unstable();
        compress_ranks(&ranks)
    }
}

/// Draws the layout.
pub fn render(t: &TensorLayout) -> String {
    let mesh = t.mesh();
    let shape = t.shape();
    let slice = t.slice_shape();
    // Keyed by block index (not by offset: the blocks of a zero-size dim all start at 0).
    let blocks: BTreeMap<Vec<usize>, String> = t
        .distinct_boxes()
        .into_iter()
        .map(|(_, slots)| (t.block_index(slots[0]), block_label(mesh, &slots)))
        .collect();
    let ndim = shape.len();
    if ndim == 0 {
        return format!(
            "scalar held by ranks {}\n",
            blocks.values().next().cloned().unwrap_or_default()
        );
    }
    let factors = t.split_factors();
    let range = |d: usize, i: usize| format!("{}:{}", i * slice[d], (i + 1) * slice[d]);
    let lead = ndim.saturating_sub(2);
    let n_planes: usize = factors[..lead].iter().product();
    let mut out = String::new();
    if ndim >= 2 {
        let _ = writeln!(
            out,
            "rows: dim {}, columns: dim {}; each block shows the ranks holding it",
            ndim - 2,
            ndim - 1
        );
    } else {
        let _ = writeln!(out, "blocks of dim 0, each showing the ranks holding it");
    }
    for plane in 0..n_planes.min(MAX_PLANES) {
        // Block index of the leading dims for this plane, dim 0 slowest.
        let mut lead_idx = vec![0; lead];
        let mut rest = plane;
        for d in (0..lead).rev() {
            lead_idx[d] = rest % factors[d];
            rest /= factors[d];
        }
        if lead > 0 {
            let title: Vec<String> = (0..lead)
                .map(|d| format!("dim {} = {}", d, range(d, lead_idx[d])))
                .collect();
            let _ = writeln!(out, "plane {}:", title.join(", "));
        }
        let (row_dim, n_rows) = if ndim >= 2 {
            (Some(ndim - 2), factors[ndim - 2])
        } else {
            (None, 1)
        };
        let n_cols = factors[ndim - 1];
        if n_rows > MAX_ROWS || n_cols > MAX_COLUMNS {
            let _ = writeln!(
                out,
                "  ({n_rows} x {n_cols} blocks: too many to draw; see the slice list)"
            );
            continue;
        }
        let label = |r: usize, c: usize| -> String {
            let mut idx = lead_idx.clone();
            if row_dim.is_some() {
                idx.push(r);
            }
            idx.push(c);
            blocks.get(&idx).cloned().unwrap_or_default()
        };
        let col_headers: Vec<String> = (0..n_cols).map(|c| range(ndim - 1, c)).collect();
        let row_headers: Vec<String> = (0..n_rows)
            .map(|r| row_dim.map_or(String::new(), |d| range(d, r)))
            .collect();
        let mut width = col_headers.iter().map(String::len).max().unwrap_or(1);
        for r in 0..n_rows {
            for c in 0..n_cols {
                width = width.max(label(r, c).len());
            }
        }
        width += 2;
        let margin = row_headers.iter().map(String::len).max().unwrap_or(0) + 1;
        let _ = write!(out, "{:margin$}", "");
        for h in &col_headers {
            let _ = write!(out, " {h:^width$}");
        }
        out.push('\n');
        let rule = |out: &mut String, left: char, mid: char, right: char| {
            let _ = write!(out, "{:margin$}{left}", "");
            for c in 0..n_cols {
                out.push_str(&"─".repeat(width));
                out.push(if c + 1 == n_cols { right } else { mid });
            }
            out.push('\n');
        };
        rule(&mut out, '┌', '┬', '┐');
        for (r, header) in row_headers.iter().enumerate() {
            let _ = write!(out, "{:>w$} │", header, w = margin - 1);
            for c in 0..n_cols {
                let _ = write!(out, "{:^width$}│", label(r, c));
            }
            out.push('\n');
            if r + 1 < n_rows {
                rule(&mut out, '├', '┼', '┤');
            }
        }
        rule(&mut out, '└', '┴', '┘');
    }
    if n_planes > MAX_PLANES {
        let _ = writeln!(
            out,
            "({} more planes not drawn; use --json for every slice)",
            n_planes - MAX_PLANES
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use layout::{DimSpec, Layout};

    fn tl(dev: &[usize], names: &[&str], map: &[&str], shape: &[usize]) -> TensorLayout {
        let entries: Vec<DimSpec> = map.iter().map(|m| DimSpec::parse(m)).collect();
        Layout::new(dev, names, None)
            .unwrap()
            .apply(&entries)
            .unwrap()
            .bind(shape)
            .unwrap()
    }

    #[test]
    fn two_d_grid_labels_every_block() {
        let t = tl(&[2, 2, 2], &["dp", "sp", "mp"], &["dp", "mp"], &[8, 16]);
        let g = render(&t);
        assert!(g.contains("0,2") && g.contains("1,3") && g.contains("4,6") && g.contains("5,7"));
        // Legend, column headers, top rule, row, middle rule, row, bottom rule.
        assert_eq!(g.lines().count(), 7);
        assert!(g.contains("4:8 │"));
    }

    #[test]
    fn n_d_tensor_draws_one_plane_per_leading_block() {
        let t = tl(&[2, 2, 2], &["a", "b", "c"], &["a", "b", "c"], &[2, 4, 4]);
        let g = render(&t);
        assert_eq!(g.matches("plane dim 0").count(), 2);
        assert!(g.contains("plane dim 0 = 1:2"));
        let one_d = render(&tl(&[4], &["x"], &["x"], &[8]));
        assert!(one_d.contains("6:8") && one_d.contains(" 3 "));
    }

    #[test]
    fn blocks_of_a_zero_size_dim_are_drawn_where_they_are() {
        let g = render(&tl(&[2, 2], &["dp", "mp"], &["dp", "mp"], &[0, 4]));
        let rows: Vec<&str> = g.lines().filter(|l| l.starts_with("0:0")).collect();
        assert_eq!(rows.len(), 2, "{g}");
        assert!(rows[0].contains(" 0 ") && rows[0].contains(" 1 "), "{g}");
        assert!(rows[1].contains(" 2 ") && rows[1].contains(" 3 "), "{g}");
        let one_d = render(&tl(&[2], &["dp"], &["dp"], &[0]));
        assert!(one_d.contains("│  0  │  1  │"), "{one_d}");
    }

    #[test]
    fn ranks_compress_into_runs() {
        assert_eq!(compress_ranks(&[0, 1, 2, 3, 5, 7, 8]), "0-3,5,7,8");
    }
}
