//! Parameter initializers, computed box by box from a counter-based RNG.
//!
//! [`Initializer::fill`] computes the values of any box of a parameter's *global* tensor. Element
//! `i` (global row-major flat index) of parameter `name` under seed `seed` is a pure function of
//! `(seed, name, i)` (see [`crate::rng`]), so every sharding of a parameter holds exactly the
//! values of the unsharded tensor, and no rank ever materialises more than its own box.
//!
//! The distributions follow `mindspore.common.initializer`:
//! - `HeUniform(negative_slope, mode)`: `U(-b, b)` with `b = gain·√(3/fan)`,
//!   `gain = √(2/(1 + negative_slope²))` (MindSpore's `leaky_relu` gain); `fan` is `fan_in`
//!   (`shape[1]·receptive field`) or `fan_out` (`shape[0]·receptive field`), the receptive field
//!   being the product of `shape[2..]`.
//! - `XavierUniform(gain)`: `U(-b, b)` with `b = gain·√(6/(fan_in + fan_out))`.
//! - `Uniform(scale)`: `U(-scale, scale)`.
//! - `Normal(sigma, mean)`: `N(mean, sigma²)`, by Box–Muller from two numbers of the stream.
//! - `Zeros`, `Ones`, `Constant(value)`.
//! - `Values(values)`: given values (MindSpore's `Parameter(Tensor(array))`), the global
//!   tensor's elements in row-major order; a box takes its elements of them, so every rank
//!   starts from its slice of the same array.
//!
//! The random *streams* are Tessera's own (MindSpore draws from a process-global generator), so
//! values are not bit-identical to MindSpore's, only identically distributed.

use std::sync::Arc;

use layout::SliceBox;
use tensor::{DType, Tensor};

use crate::error::GraphError;
use crate::rng::{bits_at, for_each_global_run, region_fits, stream_key, unit_f64};

/// Which fan a He initializer scales by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FanMode {
    /// `shape[1]` times the receptive field: preserves the forward pass's variance for a weight
    /// stored `[out, in]` (MindSpore's `Dense`).
    FanIn,
    /// `shape[0]` times the receptive field: for a weight stored `[in, out]` and used as `x·W`
    /// this is the true fan-in.
    FanOut,
}

/// How a parameter's initial values are computed.
#[derive(Debug, Clone, PartialEq)]
pub enum Initializer {
    /// MindSpore's `HeUniform(negative_slope, mode, nonlinearity='leaky_relu')`.
    HeUniform {
        /// The rectifier's negative slope (0 for ReLU; MindSpore's `Dense` uses √5).
        negative_slope: f64,
        /// Which fan to scale by.
        mode: FanMode,
    },
    /// MindSpore's `XavierUniform(gain)`.
    XavierUniform {
        /// Scale factor.
        gain: f64,
    },
    /// MindSpore's `Uniform(scale)`: `U(-scale, scale)`.
    Uniform {
        /// Half-width of the interval.
        scale: f64,
    },
    /// MindSpore's `Normal(sigma, mean)`.
    Normal {
        /// Standard deviation.
        sigma: f64,
        /// Mean.
        mean: f64,
    },
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// Every element `value`.
    Constant(f64),
    /// Given values: the global tensor's elements in row-major order (as many as it has).
    Values(Arc<[f64]>),
}

impl Initializer {
    /// MindSpore's default `HeUniform()`: slope 0, fan_in.
    pub fn he_uniform() -> Initializer {
        Initializer::HeUniform {
            negative_slope: 0.0,
            mode: FanMode::FanIn,
        }
    }

    /// `Normal(sigma)` around 0.
    pub fn normal(sigma: f64) -> Initializer {
        Initializer::Normal { sigma, mean: 0.0 }
    }

