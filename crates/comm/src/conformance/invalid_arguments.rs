//! Bad arguments: reported on the caller, before any communication, poisoning nothing.

use tensor::Tensor;

use super::reference::expect;
use super::CaseResult;
use crate::{Buf, CommError, Communicator, CommunicatorExt, ReduceOp, MAX_TAG};

/// Bad arguments are reported on the caller before any communication and leave the
/// communicator usable.
pub fn invalid_arguments_poison_nothing(comm: &dyn Communicator) -> CaseResult {
    let n = comm.size();
    let is_invalid = |r: Result<(), CommError>| matches!(r, Err(CommError::InvalidArgument { .. }));
    let mut buf = [0u8; 4];
    expect(comm, is_invalid(comm.broadcast_bytes(&mut buf, n)), || {
        "root out of range".into()
    })?;
    let mut small = vec![0u8; 4 * n - 1];
    expect(
        comm,
        is_invalid(comm.all_gather_bytes(&buf, &mut small)),
        || "short recv".into(),
    )?;
    expect(comm, is_invalid(comm.group(&[n]).map(|_| ())), || {
        "group rank out of range".into()
    })?;
    expect(comm, is_invalid(comm.group(&[0, 0]).map(|_| ())), || {
        "repeated group rank".into()
    })?;
    expect(comm, is_invalid(comm.send_bytes(n, 0, &buf)), || {
        "send to rank n".into()
    })?;
    expect(
        comm,
        is_invalid(comm.send_bytes(0, MAX_TAG + 1, &buf)),
        || "tag too big".into(),
    )?;
    let odd = [0u8; 1];
    let mut recv = [0u8; 1];
    if n > 1 {
        expect(
            comm,
            is_invalid(comm.all_to_all_bytes(&odd, &mut recv)),
            || "all_to_all of an indivisible buffer".into(),
        )?;
    }
    let flags = [true];
    let mut bools = Tensor::from_bools(&[1], &flags).expect("one");
    let unsupported = comm.all_reduce(&mut bools, ReduceOp::Sum);
    expect(
        comm,
        matches!(unsupported, Err(CommError::UnsupportedReduction { .. })),
        || format!("sum of bools: {unsupported:?}"),
    )?;
    let send = vec![0f32; 2 * n];
    for (rows, recv_len, what) in [(0, 2, "no rows"), (2, 3, "a recv of a row and a half")] {
        let mut recv = vec![0f32; recv_len];
        let rows_result = comm.reduce_scatter_rows(
            Buf::new(&send),
            crate::BufMut::new(&mut recv),
            rows,
            ReduceOp::Sum,
        );
        expect(comm, is_invalid(rows_result), || {
            format!("reduce_scatter_rows with {what}")
        })?;
    }
    let counts = vec![1; n + 1];
    let mut out = [0f32; 1];
    let rs = comm.reduce_scatter_v(
        Buf::new(&[0f32; 1]),
        crate::BufMut::new(&mut out),
        &counts,
        ReduceOp::Sum,
    );
    expect(comm, is_invalid(rs), || {
        "reduce_scatter counts of the wrong length".into()
    })?;
    // Still usable.
    let mut x = [1u64];
    comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
    expect(comm, x[0] == n as u64, || {
        format!("all_reduce after argument errors: {}", x[0])
    })
}
