//! The host tensor: a dtype, a shape and contiguous row-major storage.

use half::{bf16, f16};
use layout::SliceBox;

use crate::dtype::DType;
use crate::error::TensorError;
use crate::region::{check_region, copy_region, Placement};

/// Typed, contiguous, row-major element storage. One variant per [`DType`]; `Bool` is stored
/// as one byte per element (0 or 1).
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Storage {
    F64(Vec<f64>),
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    I16(Vec<i16>),
    I8(Vec<i8>),
    U64(Vec<u64>),
    U32(Vec<u32>),
    U16(Vec<u16>),
    U8(Vec<u8>),
    Bool(Vec<u8>),
}

/// Runs `$body` with `$v` bound to the typed vector inside a [`Storage`].
macro_rules! with_storage {
    ($storage:expr, $v:ident => $body:expr) => {
        match $storage {
            Storage::F64($v) => $body,
            Storage::F32($v) => $body,
            Storage::F16($v) => $body,
            Storage::BF16($v) => $body,
            Storage::I64($v) => $body,
            Storage::I32($v) => $body,
            Storage::I16($v) => $body,
            Storage::I8($v) => $body,
            Storage::U64($v) => $body,
            Storage::U32($v) => $body,
            Storage::U16($v) => $body,
            Storage::U8($v) => $body,
            Storage::Bool($v) => $body,
        }
    };
}

impl Storage {
    /// Zero-filled storage of `n` elements.
    pub fn zeros(dtype: DType, n: usize) -> Storage {
        match dtype {
            DType::F64 => Storage::F64(vec![0.0; n]),
            DType::F32 => Storage::F32(vec![0.0; n]),
            DType::F16 => Storage::F16(vec![f16::ZERO; n]),
            DType::BF16 => Storage::BF16(vec![bf16::ZERO; n]),
            DType::I64 => Storage::I64(vec![0; n]),
            DType::I32 => Storage::I32(vec![0; n]),
            DType::I16 => Storage::I16(vec![0; n]),
            DType::I8 => Storage::I8(vec![0; n]),
            DType::U64 => Storage::U64(vec![0; n]),
            DType::U32 => Storage::U32(vec![0; n]),
            DType::U16 => Storage::U16(vec![0; n]),
            DType::U8 => Storage::U8(vec![0; n]),
            DType::Bool => Storage::Bool(vec![0; n]),
        }
    }

    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        match self {
            Storage::F64(_) => DType::F64,
            Storage::F32(_) => DType::F32,
            Storage::F16(_) => DType::F16,
            Storage::BF16(_) => DType::BF16,
            Storage::I64(_) => DType::I64,
            Storage::I32(_) => DType::I32,
            Storage::I16(_) => DType::I16,
            Storage::I8(_) => DType::I8,
            Storage::U64(_) => DType::U64,
            Storage::U32(_) => DType::U32,
            Storage::U16(_) => DType::U16,
            Storage::U8(_) => DType::U8,
            Storage::Bool(_) => DType::Bool,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_storage!(self, v => v.len())
    }

    /// Whether there is no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The raw little-endian bytes.
    pub fn as_bytes(&self) -> &[u8] {
        with_storage!(self, v => bytemuck::cast_slice(v))
    }

    /// The raw bytes, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        with_storage!(self, v => bytemuck::cast_slice_mut(v))
    }
}

/// An element type a [`Tensor`] can be built from and viewed as.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The dtype of this element type.
    const DTYPE: DType;
    /// Wraps a vector in the matching storage variant.
    fn into_storage(data: Vec<Self>) -> Storage;
    /// The typed view of a storage, if the dtype matches.
    fn view(storage: &Storage) -> Option<&[Self]>;
    /// The typed mutable view of a storage, if the dtype matches.
    fn view_mut(storage: &mut Storage) -> Option<&mut [Self]>;
}

