//! Deadlines and bounded retries with exponential backoff for every call.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::PsError;

/// How a call is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The deadline of one attempt.
    pub timeout: Duration,
    /// Further attempts after the first fails.
    pub retries: u32,
    /// The wait before the first retry (doubled each time).
    pub first_backoff: Duration,
    /// The longest wait between two attempts.
    pub max_backoff: Duration,
}

impl RetryPolicy {
    /// The wait before retry `attempt` (1 for the first retry).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(16);
        self.first_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }

    /// Runs `attempt` until it succeeds, fails with an error that retrying cannot mend, or
    /// has failed `retries + 1` times; each attempt is cut at `timeout`. `call` and `peer`
    /// name the call in the error.
    pub async fn run<T, F, Fut>(&self, call: &str, peer: &str, mut attempt: F) -> Result<T, PsError>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let mut last = String::new();
        for n in 0..=self.retries {
            if n > 0 {
                tokio::time::sleep(self.backoff(n)).await;
            }
            match self.attempt(attempt(n)).await {
                Attempt::Done(value) => return Ok(value),
                Attempt::Fatal(why) => return Err(rpc_error(call, peer, n + 1, why)),
                Attempt::Retry(why) => last = why,
            }
        }
        Err(rpc_error(call, peer, self.retries + 1, last))
    }

    /// One attempt of a call, cut at `timeout`, and what to do next.
    pub async fn attempt<T>(
        &self,
        call: impl Future<Output = Result<T, tonic::Status>>,
    ) -> Attempt<T> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(value)) => Attempt::Done(value),
            Ok(Err(status)) if !retryable(&status) => {
                Attempt::Fatal(format!("{}: {}", status.code(), status.message()))
            }
            Ok(Err(status)) => Attempt::Retry(format!("{}: {}", status.code(), status.message())),
            Err(_) => Attempt::Retry(format!("no answer within {} ms", self.timeout.as_millis())),
        }
    }
}

/// Runs a registration `attempt` until the scheduler accepts it: failures that retrying can
/// mend are retried as [`RetryPolicy::run`] does, and a refusal because the id is alive in
/// another process (`AlreadyExists`: the predecessor of a restarted process, not yet declared
/// dead) is asked again every `every` until `patience` has passed. Any other refusal fails at
/// once.
pub async fn until_admitted<T, F, Fut>(
    policy: &RetryPolicy,
    (call, peer): (&str, &str),
    (every, patience): (Duration, Duration),
    mut attempt: F,
) -> Result<T, PsError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    let give_up = Instant::now() + patience;
    let mut failures = 0u32;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let status = match tokio::time::timeout(policy.timeout, attempt()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(status)) => status,
            Err(_) => tonic::Status::deadline_exceeded(format!(
                "no answer within {} ms",
                policy.timeout.as_millis()
            )),
        };
        let why = format!("{}: {}", status.code(), status.message());
        if status.code() == tonic::Code::AlreadyExists && Instant::now() < give_up {
            tokio::time::sleep(every).await;
            continue;
        }
        if retryable(&status) && failures < policy.retries {
            failures += 1;
            tokio::time::sleep(policy.backoff(failures)).await;
            continue;
        }
        return Err(rpc_error(call, peer, attempts, why));
    }
}

/// The outcome of one attempt of a call.
#[derive(Debug)]
pub enum Attempt<T> {
    /// It succeeded.
    Done(T),
    /// It failed in a way retrying cannot mend (the reason).
    Fatal(String),
    /// It failed and may succeed when tried again (the reason).
    Retry(String),
}

/// The error of `call` to `peer` after `attempts` attempts, the last failing for `last`.
pub fn rpc_error(call: &str, peer: &str, attempts: u32, last: String) -> PsError {
    PsError::Rpc {
        call: call.to_string(),
        peer: peer.to_string(),
        attempts,
        last,
    }
}

/// Whether a failed call may succeed when tried again (the peer was unreachable, slow or
/// restarting), as opposed to a refusal.
pub fn retryable(status: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Unknown
            | Code::Aborted
            | Code::Cancelled
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let p = RetryPolicy {
            timeout: Duration::from_secs(1),
            retries: 5,
            first_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(300),
        };
        let waits: Vec<u128> = (1..=5).map(|n| p.backoff(n).as_millis()).collect();
        assert_eq!(waits, [50, 100, 200, 300, 300]);
    }
}
