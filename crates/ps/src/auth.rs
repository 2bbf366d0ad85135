//! Job admission: the parameter-server network admits only its own job's processes.
//!
//! Whoever starts a job (`tessera train`, `tessera launch`, the Kubernetes manifests) hands every
//! role the same [`JobSecret`] in `TESSERA_JOB_SECRET`. Every call a role makes carries it in
//! the [`SECRET_HEADER`] metadata ([`AttachSecret`]), and every call a scheduler or server
//! receives is checked against its own in constant time before any handler runs
//! ([`CheckSecret`]); a call without it, or with another, is refused `Unauthenticated` with a
//! message naming the variable. The secret never appears in a message or a log line.

use std::fmt;
use std::io::Read as _;

use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::env::JOB_SECRET_VAR;
use crate::error::PsError;

/// The gRPC metadata key of the job's secret.
pub const SECRET_HEADER: &str = "x-tessera-job-secret";

/// The fewest characters of a secret (a generated one has 64).
pub const MIN_SECRET_CHARS: usize = 16;

/// The most characters of a secret (it travels in every call's metadata).
pub const MAX_SECRET_CHARS: usize = 1024;

/// A job's shared secret: visible ASCII, [`MIN_SECRET_CHARS`] to [`MAX_SECRET_CHARS`]
/// characters. Compared in constant time; its `Debug` form does not show it.
#[derive(Clone)]
pub struct JobSecret(String);

impl JobSecret {
    /// A fresh secret: 32 bytes from the operating system's random source, as hex.
    pub fn generate() -> Result<JobSecret, PsError> {
        let bytes = random_bytes::<32>()?;
        Ok(JobSecret(
            bytes.iter().map(|b| format!("{b:02x}")).collect(),
        ))
    }

    /// The secret `TESSERA_JOB_SECRET` holds (`None`: unset), checked.
    pub fn from_env_value(value: Option<String>) -> Result<JobSecret, PsError> {
        let refuse = |reason: String| PsError::Env {
            var: JOB_SECRET_VAR.to_string(),
            reason,
        };
        let text = value.ok_or_else(|| {
            refuse(
                "must be set: the job's secret, the same in every role (tessera train and tessera launch make one; see docs/PS.md)"
                    .to_string(),
            )
        })?;
        JobSecret::new(text).map_err(refuse)
    }

    /// `text` as a secret, or the rule it breaks (the text itself is never quoted).
    pub fn new(text: String) -> Result<JobSecret, String> {
        let chars = text.chars().count();
        if !(MIN_SECRET_CHARS..=MAX_SECRET_CHARS).contains(&chars) {
            return Err(format!(
                "the secret has {chars} characters; it must have {MIN_SECRET_CHARS} to {MAX_SECRET_CHARS}"
            ));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(
                "the secret must be visible ASCII characters only (no spaces or control characters)"
                    .to_string(),
            );
        }
        Ok(JobSecret(text))
    }

    /// The secret's text, for handing it to a child process's environment only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `given` is this secret, in time independent of where they differ.
    pub fn matches(&self, given: &[u8]) -> bool {
        constant_time_eq(self.0.as_bytes(), given)
    }
}

impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobSecret(<redacted>)")
    }
}

impl PartialEq for JobSecret {
    fn eq(&self, other: &JobSecret) -> bool {
        self.matches(other.0.as_bytes())
    }
}

impl Eq for JobSecret {}

/// Whether `a` and `b` are equal, looking at every byte whatever the first difference (the
/// length is not hidden: a generated secret's length is public).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

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
            var: JOB_SECRET_VAR.to_string(),
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
                "{} refuses the call: its {SECRET_HEADER} metadata is not this job's secret ({JOB_SECRET_VAR}); the caller belongs to another job",
                self.who
            ))),
            None => Err(Status::unauthenticated(format!(
                "{} refuses the call: it carries no {SECRET_HEADER} metadata; every call of a parameter-server job must carry the job's secret ({JOB_SECRET_VAR})",
                self.who
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_checked_and_never_shown() {
        let secret = JobSecret::generate().unwrap();
        assert_eq!(secret.expose().len(), 64);
        assert_ne!(secret, JobSecret::generate().unwrap());
        assert_eq!(format!("{secret:?}"), "JobSecret(<redacted>)");
        for bad in ["short", "has a space in the middle!!", &"x".repeat(2000)] {
            let err = JobSecret::from_env_value(Some(bad.to_string()))
                .unwrap_err()
                .to_string();
            assert!(err.contains(JOB_SECRET_VAR) && !err.contains(bad), "{err}");
        }
        let missing = JobSecret::from_env_value(None).unwrap_err().to_string();
        assert!(missing.contains("must be set"), "{missing}");
    }

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
