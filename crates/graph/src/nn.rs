//! Building blocks in the style of MindSpore's `nn` cells.
//!
//! A block is a plain configuration value implementing [`Cell`]; [`GraphBuilder::call`] builds it
//! in a named scope, so its parameters and nodes get hierarchical names as in MindSpore
//! (`b.call("fc1", &Dense::new(784, 512), x)` creates `fc1.weight`, `fc1.bias`, `fc1.matmul`,
//! `fc1.bias_add`). Defaults follow MindSpore 2.x.

use crate::builder::GraphBuilder;
use crate::error::GraphError;
use crate::init::{FanMode, Initializer};
use crate::ir::ValueId;

/// A reusable piece of network: builds its parameters and nodes in the current scope.
pub trait Cell {
    /// Builds the cell on input `x` and returns its output.
    fn build(&self, b: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError>;
}

/// An activation applied after a block, as a node named after it (`relu`, `gelu`, `tanh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// GeLU; the tanh approximation if `approximate` (MindSpore's `nn.GELU()` default).
    Gelu {
        /// Use the tanh approximation.
        approximate: bool,
    },
    /// `tanh(x)`.
    Tanh,
    /// The logistic sigmoid `1 / (1 + e^-x)`.
    Sigmoid,
}

impl Activation {
    /// Applies the activation to `x` as a node named `relu`, `gelu`, `tanh` or `sigmoid`.
    pub fn apply(self, b: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError> {
        match self {
            Activation::Relu => b.relu("relu", x),
            Activation::Gelu { approximate } => b.gelu("gelu", x, approximate),
            Activation::Tanh => b.tanh("tanh", x),
            Activation::Sigmoid => b.sigmoid("sigmoid", x),
        }
    }
}

/// MindSpore's `nn.Dense`: `y = activation(x·Wᵀ + b)` with `weight [out, in]` and `bias [out]`.
///
/// Nodes: `matmul` (MatMul with `transpose_b`, or BatchMatMul for inputs of rank > 2),
/// `bias_add`, then the activation. Defaults: weight `HeUniform(negative_slope=√5)`, bias
/// `Uniform(1/√in)` (MindSpore 2.x's `weight_init=None`, `bias_init=None`).
#[derive(Debug, Clone, PartialEq)]
pub struct Dense {
    /// Input features.
    pub in_channels: usize,
    /// Output features.
    pub out_channels: usize,
    /// Whether a bias is added.
    pub has_bias: bool,
    /// Activation after the bias.
    pub activation: Option<Activation>,
    /// Initializer of `weight`.
    pub weight_init: Initializer,
    /// Initializer of `bias`.
    pub bias_init: Initializer,
}

impl Dense {
    /// A dense layer with MindSpore's defaults: bias, no activation.
    pub fn new(in_channels: usize, out_channels: usize) -> Dense {
        Dense {
            in_channels,
            out_channels,
            has_bias: true,
            activation: None,
            weight_init: Initializer::HeUniform {
                negative_slope: 5f64.sqrt(),
                mode: FanMode::FanIn,
            },
            bias_init: Initializer::Uniform {
                scale: 1.0 / (in_channels.max(1) as f64).sqrt(),
            },
        }
    }

    /// With an activation.
    pub fn activation(mut self, activation: Activation) -> Dense {
        self.activation = Some(activation);
        self
    }

    /// Without a bias.
    pub fn without_bias(mut self) -> Dense {
        self.has_bias = false;
        self
    }

    /// With another weight initializer.
    pub fn weight_init(mut self, init: Initializer) -> Dense {
        self.weight_init = init;
        self
    }
}

impl Cell for Dense {
    fn build(&self, b: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError> {
        let shape = [self.out_channels, self.in_channels];
        let weight = b.parameter("weight", &shape, self.weight_init.clone())?;
        let mut y = if b.shape(x)?.len() > 2 {
            b.batch_matmul("matmul", x, weight, false, true)?
        } else {
            b.matmul_with("matmul", x, weight, false, true)?
        };
        if self.has_bias {
            let bias = b.parameter("bias", &[self.out_channels], self.bias_init.clone())?;
            y = b.bias_add("bias_add", y, bias)?;
        }
        match self.activation {
            Some(activation) => activation.apply(b, y),
            None => Ok(y),
        }
    }
}

/// A product with a weight parameter: `y = x·W` with `weight [in, out]` (or `[out, in]` used
/// transposed). One node, `matmul`. Default init: `HeUniform` scaled by the true fan-in `in`
/// (MindSpore's `fan_out` mode on an `[in, out]` weight).
#[derive(Debug, Clone, PartialEq)]
pub struct MatMulCell {
    /// Input features.
    pub in_channels: usize,
    /// Output features.
    pub out_channels: usize,
    /// Store the weight `[out, in]` and multiply by its transpose.
    pub transpose_b: bool,
    /// Initializer of `weight`.
    pub weight_init: Initializer,
}

impl MatMulCell {
    /// `x·W` with `W [in, out]`.
    pub fn new(in_channels: usize, out_channels: usize) -> MatMulCell {
        MatMulCell {
            in_channels,
            out_channels,
            transpose_b: false,
            weight_init: Initializer::HeUniform {
                negative_slope: 0.0,
                mode: FanMode::FanOut,
            },
        }
    }