macro_rules! element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn into_storage(data: Vec<Self>) -> Storage {
                Storage::$variant(data)
            }
            fn view(storage: &Storage) -> Option<&[Self]> {
                match storage {
                    Storage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn view_mut(storage: &mut Storage) -> Option<&mut [Self]> {
                match storage {
                    Storage::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
element!(f64, F64);
element!(f32, F32);
element!(f16, F16);
element!(bf16, BF16);
element!(i64, I64);
element!(i32, I32);
element!(i16, I16);
element!(i8, I8);
element!(u64, U64);
element!(u32, U32);
element!(u16, U16);
element!(u8, U8);

/// A host tensor: contiguous row-major storage and a shape. A 0-dim tensor (shape `[]`) holds one
/// element.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    storage: Storage,
}

impl Tensor {
    /// A zero-filled tensor.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            storage: Storage::zeros(dtype, shape.iter().product()),
        }
    }

    /// A tensor from typed data in row-major order.
    pub fn from_vec<T: Element>(shape: &[usize], data: Vec<T>) -> Result<Tensor, TensorError> {
        let expected: usize = shape.iter().product();
        if data.len() != expected {
            return Err(TensorError::ElementCount {
                op: "from_vec",
                shape: shape.to_vec(),
                expected,
                got: data.len(),
            });
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            storage: T::into_storage(data),
        })
    }

    /// A tensor from storage; the storage length must match the shape.
    pub fn from_storage(shape: &[usize], storage: Storage) -> Result<Tensor, TensorError> {
        let expected: usize = shape.iter().product();
        if storage.len() != expected {
            return Err(TensorError::ElementCount {
                op: "from_storage",
                shape: shape.to_vec(),
                expected,
                got: storage.len(),
            });
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            storage,
        })
    }

    /// A bool tensor from `bool`s.
    pub fn from_bools(shape: &[usize], data: &[bool]) -> Result<Tensor, TensorError> {
        Tensor::from_storage(
            shape,
            Storage::Bool(data.iter().map(|&b| u8::from(b)).collect()),
        )
    }

    /// A tensor from raw little-endian bytes (copied, so any alignment is accepted).
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor, TensorError> {
        let n: usize = shape.iter().product();
        let expected = n * dtype.size_in_bytes();
        if bytes.len() != expected {
            return Err(TensorError::ByteCount {
                op: "from_bytes",
                shape: shape.to_vec(),
                dtype,
                expected,
                got: bytes.len(),
            });
        }
        let mut t = Tensor::zeros(dtype, shape);
        t.storage.as_bytes_mut().copy_from_slice(bytes);
        Ok(t)
    }

    /// A 0-dim tensor holding one f32.
    pub fn scalar(value: f32) -> Tensor {
        Tensor {
            shape: Vec::new(),
            storage: Storage::F32(vec![value]),
        }
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of dims.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.storage.len()
    }

    /// Size of the data in bytes.
    pub fn n_bytes(&self) -> usize {
        self.n_elements() * self.dtype().size_in_bytes()
    }

    /// The storage.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The storage, writable.
    pub fn storage_mut(&mut self) -> &mut Storage {
        &mut self.storage
    }

    /// Takes the storage out.
    pub fn into_storage(self) -> Storage {
        self.storage
    }

    /// The raw little-endian bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.storage.as_bytes()
    }

    /// The raw bytes, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.storage.as_bytes_mut()
    }

    /// The elements as `&[T]`, or a dtype error naming `op`.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], TensorError> {
        T::view(&self.storage).ok_or(TensorError::DTypeMismatch {
            op: "as_slice",
            expected: T::DTYPE,
            got: self.dtype(),
        })
    }

    /// The elements as `&mut [T]`.
    pub fn as_slice_mut<T: Element>(&mut self) -> Result<&mut [T], TensorError> {
        let got = self.dtype();
        T::view_mut(&mut self.storage).ok_or(TensorError::DTypeMismatch {
            op: "as_slice_mut",
            expected: T::DTYPE,
            got,
        })
    }

    /// The f32 elements (the common case).
    pub fn as_f32(&self) -> Result<&[f32], TensorError> {
        self.as_slice::<f32>()
    }

    /// The f32 elements, writable.
    pub fn as_f32_mut(&mut self) -> Result<&mut [f32], TensorError> {
        self.as_slice_mut::<f32>()
    }

    /// Every element converted to f64 (bools as 0/1).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match &self.storage {
            Storage::F64(v) => v.clone(),
            Storage::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Storage::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Storage::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Storage::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Storage::I32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Storage::I16(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Storage::I8(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Storage::U64(v) => v.iter().map(|&x| x as f64).collect(),
            Storage::U32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Storage::U16(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Storage::U8(v) | Storage::Bool(v) => v.iter().map(|&x| f64::from(x)).collect(),
        }
    }

    /// A copy converted to `dtype` (through f64; floats round to nearest, ties to even, integers
    /// truncate toward zero and saturate, bools become `x != 0`).
    pub fn to_dtype(&self, dtype: DType) -> Tensor {
        if dtype == self.dtype() {
            return self.clone();
        }
        let values = self.to_f64_vec();
        let storage = match dtype {
            DType::F64 => Storage::F64(values),
            DType::F32 => Storage::F32(values.iter().map(|&x| x as f32).collect()),
            DType::F16 => Storage::F16(values.iter().map(|&x| f64_to_f16(x)).collect()),
            DType::BF16 => Storage::BF16(values.iter().map(|&x| f64_to_bf16(x)).collect()),
            DType::I64 => Storage::I64(values.iter().map(|&x| x as i64).collect()),
            DType::I32 => Storage::I32(values.iter().map(|&x| x as i32).collect()),
            DType::I16 => Storage::I16(values.iter().map(|&x| x as i16).collect()),
            DType::I8 => Storage::I8(values.iter().map(|&x| x as i8).collect()),
            DType::U64 => Storage::U64(values.iter().map(|&x| x as u64).collect()),
            DType::U32 => Storage::U32(values.iter().map(|&x| x as u32).collect()),
            DType::U16 => Storage::U16(values.iter().map(|&x| x as u16).collect()),
            DType::U8 => Storage::U8(values.iter().map(|&x| x as u8).collect()),
            DType::Bool => Storage::Bool(values.iter().map(|&x| u8::from(x != 0.0)).collect()),
        };
        Tensor {
            shape: self.shape.clone(),
            storage,
        }
    }

    /// The same data with another shape of equal element count.
    pub fn reshape(self, shape: &[usize]) -> Result<Tensor, TensorError> {
        let n: usize = shape.iter().product();
        if n != self.n_elements() {
            return Err(TensorError::ShapeMismatch {
                op: "reshape",
                lhs: self.shape,
                rhs: shape.to_vec(),
            });
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            storage: self.storage,
        })
    }

    /// A new tensor holding the elements of `region` (global coordinates of this tensor).
    pub fn extract_box(&self, region: &SliceBox) -> Result<Tensor, TensorError> {
        if !check_region(region, &self.shape) {
            return Err(TensorError::BoxOutOfRange {
                op: "extract_box",
                region: Box::new(region.clone()),
                shape: self.shape.clone(),
            });
        }
        let mut out = Tensor::zeros(self.dtype(), &region.shape);
        let zero = vec![0; region.ndim()];
        copy_region(
            self.as_bytes(),
            Placement {
                shape: &self.shape,
                offset: &region.offset,
            },
            out.as_bytes_mut(),
            Placement {
                shape: &region.shape,
                offset: &zero,
            },
            &region.shape,
            self.dtype().size_in_bytes(),
        );
        Ok(out)
    }

    /// Writes `piece` into `region` of this tensor. `piece` must have `region`'s shape and this
    /// tensor's dtype.
    pub fn insert_box(&mut self, region: &SliceBox, piece: &Tensor) -> Result<(), TensorError> {
        if piece.dtype() != self.dtype() {
            return Err(TensorError::DTypeMismatch {
                op: "insert_box",
                expected: self.dtype(),
                got: piece.dtype(),
            });
        }
        if piece.shape[..] != region.shape[..] {
            return Err(TensorError::ShapeMismatch {
                op: "insert_box",
                lhs: region.shape.to_vec(),
                rhs: piece.shape.clone(),
            });
        }
        if !check_region(region, &self.shape) {
            return Err(TensorError::BoxOutOfRange {
                op: "insert_box",
                region: Box::new(region.clone()),
                shape: self.shape.clone(),
            });
        }
        let zero = vec![0; region.ndim()];
        let elem = self.dtype().size_in_bytes();
        let shape = self.shape.clone();
        copy_region(
            piece.as_bytes(),
            Placement {
                shape: &piece.shape,
                offset: &zero,
            },
            self.as_bytes_mut(),
            Placement {
                shape: &shape,
                offset: &region.offset,
            },
            &region.shape,
            elem,
        );
        Ok(())
    }

    /// Concatenates tensors of one dtype along `dim`; all other dims must agree.
    pub fn concat(tensors: &[Tensor], dim: usize) -> Result<Tensor, TensorError> {
        let first = tensors.first().ok_or(TensorError::InvalidArgument {
            op: "concat",
            reason: "no tensors to concatenate".to_string(),
        })?;
        if dim >= first.ndim() {
            return Err(TensorError::DimOutOfRange {
                op: "concat",
                dim,
                ndim: first.ndim(),
            });
        }
        let mut shape = first.shape.clone();
        shape[dim] = 0;
        for t in tensors {
            if t.dtype() != first.dtype() {
                return Err(TensorError::DTypeMismatch {
                    op: "concat",
                    expected: first.dtype(),
                    got: t.dtype(),
                });
            }
            let same_other_dims = t.ndim() == first.ndim()
                && (0..t.ndim()).all(|d| d == dim || t.shape[d] == first.shape[d]);
            if !same_other_dims {
                return Err(TensorError::ShapeMismatch {
                    op: "concat",
                    lhs: first.shape.clone(),
                    rhs: t.shape.clone(),
                });
            }
            shape[dim] += t.shape[dim];
        }
        let mut out = Tensor::zeros(first.dtype(), &shape);
        let mut offset = vec![0; shape.len()];
        for t in tensors {
            out.insert_box(&SliceBox::new(offset.clone(), t.shape.clone()), t)?;
            offset[dim] += t.shape[dim];
        }
        Ok(out)
    }
}

