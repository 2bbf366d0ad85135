//! `send` and `recv`: tagged messages between two ranks of a group. A send copies its data
//! and completes in the background; a receive probes and is polled against the deadline.

use super::MpiComm;
use crate::communicator::Tag;
use crate::error::CommError;

impl MpiComm {
    /// Sends `data` to group rank `dst` with `tag`, without waiting for the receive.
    pub(super) fn send_message(&self, dst: usize, tag: Tag, data: &[u8]) -> Result<(), CommError> {
        let mut call = self.enter("send")?;
        call.check_peer(dst, tag)?;
        let count = call.count(data.len())?;
        let buffer = data.to_vec();
        // SAFETY: the buffer moves into `pending_sends` with its request and lives until the
        // request completes (or forever, if it never does).
        let request = unsafe {
            call.raw
                .isend(&self.comm, buffer.as_ptr(), count, dst, tag as i32)
        };
        let request = call.check(request)?;
        call.state.pending_sends.push((request, buffer));
        Ok(())
    }

    /// Receives the next message from group rank `src` with `tag`.
    pub(super) fn recv_message(&self, src: usize, tag: Tag) -> Result<Vec<u8>, CommError> {
        let mut call = self.enter("recv")?;
        call.check_peer(src, tag)?;
        let members = &self.members;
        let probed = call
            .raw
            .probe(&self.comm, src, tag as i32, self.timeout, |w| {
                members.iter().position(|&m| m == w)
            });
        let (message, len) = probed.map_err(|err| call.wait_error(err, vec![src]))?;
        let mut data = vec![0u8; len];
        let count = call.count(len)?;
        // SAFETY: `data` outlives the wait, or is leaked on failure.
        let request = unsafe { call.raw.imrecv(message, data.as_mut_ptr(), count) };
        let request = call.check(request)?;
        match call.wait(request) {
            Ok(()) => Ok(data),
            Err(err) => {
                std::mem::forget(data);
                Err(err)
            }
        }
    }
}