    /// Stores the weight `[out, in]` and multiplies by its transpose (fan-in then `shape[1]`).
    pub fn transposed(mut self) -> MatMulCell {
        self.transpose_b = true;
        self.weight_init = Initializer::he_uniform();
        self
    }

    /// With another weight initializer.
    pub fn weight_init(mut self, init: Initializer) -> MatMulCell {
        self.weight_init = init;
        self
    }
}

impl Cell for MatMulCell {
    fn build(&self, b: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError> {
        let shape = if self.transpose_b {
            [self.out_channels, self.in_channels]
        } else {
            [self.in_channels, self.out_channels]
        };
        let weight = b.parameter("weight", &shape, self.weight_init.clone())?;
        b.matmul_with("matmul", x, weight, false, self.transpose_b)
    }
}

/// MindSpore's `nn.Embedding`: rows of `embedding_table [vocab, dim]` picked by integer ids.
/// One node, `gather`; default init `Normal(0.01)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    /// Rows of the table.
    pub vocab_size: usize,
    /// Width of a row.
    pub embedding_size: usize,
    /// Initializer of the table.
    pub init: Initializer,
}

impl Embedding {
    /// A `[vocab_size, embedding_size]` table initialised `Normal(0.01)`.
    pub fn new(vocab_size: usize, embedding_size: usize) -> Embedding {
        Embedding {
            vocab_size,
            embedding_size,
            init: Initializer::normal(0.01),
        }
    }
}

impl Cell for Embedding {
    fn build(&self, b: &mut GraphBuilder, ids: ValueId) -> Result<ValueId, GraphError> {
        let shape = [self.vocab_size, self.embedding_size];
        let table = b.parameter("embedding_table", &shape, self.init.clone())?;
        b.embedding("gather", table, ids)
    }
}

/// MindSpore's `nn.LayerNorm` over the last dim: parameters `gamma` (ones) and `beta` (zeros),
/// one node `layer_norm`, epsilon 1e-7 by default.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNorm {
    /// Size of the normalised (last) dim.
    pub normalized_size: usize,
    /// Added to the variance.
    pub epsilon: f64,
}

impl LayerNorm {
    /// Layer norm over a last dim of `normalized_size`.
    pub fn new(normalized_size: usize) -> LayerNorm {
        LayerNorm {
            normalized_size,
            epsilon: 1e-7,
        }
    }
}

impl Cell for LayerNorm {
    fn build(&self, b: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError> {
        let gamma = b.parameter("gamma", &[self.normalized_size], Initializer::Ones)?;
        let beta = b.parameter("beta", &[self.normalized_size], Initializer::Zeros)?;
        b.layer_norm("layer_norm", x, gamma, beta, self.epsilon)
    }
}

/// A multi-layer perceptron: [`Dense`] layers `layers.0`, `layers.1`, … through the given
/// widths, the activation (and optional dropout, node `dropout`) after every layer but the last.
#[derive(Debug, Clone, PartialEq)]
pub struct Mlp {
    /// Widths from the input to the output: `[784, 512, 512, 10]` is three layers.
    pub widths: Vec<usize>,
    /// Activation after the hidden layers.
    pub activation: Activation,
    /// `(keep_prob, seed)` of a dropout after each hidden activation (layer `i` uses `seed + i`).
    pub dropout: Option<(f64, u64)>,
}

impl Mlp {
    /// An MLP through `widths` with ReLU and no dropout.
    pub fn new(widths: &[usize]) -> Mlp {
        Mlp {
            widths: widths.to_vec(),
            activation: Activation::Relu,
            dropout: None,
        }
    }

    /// With another hidden activation.
    pub fn activation(mut self, activation: Activation) -> Mlp {
        self.activation = activation;
        self
    }

    /// With dropout after each hidden activation.
    pub fn dropout(mut self, keep_prob: f64, seed: u64) -> Mlp {
        self.dropout = Some((keep_prob, seed));
        self
    }
}

impl Cell for Mlp {
    fn build(&self, b: &mut GraphBuilder, x: ValueId) -> Result<ValueId, GraphError> {
        let n_layers = self.widths.len().saturating_sub(1);
        let mut h = x;
        for (i, pair) in self.widths.windows(2).enumerate() {
            let hidden = i + 1 < n_layers;
            let mut dense = Dense::new(pair[0], pair[1]);
            if hidden {
                dense = dense.activation(self.activation);
            }
            h = b.scope(&format!("layers.{i}"), |b| {
                let y = dense.build(b, h)?;
                match self.dropout {
                    Some((keep_prob, seed)) if hidden => {
                        b.dropout("dropout", y, keep_prob, seed.wrapping_add(i as u64))
                    }
                    _ => Ok(y),
                }
            })?;
        }
        Ok(h)
    }
}
