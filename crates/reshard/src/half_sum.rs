//! How a pending sum of half-precision values (bf16, f16) is added: MindSpore's
//! `enable_fp32_communication` and gradient fp32 sync as a property of the reduction. A choice
//! is data; `reshard_exec`'s runner carries it out over a communicator.

use tensor::DType;

/// How a reshard runner (`reshard_exec::ReshardRunner`) adds the pending sums of bf16 and f16
/// values. Sums of other dtypes are added the same way under every choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HalfSum {
    /// The communicator's ordinary reduction of the half values: accumulated in f32 and rounded
    /// once to the half type (`comm::Communicator::all_reduce_buf`).
    #[default]
    AccumulateInF32,
    /// Widened to f32 before the collective and rounded back after it (MindSpore's
    /// `enable_fp32_communication` and gradient fp32 sync): the sums of
    /// [`HalfSum::AccumulateInF32`], with twice the bytes on the wire.
    WidenedToF32,
    /// Added in the half type: the group's members in member order, every partial sum rounded
    /// to the half type (`comm::Communicator::all_reduce_in_element_type_buf`), as a
    /// half-precision all-reduce does (MindSpore with gradient fp32 sync off).
    InHalfType,
}

impl HalfSum {
    /// Whether values of `dtype` are widened to f32 for the collective.
    pub fn widens(self, dtype: DType) -> bool {
        self == HalfSum::WidenedToF32 && dtype.is_half()
    }

    /// Whether sums of `dtype` round after every addition (the collectives in the element type).
    pub fn rounds_every_addition(self, dtype: DType) -> bool {
        self == HalfSum::InHalfType && dtype.is_half()
    }
}
