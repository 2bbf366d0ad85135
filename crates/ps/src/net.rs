//! Channels and clients: lazy connections (a peer that is down fails the call, which is
//! retried), the job's secret on every call ([`crate::auth`]), and the message size bound.

use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::auth::{AttachSecret, JobSecret};
use crate::error::PsError;
use crate::proto::parameter_server_client::ParameterServerClient;
use crate::proto::scheduler_client::SchedulerClient;

/// How long a scheduler or server that is done waits for its open connections to close after
/// it stopped accepting new ones. A graceful stop waits for every connection; a peer that
/// holds one open without finishing a call (stalled mid-preface, or never closing) would make
/// the role, and the job, never end.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Waits for `serving` (a gRPC server told to stop) to finish, at most [`SHUTDOWN_GRACE`];
/// past it, the connections still open are dropped, saying so with `who` (`server 0`).
pub async fn stop_serving<T>(serving: tokio::task::JoinHandle<T>, who: &str) {
    let abort = serving.abort_handle();
    if tokio::time::timeout(SHUTDOWN_GRACE, serving).await.is_err() {
        abort.abort();
        eprintln!(
            "[ps {who}] connections still open {} s after the job ended were dropped (a peer that never finished its call)",
            SHUTDOWN_GRACE.as_secs()
        );
    }
}

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

/// A channel whose every call carries the job's secret.
pub type JobChannel = InterceptedService<Channel, AttachSecret>;

/// A client of the scheduler at `addr`, its calls carrying `secret`.
pub fn scheduler_client(
    addr: &str,
    timeout: Duration,
    secret: &JobSecret,
) -> Result<SchedulerClient<JobChannel>, PsError> {
    // The scheduler's replies hold ids and addresses only.
    Ok(
        SchedulerClient::with_interceptor(channel(addr, timeout)?, AttachSecret::new(secret)?)
            .max_decoding_message_size(MESSAGE_SLACK_BYTES),
    )
}

/// A client of the server at `addr` whose replies carry at most `tensor_bytes` of tensors,
/// its calls carrying `secret`.
pub fn server_client(
    addr: &str,
    timeout: Duration,
    tensor_bytes: usize,
    secret: &JobSecret,
) -> Result<ParameterServerClient<JobChannel>, PsError> {
    let limit = message_limit(tensor_bytes);
    Ok(
        ParameterServerClient::with_interceptor(
            channel(addr, timeout)?,
            AttachSecret::new(secret)?,
        )
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit),
    )
}
