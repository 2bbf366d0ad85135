//! Channels and clients: lazy connections (a peer that is down fails the call, which is
//! retried), and the message size bound.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::error::PsError;
use crate::proto::parameter_server_client::ParameterServerClient;
use crate::proto::scheduler_client::SchedulerClient;

/// Room for a message's fields besides its tensors (names, shapes, members, counters).
pub const MESSAGE_SLACK_BYTES: usize = 1 << 20;

/// The largest message carrying `tensor_bytes` of tensors: what a server accepts in a push
/// and a worker in a pull, so a peer cannot make either allocate more than the partition
/// (tensors are then checked against the expected shapes as well).
pub fn message_limit(tensor_bytes: usize) -> usize {
    tensor_bytes.saturating_add(MESSAGE_SLACK_BYTES)
}

/// A lazily connecting channel to `addr` (`host:port`) with `timeout` per call.
pub fn channel(addr: &str, timeout: Duration) -> Result<Channel, PsError> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| PsError::io(format!("the address {addr}"), e))?
        .connect_timeout(timeout)
        .timeout(timeout)
        .tcp_nodelay(true);
    Ok(endpoint.connect_lazy())
}

/// A client of the scheduler at `addr`.
pub fn scheduler_client(
    addr: &str,
    timeout: Duration,
) -> Result<SchedulerClient<Channel>, PsError> {
    // The scheduler's replies hold ids and addresses only.
    Ok(
        SchedulerClient::new(channel(addr, timeout)?)
            .max_decoding_message_size(MESSAGE_SLACK_BYTES),
    )
}

/// A client of the server at `addr` whose replies carry at most `tensor_bytes` of tensors.
pub fn server_client(
    addr: &str,
    timeout: Duration,
    tensor_bytes: usize,
) -> Result<ParameterServerClient<Channel>, PsError> {
    let limit = message_limit(tensor_bytes);
    Ok(ParameterServerClient::new(channel(addr, timeout)?)
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit))
}
