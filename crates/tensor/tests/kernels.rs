//! Every CPU kernel against a naive f64 reference, gradients against analytic references and
//! central finite differences, and the algebraic properties (proptest).
//!
//! One test binary (`cargo test -p tessera-tensor --test kernels`); one module per kernel family.

mod kernels {
    pub mod reference;

    mod attention;
    mod binary;
    mod embedding;
    mod errors;
    mod loss;
    mod matmul;
    mod norm;
    mod packed_attention;
    mod permute;
    mod reduce;
    mod softmax;
    mod unary;
    mod vector;
}
