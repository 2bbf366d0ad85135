//! Job admission: the parameter-server network admits only its own job's processes.
//!
//! Whoever starts a job (`tessera train`, `tessera launch`, the Kubernetes manifests) hands every
//! role the same [`JobSecret`] in `TESSERA_JOB_SECRET`. Every call a role makes carries it in
//! the [`SECRET_HEADER`] metadata ([`AttachSecret`]), and every call a scheduler or server
//! receives is checked against its own in constant time before any handler runs
//! ([`CheckSecret`]); a call without it, or with another, is refused `Unauthenticated` with a
//! message naming the variable. The secret never appears in a message or a log line.

use std::io::Read as _;

use runtime::launch_env::JOB_SECRET;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::error::PsError;

/// The secret, its rule and its variable are the process contract's (`runtime::launch_env`).
pub use runtime::launch_env::{JobSecret, MAX_SECRET_CHARS, MIN_SECRET_CHARS};

/// The gRPC metadata key of the job's secret.
pub const SECRET_HEADER: &str = "x-tessera-job-secret";

/// `N` bytes from the operating system's random source (`/dev/urandom`).
pub fn random_bytes<const N: usize>() -> Result<[u8; N], PsError> {
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| PsError::io("reading random bytes from /dev/urandom", e))?;
    Ok(bytes)
}

/// A process's incarnation: a random non-zero number it draws once and sends with every
/// registration, so the scheduler tells a repeated registration of the same process (its reply
/// lost) from a second process claiming a live id. 0 means "unspecified" on the wire.
pub fn new_incarnation() -> Result<u64, PsError> {
    Ok(u64::from_le_bytes(random_bytes()?).max(1))
}

/// The client side: puts the job's secret into every call's metadata.
#[derive(Clone)]
pub struct AttachSecret {
    value: MetadataValue<tonic::metadata::Ascii>,
}

impl AttachSecret {
    /// Attaches `secret` (visible ASCII by construction, so always a valid metadata value).
    pub fn new(secret: &JobSecret) -> Result<AttachSecret, PsError> {
        let mut value = MetadataValue::try_from(secret.expose()).map_err(|_| PsError::Env {
            var: JOB_SECRET.to_string(),
            reason: "the secret is not a valid gRPC metadata value".to_string(),
        })?;
        value.set_sensitive(true);
        Ok(AttachSecret { value })
    }
}

impl Interceptor for AttachSecret {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request
            .metadata_mut()
            .insert(SECRET_HEADER, self.value.clone());
        Ok(request)
    }
}

/// The serving side: refuses every call that does not carry the job's secret.
#[derive(Clone)]
pub struct CheckSecret {
    secret: JobSecret,
    /// Who checks, for the refusal (`the scheduler`, `server 1`).
    who: String,
}

impl CheckSecret {
    /// Checks calls to `who` against `secret`.
    pub fn new(secret: &JobSecret, who: impl Into<String>) -> CheckSecret {
        CheckSecret {
            secret: secret.clone(),
            who: who.into(),
        }
    }
}

impl Interceptor for CheckSecret {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        match request.metadata().get(SECRET_HEADER) {
            Some(given) if self.secret.matches(given.as_bytes()) => Ok(request),
            Some(_) => Err(Status::unauthenticated(format!(
                "{} refuses the call: its {SECRET_HEADER} metadata is not this job's secret ({JOB_SECRET}); the caller belongs to another job",
                self.who
            ))),
            None => Err(Status::unauthenticated(format!(
                "{} refuses the call: it carries no {SECRET_HEADER} metadata; every call of a parameter-server job must carry the job's secret ({JOB_SECRET})",
                self.who
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_refuses_a_missing_or_wrong_secret_by_name() {
        let secret = JobSecret::new("a-secret-of-enough-length".to_string()).unwrap();
        let mut check = CheckSecret::new(&secret, "the scheduler");
        let mut attach = AttachSecret::new(&secret).unwrap();
        assert!(check.call(attach.call(Request::new(())).unwrap()).is_ok());
        let none = check.call(Request::new(())).unwrap_err();
        assert_eq!(none.code(), tonic::Code::Unauthenticated);
        assert!(none.message().contains("carries no"), "{}", none.message());
        let other = JobSecret::new("another-secret-of-enough-length".to_string()).unwrap();
        let wrong = check
            .call(
                AttachSecret::new(&other)
                    .unwrap()
                    .call(Request::new(()))
                    .unwrap(),
            )
            .unwrap_err();
        assert_eq!(wrong.code(), tonic::Code::Unauthenticated);
        assert!(
            wrong.message().contains("not this job's secret")
                && !wrong.message().contains(secret.expose()),
            "{}",
            wrong.message()
        );
    }
}
