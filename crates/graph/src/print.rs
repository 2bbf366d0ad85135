//! What [`crate::Op::Print`] writes: its label, then the value as MindSpore prints a tensor,
//! `Tensor(shape=[2, 3], dtype=Float32, value=` and the elements in numpy's layout (nested
//! brackets, one row per line; more than 1000 elements are summarised by the first and last
//! three along each dim, `...` between), then `)`. One print is one write to standard output,
//! so the prints of several ranks (threads) do not interleave within a value.

use std::io::Write as _;

use tensor::{DType, Tensor};

/// Elements above which a value is summarised (numpy's `threshold`).
const THRESHOLD: usize = 1000;
/// Elements kept at each end of a summarised dim (numpy's `edgeitems`).
const EDGE: usize = 3;

/// Prints `label` and `value` to standard output (errors writing it are ignored, as `print!`
/// would panic on them and a print must not stop training).
pub fn print_value(label: &str, value: &Tensor) {
    let text = format_value(label, value);
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// The text [`print_value`] writes.
pub fn format_value(label: &str, value: &Tensor) -> String {
    let shape = value.shape();
    let data = value.to_f64_vec();
    let summarise = data.len() > THRESHOLD;
    let mut body = String::new();
    nested(&mut body, &data, shape, 0, value.dtype(), summarise);
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let mut text = String::new();
    if !label.is_empty() {
        text.push_str(label);
        text.push('\n');
    }
    text.push_str(&format!(
        "Tensor(shape=[{}], dtype={}, value=\n{body})\n",
        dims.join(", "),
        dtype_name(value.dtype())
    ));
    text
}

/// MindSpore's name of `dtype`.
fn dtype_name(dtype: DType) -> String {
    let name = format!("{dtype:?}").to_lowercase();
    let (kind, bits) = name.split_at(1);
    match kind {
        "f" => format!("Float{bits}"),
        "i" => format!("Int{bits}"),
        "u" => format!("UInt{bits}"),
        _ => name.clone(),
    }
}

fn element(x: f64, dtype: DType) -> String {
    if dtype.is_float() {
        format!("{x:.6e}")
    } else {
        format!("{x}")
    }
}

/// Appends the elements of `data` (row-major, `shape`) from dim `depth` on, as nested lists.
fn nested(out: &mut String, data: &[f64], shape: &[usize], depth: usize, dtype: DType, cut: bool) {
    if depth == shape.len() {
        out.push_str(&element(data.first().copied().unwrap_or(0.0), dtype));
        return;
    }
    let n = shape[depth];
    let stride: usize = shape[depth + 1..].iter().product();
    let shown: Vec<Option<usize>> = if cut && n > 2 * EDGE {
        (0..EDGE)
            .map(Some)
            .chain(std::iter::once(None))
            .chain((n - EDGE..n).map(Some))
            .collect()
    } else {
        (0..n).map(Some).collect()
    };
    out.push('[');
    let last_dim = depth + 1 == shape.len();
    for (k, index) in shown.iter().enumerate() {
        if k > 0 {
            if last_dim {
                out.push(' ');
            } else {
                out.push('\n');
                out.push_str(&" ".repeat(depth + 1));
            }
        }
        match index {
            Some(i) => nested(
                out,
                &data[i * stride..(i + 1) * stride],
                shape,
                depth + 1,
                dtype,
                cut,
            ),
            None => out.push_str("..."),
        }
    }
    out.push(']');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_matrix_prints_whole_in_numpys_layout() {
        let t = Tensor::from_vec(&[2, 3], vec![1f32, -2., 3., 4., 5., 6.5]).unwrap();
        assert_eq!(
            format_value("out is:", &t),
            "out is:\nTensor(shape=[2, 3], dtype=Float32, value=\n\
             [[1.000000e0 -2.000000e0 3.000000e0]\n [4.000000e0 5.000000e0 6.500000e0]])\n"
        );
    }

    #[test]
    fn a_large_value_keeps_three_items_at_each_end_of_every_dim() {
        let t = Tensor::from_vec(&[40, 40], (0..1600).map(|i| i as f32).collect()).unwrap();
        let text = format_value("", &t);
        assert!(text.starts_with("Tensor(shape=[40, 40], dtype=Float32, value=\n[[0.000000e0 "));
        let rows: Vec<&str> = text.lines().skip(1).collect();
        // 3 rows, "...", 3 rows; each row 3 items, "...", 3 items.
        assert_eq!(rows.len(), 7, "{text}");
        assert_eq!(rows[3].trim(), "...");
        assert!(rows[0].contains("2.000000e0 ... 3.700000e1"), "{}", rows[0]);
        assert!(rows[6].ends_with("1.599000e3]])"), "{}", rows[6]);
    }

    #[test]
    fn integers_print_as_integers() {
        let t = Tensor::from_vec(&[3], vec![1i32, 2, 3]).unwrap();
        assert!(format_value("", &t).contains("dtype=Int32, value=\n[1 2 3])"));
    }
}
