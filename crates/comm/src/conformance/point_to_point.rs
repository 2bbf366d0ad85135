//! Point-to-point `send` and `recv`.

use tensor::DType;

use super::reference::{expect, expect_eq, input};
use super::CaseResult;
use crate::{Communicator, MAX_TAG};

/// Point-to-point: a ring of tensors, in-order delivery per tag, tags received out of order,
/// and a message to oneself.
pub fn send_recv(comm: &dyn Communicator) -> CaseResult {
    let (n, me) = (comm.size(), comm.rank());
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let shapes: [&[usize]; 3] = [&[], &[4], &[2, 3]];
    for (i, shape) in shapes.iter().enumerate() {
        let t = input(DType::ALL[i * 4], shape, me, i);
        comm.send(next, 7, &t)?;
    }
    comm.send_bytes(next, 1, b"first")?;
    comm.send_bytes(next, 1, b"second")?;
    comm.send_bytes(next, MAX_TAG, b"last tag")?;
    for (i, shape) in shapes.iter().enumerate() {
        let got = comm.recv(prev, 7)?;
        expect_eq(
            comm,
            "send/recv tensor",
            &got,
            &input(DType::ALL[i * 4], shape, prev, i),
        )?;
    }
    let last = comm.recv_bytes(prev, MAX_TAG)?;
    let first = comm.recv_bytes(prev, 1)?;
    let second = comm.recv_bytes(prev, 1)?;
    expect(
        comm,
        (&first[..], &second[..], &last[..]) == (b"first", b"second", b"last tag"),
        || "messages on one tag out of order, or tags mixed".to_string(),
    )?;
    comm.send_bytes(me, 3, &[me as u8])?;
    let own = comm.recv_bytes(me, 3)?;
    expect(comm, own == [me as u8], || {
        "a message to oneself was lost".to_string()
    })?;
    // Leave no message in flight for the next case.
    comm.barrier()?;
    Ok(())
}
