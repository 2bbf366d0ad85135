//! Channels and clients: lazy connections (a peer that is down fails the call, which is
//! retried), and the message size bound.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::error::PsError;
use crate::proto::parameter_server_client::ParameterServerClient;
use crate::proto::scheduler_client::SchedulerClient;

/// The largest message accepted (a server partition of the seed MLP is well under 1 MiB;
/// tensors in a message are checked against the expected shapes as well).
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

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
    Ok(SchedulerClient::new(channel(addr, timeout)?)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// A client of the server at `addr`.
pub fn server_client(
    addr: &str,
    timeout: Duration,
) -> Result<ParameterServerClient<Channel>, PsError> {
    Ok(ParameterServerClient::new(channel(addr, timeout)?)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}