    /// The initializer's MindSpore name (`HeUniform`, `Normal`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Initializer::HeUniform { .. } => "HeUniform",
            Initializer::XavierUniform { .. } => "XavierUniform",
            Initializer::Uniform { .. } => "Uniform",
            Initializer::Normal { .. } => "Normal",
            Initializer::Zeros => "Zeros",
            Initializer::Ones => "Ones",
            Initializer::Constant(_) => "Constant",
            Initializer::Values(_) => "Values",
        }
    }

    /// Checks that the initializer can fill a parameter of `shape` and `dtype`.
    pub fn validate(&self, param: &str, shape: &[usize], dtype: DType) -> Result<(), GraphError> {
        self.distribution(param, shape, dtype).map(|_| ())
    }

    /// The values of `region` of parameter `param_name` (global shape `global_shape`) under
    /// `seed`, as a tensor of `region.shape` and `dtype`.
    ///
    /// The result depends on `(seed, param_name, global index)` only: the union of the boxes of
    /// any sharding equals `fill` of the full box.
    pub fn fill(
        &self,
        global_shape: &[usize],
        region: &SliceBox,
        dtype: DType,
        seed: u64,
        param_name: &str,
    ) -> Result<Tensor, GraphError> {
        let distribution = self.distribution(param_name, global_shape, dtype)?;
        if !region_fits(&region.offset, &region.shape, global_shape) {
            return Err(GraphError::RegionOutOfRange {
                context: format!("parameter `{param_name}`"),
                region: Box::new(region.clone()),
                shape: global_shape.to_vec(),
            });
        }
        let key = stream_key(seed, param_name);
        let mut values = vec![0.0f64; region.n_elements()];
        for_each_global_run(
            global_shape,
            &region.offset,
            &region.shape,
            |local, global, len| {
                let out = &mut values[local..local + len];
                match (self, distribution) {
                    (Initializer::Values(given), _) => {
                        out.copy_from_slice(&given[global..global + len]);
                    }
                    (_, Some(distribution)) => {
                        for (k, v) in out.iter_mut().enumerate() {
                            *v = distribution.sample(key, (global + k) as u64);
                        }
                    }
                    (_, None) => unreachable!("only Values has no distribution"),
                }
            },
        );
        let tensor = match dtype {
            DType::F64 => Tensor::from_vec(&region.shape, values),
            DType::F32 => {
                Tensor::from_vec(&region.shape, values.iter().map(|&v| v as f32).collect())
            }
            _ => Tensor::from_vec(&region.shape, values).map(|t| t.to_dtype(dtype)),
        };
        Ok(tensor.expect("one value per element of the region"))
    }

    /// The distribution this initializer draws from for a parameter of `shape` (`None` for
    /// `Values`, checked to hold one value per element).
    fn distribution(
        &self,
        param: &str,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Option<Distribution>, GraphError> {
        let init = self.name();
        let error = |reason: String| GraphError::Init {
            param: param.to_string(),
            init,
            reason,
        };
        let random = !matches!(
            self,
            Initializer::Zeros
                | Initializer::Ones
                | Initializer::Constant(_)
                | Initializer::Values(_)
        );
        if random && !dtype.is_float() {
            return Err(error(format!("needs a floating-point dtype, got {dtype}")));
        }
        let distribution = match *self {
            Initializer::Values(ref given) => {
                let n: usize = shape.iter().product();
                if given.len() != n {
                    return Err(error(format!(
                        "holds {} values for shape {shape:?} ({n} elements)",
                        given.len()
                    )));
                }
                if let Some(bad) = given.iter().find(|v| !v.is_finite()) {
                    return Err(error(format!("holds a value that is not finite ({bad})")));
                }
                return Ok(None);
            }
            Initializer::HeUniform {
                negative_slope,
                mode,
            } => {
                if !negative_slope.is_finite() {
                    return Err(error(format!(
                        "needs a finite negative_slope, got {negative_slope}"
                    )));
                }
                let (fan_in, fan_out) = fans(shape).map_err(error)?;
                let fan = match mode {
                    FanMode::FanIn => fan_in,
                    FanMode::FanOut => fan_out,
                };
                let gain = (2.0 / (1.0 + negative_slope * negative_slope)).sqrt();
                Distribution::Uniform(gain * (3.0 / fan as f64).sqrt())
            }
            Initializer::XavierUniform { gain } => {
                if !gain.is_finite() {
                    return Err(error(format!("needs a finite gain, got {gain}")));
                }
                let (fan_in, fan_out) = fans(shape).map_err(error)?;
                Distribution::Uniform(gain * (6.0 / (fan_in + fan_out) as f64).sqrt())
            }
            Initializer::Uniform { scale } => {
                if !scale.is_finite() || scale < 0.0 {
                    return Err(error(format!("needs a finite scale >= 0, got {scale}")));
                }
                Distribution::Uniform(scale)
            }
            Initializer::Normal { sigma, mean } => {
                if !sigma.is_finite() || sigma < 0.0 || !mean.is_finite() {
                    return Err(error(format!(
                        "needs a finite sigma >= 0 and a finite mean, got sigma {sigma}, mean {mean}"
                    )));
                }
                Distribution::Normal { sigma, mean }
            }
            Initializer::Zeros => Distribution::Constant(0.0),
            Initializer::Ones => Distribution::Constant(1.0),
            Initializer::Constant(value) => {
                if !value.is_finite() {
                    return Err(error(format!("needs a finite value, got {value}")));
                }
                Distribution::Constant(value)
            }
        };
        Ok(Some(distribution))
    }
}

/// MindSpore's `_calculate_fan_in_and_fan_out`: `(shape[1]·rf, shape[0]·rf)` with `rf` the product
/// of `shape[2..]`; an error below 2 dims or for a zero fan.
fn fans(shape: &[usize]) -> Result<(usize, usize), String> {
    if shape.len() < 2 {
        return Err(format!(
            "needs at least 2 dims to compute fan_in and fan_out, got shape {shape:?}"
        ));
    }
    let receptive: usize = shape[2..].iter().product();
    let (fan_in, fan_out) = (shape[1] * receptive, shape[0] * receptive);
    if fan_in == 0 || fan_out == 0 {
        return Err(format!("has a zero fan for shape {shape:?}"));
    }
    Ok((fan_in, fan_out))
}

