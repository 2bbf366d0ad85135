//! Error messages name the operation and the culprit.

use tensor::kernels;
use tensor::{DType, Tensor};

#[test]
fn messages_name_op_and_culprit() {
    let table = Tensor::zeros(DType::F32, &[4, 2]);
    let ids = Tensor::from_vec(&[2], vec![1i64, 7]).unwrap();
    let message = kernels::embedding(&table, &ids).unwrap_err().to_string();
    assert_eq!(
        message,
        "embedding: index 7 at position 1 is out of range 0..4"
    );
    let a = Tensor::zeros(DType::F32, &[2, 3]);
    let message = kernels::add(&a, &Tensor::zeros(DType::F32, &[4]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        message,
        "add: shapes [2, 3] and [4] cannot be broadcast together"
    );
    let message = kernels::softmax(&Tensor::zeros(DType::I32, &[3]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        message,
        "softmax: dtype i32 is not supported (it needs a floating-point tensor)"
    );
    let mut out = [0f32; 2];
    let message = kernels::softmax_into(&[0f32; 3], 3, &mut out)
        .unwrap_err()
        .to_string();
    assert_eq!(message, "softmax: buffer `out` needs 3 elements but has 2");
}
