//! Tensors on the wire: f32 values, little-endian, checked against the shape the receiver
//! expects before anything is allocated from a message's sizes.

use tensor::{DType, Tensor};

use crate::error::PsError;
use crate::proto::TensorMsg;

/// `t` (f32) as a message named `name`.
pub fn to_msg(name: &str, t: &Tensor) -> TensorMsg {
    TensorMsg {
        name: name.to_string(),
        shape: t.shape().iter().map(|&d| d as u64).collect(),
        data: t.as_bytes().to_vec(),
    }
}

/// The tensor of `msg`, which must be `name` with shape `expected` (f32): a message of any
/// other name, shape or byte length is refused, naming the rule.
pub fn from_msg(msg: &TensorMsg, name: &str, expected: &[usize]) -> Result<Tensor, PsError> {
    if msg.name != name {
        return Err(PsError::message(
            format!("tensor {}", msg.name),
            format!("expected tensor {name}"),
        ));
    }
    let shape_ok = msg.shape.len() == expected.len()
        && msg.shape.iter().zip(expected).all(|(&a, &b)| a == b as u64);
    if !shape_ok {
        return Err(PsError::message(
            format!("tensor {name}"),
            format!("shape {:?}, expected {expected:?}", msg.shape),
        ));
    }
    let want = expected.iter().product::<usize>() * 4;
    if msg.data.len() != want {
        return Err(PsError::message(
            format!("tensor {name}"),
            format!(
                "{} bytes, expected {want} (f32 {expected:?})",
                msg.data.len()
            ),
        ));
    }
    Tensor::from_bytes(DType::F32, expected, &msg.data)
        .map_err(|e| PsError::tensor(format!("decoding tensor {name}"), e))
}

/// The first value of `values` that is not finite, with its index: a NaN or an infinity in a
/// gradient would turn the parameters it updates into NaN for good.
pub fn first_non_finite(values: &[f32]) -> Option<(usize, f32)> {
    values
        .iter()
        .position(|v| !v.is_finite())
        .map(|i| (i, values[i]))
}

/// Checks a gradient `values` of `what` (`the gradient of fc1_weight`) holds only finite
/// values; the error names it, the first bad value and its index, and the likely cause.
pub fn check_finite(what: &str, values: &[f32]) -> Result<(), PsError> {
    match first_non_finite(values) {
        None => Ok(()),
        Some((i, v)) => Err(PsError::message(
            what,
            format!(
                "holds {v} at index {i}: a non-finite gradient would make the parameters non-finite (the training diverged: lower train.learning_rate or set train.max_grad_norm)"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let t = Tensor::from_vec(&[2, 2], vec![1.0f32, -2.0, 3.5, 0.25]).unwrap();
        let msg = to_msg("w", &t);
        let back = from_msg(&msg, "w", &[2, 2]).unwrap();
        assert_eq!(back.as_f32().unwrap(), t.as_f32().unwrap());
        assert!(from_msg(&msg, "v", &[2, 2])
            .unwrap_err()
            .to_string()
            .contains("expected tensor v"));
        assert!(from_msg(&msg, "w", &[4])
            .unwrap_err()
            .to_string()
            .contains("shape"));
        let mut short = msg.clone();
        short.data.pop();
        assert!(from_msg(&short, "w", &[2, 2])
            .unwrap_err()
            .to_string()
            .contains("15 bytes"));
    }
}
