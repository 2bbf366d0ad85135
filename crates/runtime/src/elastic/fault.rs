//! A fault to inject, for tests of elastic training: `TESSERA_FAULT="rank=R,step=S,at=POINT"`
//! makes rank R kill itself with SIGKILL at POINT of global step S (counted from 1), on the
//! job's first start only (`TESSERA_RESTART_COUNT` unset or 0), as a crash or the kernel's OOM
//! killer would end it.
//!
//! The points: `forward` (the step's start: the other ranks then wait in the step's first
//! collective), `update` (after the forward and backward passes, before the update: they wait
//! in the global-norm all-reduce of clipping or the next step's first collective), `snapshot`
//! (an elastic snapshot with this rank's file written, before the copies are exchanged), and
//! `hang`: at the step's start the rank stops making progress without dying, as a deadlocked
//! or stalled process would, until something kills it.

use std::sync::OnceLock;

use crate::error::RuntimeError;
use crate::launch_env::RESTART_COUNT;

/// The variable naming the fault.
pub const FAULT_VAR: &str = crate::launch_env::FAULT;

/// Where in a step a fault strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// The step's start.
    Forward,
    /// Before the update.
    Update,
    /// Inside an elastic snapshot.
    Snapshot,
    /// The step's start, hanging instead of dying.
    Hang,
}

/// A parsed fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The rank that dies.
    pub rank: usize,
    /// The global step (from 1) it dies in.
    pub step: u64,
    /// Where.
    pub at: FaultPoint,
}

impl Fault {
    /// Parses `rank=R,step=S,at=POINT`.
    pub fn parse(text: &str) -> Result<Fault, String> {
        let (mut rank, mut step, mut at) = (None, None, None);
        for part in text.split(',') {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not KEY=VALUE"))?;
            match key.trim() {
                "rank" => rank = value.trim().parse().ok(),
                "step" => step = value.trim().parse().ok(),
                "at" => {
                    at = match value.trim() {
                        "forward" => Some(FaultPoint::Forward),
                        "update" => Some(FaultPoint::Update),
                        "snapshot" => Some(FaultPoint::Snapshot),
                        "hang" => Some(FaultPoint::Hang),
                        other => {
                            return Err(format!(
                                "unknown point {other:?} (forward, update, snapshot, hang)"
                            ))
                        }
                    }
                }
                other => return Err(format!("unknown key {other:?} (rank, step, at)")),
            }
        }
        match (rank, step, at) {
            (_, Some(0), _) => Err(
                "step=0 never comes: steps are counted from 1, so the fault would never fire"
                    .to_string(),
            ),
            (Some(rank), Some(step), Some(at)) => Ok(Fault { rank, step, at }),
            _ => Err("it needs rank=R, step=S (numbers) and at=POINT".to_string()),
        }
    }
}

/// The fault of this process's environment, read once; `None` without one or after a restart.
fn armed() -> Result<Option<Fault>, RuntimeError> {
    static FAULT: OnceLock<Result<Option<Fault>, String>> = OnceLock::new();
    let parsed = FAULT.get_or_init(|| {
        let Ok(text) = std::env::var(FAULT_VAR) else {
            return Ok(None);
        };
        let restarted = std::env::var(RESTART_COUNT).is_ok_and(|n| n.trim() != "0");
        Fault::parse(&text).map(|f| (!restarted).then_some(f))
    });
    parsed.clone().map_err(|reason| RuntimeError::Config {
        key: FAULT_VAR.to_string(),
        reason,
    })
}

/// Refuses an armed fault for a rank the job does not have (`devices` ranks): it would never
/// fire, and the test it was meant for would pass without its fault.
pub fn check_fault_rank(devices: usize) -> Result<(), RuntimeError> {
    match armed()? {
        Some(f) if f.rank >= devices => Err(RuntimeError::Config {
            key: FAULT_VAR.to_string(),
            reason: format!(
                "rank {} is not a rank of this job (ranks 0..{devices}), so the fault would never fire",
                f.rank
            ),
        }),
        _ => Ok(()),
    }
}

/// Kills this process (SIGKILL) when the armed fault is `rank` at `point` of `step`; at the
/// step's start (`Forward`) a `hang` fault stops this thread for good instead.
pub fn strike(rank: usize, step: u64, point: FaultPoint) -> Result<(), RuntimeError> {
    if let Some(f) = armed()? {
        if f.rank == rank
            && f.step == step
            && f.at == FaultPoint::Hang
            && point == FaultPoint::Forward
        {
            eprintln!("{FAULT_VAR}: rank {rank} hangs at the start of step {step}");
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        if f.rank == rank && f.step == step && f.at == point {
            eprintln!("{FAULT_VAR}: rank {rank} kills itself at {point:?} of step {step}");
            // SAFETY: raise(3) sends a signal to this process; SIGKILL cannot be caught.
            unsafe {
                libc::raise(libc::SIGKILL);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_and_bad_ones_say_why() {
        assert_eq!(
            Fault::parse("rank=2, step=7, at=update").unwrap(),
            Fault {
                rank: 2,
                step: 7,
                at: FaultPoint::Update
            }
        );
        assert!(Fault::parse("rank=1,step=0,at=forward")
            .unwrap_err()
            .contains("counted from 1"));
        assert!(Fault::parse("rank=2,step=7")
            .unwrap_err()
            .contains("at=POINT"));
        assert!(Fault::parse("rank=2,step=7,at=later")
            .unwrap_err()
            .contains("unknown point"));
        assert!(Fault::parse("node=1").unwrap_err().contains("unknown key"));
    }
}
