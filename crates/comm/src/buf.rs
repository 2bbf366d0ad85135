//! Typed byte views: the buffers the object-safe [`crate::Communicator`] methods take.

use tensor::{DType, Element, Tensor};

/// A read-only view of elements of one dtype, as bytes.
///
/// Built only from a typed slice or a tensor, so the bytes are always aligned for the dtype: a
/// backend may view them as `&[T]` again.
#[derive(Debug, Clone, Copy)]
pub struct Buf<'a> {
    dtype: DType,
    bytes: &'a [u8],
}

/// A writable view of elements of one dtype, as bytes (aligned, see [`Buf`]).
#[derive(Debug)]
pub struct BufMut<'a> {
    dtype: DType,
    bytes: &'a mut [u8],
}

impl<'a> Buf<'a> {
    /// A view of a typed slice.
    pub fn new<T: Element>(data: &'a [T]) -> Buf<'a> {
        Buf {
            dtype: T::DTYPE,
            bytes: bytemuck::cast_slice(data),
        }
    }

    /// A view of a tensor's elements.
    pub fn from_tensor(tensor: &'a Tensor) -> Buf<'a> {
        Buf {
            dtype: tensor.dtype(),
            bytes: tensor.as_bytes(),
        }
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size_in_bytes()
    }

    /// Whether there is no element.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The first `len` elements (all of them when there are fewer).
    pub fn prefix(self, len: usize) -> Buf<'a> {
        let end = len
            .saturating_mul(self.dtype.size_in_bytes())
            .min(self.bytes.len());
        Buf {
            dtype: self.dtype,
            bytes: &self.bytes[..end],
        }
    }
}

impl<'a> BufMut<'a> {
    /// A view of a typed slice.
    pub fn new<T: Element>(data: &'a mut [T]) -> BufMut<'a> {
        BufMut {
            dtype: T::DTYPE,
            bytes: bytemuck::cast_slice_mut(data),
        }
    }

    /// A view of a tensor's elements.
    pub fn from_tensor(tensor: &'a mut Tensor) -> BufMut<'a> {
        BufMut {
            dtype: tensor.dtype(),
            bytes: tensor.as_bytes_mut(),
        }
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size_in_bytes()
    }

    /// Whether there is no element.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.bytes
    }

    /// A read-only view of the same elements.
    pub fn as_buf(&self) -> Buf<'_> {
        Buf {
            dtype: self.dtype,
            bytes: self.bytes,
        }
    }

    /// Re-borrows for a shorter lifetime, so one view can be passed to several calls.
    pub fn reborrow(&mut self) -> BufMut<'_> {
        BufMut {
            dtype: self.dtype,
            bytes: self.bytes,
        }
    }
}