/// `x` rounded to f32 *to odd*: truncated toward zero, with the last mantissa bit set when
/// inexact. A second rounding of the result to a format with at least two fewer mantissa bits
/// (f16, bf16) then gives exactly the correctly rounded value of `x`, which rounding to nearest
/// twice does not (`half`'s `from_f64` goes through f32 that way).
fn f64_to_f32_round_odd(x: f64) -> f32 {
    let nearest = x as f32;
    if !nearest.is_finite() || f64::from(nearest) == x {
        return nearest;
    }
    let truncated = if f64::from(nearest).abs() > x.abs() {
        f32::from_bits(nearest.to_bits() - 1) // one step toward zero (either sign)
    } else {
        nearest
    };
    f32::from_bits(truncated.to_bits() | 1)
}

/// `x` rounded to the nearest f16 (ties to even).
fn f64_to_f16(x: f64) -> f16 {
    f16::from_f32(f64_to_f32_round_odd(x))
}

/// `x` rounded to the nearest bf16 (ties to even).
fn f64_to_bf16(x: f64) -> bf16 {
    bf16::from_f32(f64_to_f32_round_odd(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extract_insert_concat() {
        let t = Tensor::from_vec(&[4, 6], (0..24).map(|x| x as f32).collect()).unwrap();
        let b = SliceBox::new(vec![1, 2], vec![2, 3]);
        let piece = t.extract_box(&b).unwrap();
        assert_eq!(piece.as_f32().unwrap(), &[8.0, 9.0, 10.0, 14.0, 15.0, 16.0]);
        let mut z = Tensor::zeros(DType::F32, &[4, 6]);
        z.insert_box(&b, &piece).unwrap();
        assert_eq!(z.as_f32().unwrap()[8], 8.0);
        assert_eq!(z.as_f32().unwrap()[7], 0.0);
        let left = t
            .extract_box(&SliceBox::new(vec![0, 0], vec![4, 2]))
            .unwrap();
        let right = t
            .extract_box(&SliceBox::new(vec![0, 2], vec![4, 4]))
            .unwrap();
        assert_eq!(Tensor::concat(&[left, right], 1).unwrap(), t);
        assert!(matches!(
            t.extract_box(&SliceBox::new(vec![3, 0], vec![2, 1])),
            Err(TensorError::BoxOutOfRange { .. })
        ));
    }

    #[test]
    fn bytes_and_dtype_conversion() {
        let t = Tensor::from_vec(&[3], vec![1.5f32, -2.0, 3.25]).unwrap();
        let u = Tensor::from_bytes(DType::F32, &[3], t.as_bytes()).unwrap();
        assert_eq!(t, u);
        let h = t.to_dtype(DType::BF16);
        assert_eq!(h.to_f64_vec(), vec![1.5, -2.0, 3.25]);
        assert_eq!(t.to_dtype(DType::I32).to_f64_vec(), vec![1.0, -2.0, 3.0]);
        assert!(Tensor::from_bytes(DType::F32, &[3], &[0; 11]).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]

        /// f64 -> f16 / bf16 near the midpoint of two neighbours (where rounding to nearest
        /// twice goes wrong): below it the lower one, above it the upper one, on it the even one.
        #[test]
        fn half_conversions_round_to_nearest_even(bits in 0u16..0x7bff, side in -1i32..=1, negative in proptest::prelude::any::<bool>()) {
            let sign = if negative { -1.0 } else { 1.0 };
            let check = |lower: f64, upper: f64, lower_even: bool, convert: &dyn Fn(f64) -> f64| {
                let mid = (lower + upper) / 2.0;
                let x = sign * (mid + f64::from(side) * mid * 2f64.powi(-40));
                let expected = match side {
                    -1 => lower,
                    1 => upper,
                    _ if lower_even => lower,
                    _ => upper,
                };
                (convert(x), sign * expected)
            };
            let (got, expected) = check(
                f16::from_bits(bits).to_f64(),
                f16::from_bits(bits + 1).to_f64(),
                bits & 1 == 0,
                &|x| f64_to_f16(x).to_f64(),
            );
            proptest::prop_assert_eq!(got, expected, "f16");
            let (got, expected) = check(
                bf16::from_bits(bits).to_f64(),
                bf16::from_bits(bits + 1).to_f64(),
                bits & 1 == 0,
                &|x| f64_to_bf16(x).to_f64(),
            );
            proptest::prop_assert_eq!(got, expected, "bf16");
        }
    }
}