/// A resolved distribution: what one element's value is, given its stream and index.
#[derive(Debug, Clone, Copy)]
enum Distribution {
    Uniform(f64),
    Normal { sigma: f64, mean: f64 },
    Constant(f64),
}

impl Distribution {
    /// The value of element `index` of stream `key`.
    #[inline]
    fn sample(self, key: u64, index: u64) -> f64 {
        match self {
            Distribution::Uniform(bound) => (2.0 * unit_f64(bits_at(key, index)) - 1.0) * bound,
            Distribution::Normal { sigma, mean } => {
                // Box–Muller on numbers 2i and 2i+1 of the stream; 1 - u is in (0, 1].
                let u1 = 1.0 - unit_f64(bits_at(key, 2 * index));
                let u2 = unit_f64(bits_at(key, 2 * index + 1));
                let radius = (-2.0 * u1.ln()).sqrt();
                mean + sigma * radius * (std::f64::consts::TAU * u2).cos()
            }
            Distribution::Constant(value) => value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(init: &Initializer, shape: &[usize]) -> Vec<f64> {
        init.fill(shape, &SliceBox::full(shape), DType::F64, 7, "w")
            .unwrap()
            .to_f64_vec()
    }

    #[test]
    fn he_uniform_bound_follows_mindspore() {
        // fan_in = shape[1] = 50, gain √2: bound √(6/50).
        let values = full(&Initializer::he_uniform(), &[40, 50]);
        let bound = (6.0f64 / 50.0).sqrt();
        assert!(values.iter().all(|v| v.abs() <= bound));
        let max = values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(
            max > 0.95 * bound,
            "2000 draws reach near the bound, got {max}"
        );
        let fan_out = Initializer::HeUniform {
            negative_slope: 0.0,
            mode: FanMode::FanOut,
        };
        let values = full(&fan_out, &[40, 50]);
        assert!(values.iter().all(|v| v.abs() <= (6.0f64 / 40.0).sqrt()));
    }

    #[test]
    fn normal_moments() {
        let values = full(&Initializer::normal(0.5), &[100, 100]);
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        // Standard errors: mean 0.005, variance ≈ 0.25·√(2/n) ≈ 0.0035.
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 0.25).abs() < 0.015, "variance {var}");
    }

    #[test]
    fn values_fill_every_box_with_its_slice_of_the_array() {
        let given: Vec<f64> = (0..24).map(|i| i as f64 * 0.5 - 3.0).collect();
        let init = Initializer::Values(given.clone().into());
        let shape = [4, 6];
        assert_eq!(full(&init, &shape), given);
        // a 2×3 grid of boxes: each holds exactly its elements of the array
        for (r, c) in [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)] {
            let b = SliceBox::new(vec![2 * r, 2 * c], vec![2, 2]);
            let got = init.fill(&shape, &b, DType::F32, 9, "w").unwrap();
            let want: Vec<f32> = (0..2)
                .flat_map(|i| (0..2).map(move |j| (2 * r + i) * 6 + 2 * c + j))
                .map(|k| given[k] as f32)
                .collect();
            assert_eq!(got.as_f32().unwrap(), want.as_slice(), "box {r},{c}");
        }
        let err = init.validate("fc.weight", &[5, 5], DType::F32).unwrap_err();
        assert_eq!(
            err.to_string(),
            "parameter `fc.weight`: initializer Values holds 24 values for shape [5, 5] (25 \
             elements)"
        );
        let nan = Initializer::Values(vec![f64::NAN].into());
        assert!(nan.validate("b", &[1], DType::F32).is_err());
    }

    #[test]
    fn errors_name_the_parameter_and_rule() {
        let err = Initializer::he_uniform()
            .fill(&[10], &SliceBox::full(&[10]), DType::F32, 0, "fc.bias")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "parameter `fc.bias`: initializer HeUniform needs at least 2 dims to compute fan_in \
             and fan_out, got shape [10]"
        );
        let err = Initializer::Zeros
            .fill(
                &[4, 4],
                &SliceBox::new(vec![2, 0], vec![3, 4]),
                DType::F32,
                0,
                "w",
            )
            .unwrap_err();
        assert!(matches!(err, GraphError::RegionOutOfRange { .. }));
        assert!(Initializer::normal(1.0)
            .validate("ids", &[3], DType::I32)
            .is_err());
        assert_eq!(
            full(&Initializer::Constant(2.5), &[2]),
            vec![2.5, 2.5],
            "constants fill every element"
        );
    }
}
