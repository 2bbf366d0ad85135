//! The supervisor: starts every process of a [`JobPlan`], restarts the workers and servers that
//! fail while they have restarts left, and ends the job: with success when every worker exited
//! 0, with a failure when a process failed for good, or because the launcher got a signal.
//!
//! Ending always goes the same way: SIGTERM (or the launcher's signal) to every process still
//! running, SIGKILL to those still running after the grace period, and a bounded wait after
//! that, so the launcher never hangs on a process that will not die. An exit is reported once
//! the process's last output is in its log (see [`child`]), so a restart's or a failure
//! report's lines come after it.

use std::io;
use std::process::ExitStatus;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runtime::launch_env::{Role, LAUNCHER_VARS};

use super::child::{self, Event, Running, StartRequest};
use super::output::{self, LogFile, Prefixed};
use super::plan::{JobPlan, ProcessSpec};

/// How long to wait for processes to be reaped after SIGKILL before giving up on them.
const AFTER_KILL_WAIT: Duration = Duration::from_secs(5);

/// How the job ended.
#[derive(Debug)]
pub enum Outcome {
    /// Every worker exited 0, or, in a parameter-server job, every worker that was not lost.
    Success {
        /// The workers that exited 0.
        finished: usize,
        /// The workers a parameter-server job lost on the way (`worker 1 (rank 4) (signal: 9
        /// (SIGKILL))`): failed with no restarts left, while others went on.
        lost: Vec<String>,
    },
    /// Every worker of a parameter-server job failed with no restarts left (each described).
    AllWorkersLost(Vec<String>),
    /// A process failed with no restarts left.
    Failed {
        /// Which process.
        spec: ProcessSpec,
        /// How it ended (an error if waiting for it failed).
        status: Result<ExitStatus, String>,
        /// Its log file's path.
        log: std::path::PathBuf,
    },
    /// A process could not be started.
    StartFailed {
        /// Which process.
        spec: ProcessSpec,
        /// Why.
        error: io::Error,
    },
    /// The launcher received this signal, forwarded it and stopped the job.
    Interrupted(i32),
    /// The supervisor lost track of the job (a bug, not bad input).
    Bug(&'static str),
}

/// One process of the plan and its state.
struct Slot {
    spec: ProcessSpec,
    log: Arc<LogFile>,
    prefix: Arc<str>,
    /// How often it has been restarted.
    restarts_used: u32,
    /// The running instance, if any.
    running: Option<Running>,
    /// A worker whose last instance exited 0.
    finished: bool,
    /// A worker of a parameter-server job that failed with no restarts left, and how.
    lost: Option<String>,
}

/// The job being stopped, and when to escalate.
struct Ending {
    outcome: Outcome,
    /// When SIGKILL goes to those still running (and, once sent, when to give up on them).
    deadline: Instant,
    killed: bool,
}

/// Runs the job to its end. `logs` holds one opened log file per process of `plan`, in order;
/// `events` receives the launcher's signals (the caller forwards them) and is also where the
/// children's exits arrive.
pub fn supervise(
    plan: &JobPlan,
    logs: Vec<Arc<LogFile>>,
    events: (Sender<Event>, Receiver<Event>),
) -> Outcome {
    let (sender, receiver) = events;
    let mut slots: Vec<Slot> = plan
        .processes
        .iter()
        .zip(logs)
        .map(|(spec, log)| Slot {
            spec: *spec,
            log,
            prefix: Arc::from(format!("[{spec}] ")),
            restarts_used: 0,
            running: None,
            finished: false,
            lost: None,
        })
        .collect();
    let mut ending: Option<Ending> = None;
    for index in 0..slots.len() {
        if let Err(error) = start(plan, &mut slots, index, &sender) {
            let spec = slots[index].spec;
            ending = Some(begin_ending(
                plan,
                &slots,
                Outcome::StartFailed { spec, error },
            ));
            break;
        }
    }
    loop {
        let event = match &mut ending {
            None => match receiver.recv() {
                Ok(event) => event,
                // `sender` lives here, so the channel cannot close; if it did, say so.
                Err(_) => {
                    let outcome = Outcome::Bug("the event channel closed");
                    ending = Some(begin_ending(plan, &slots, outcome));
                    continue;
                }
            },
            Some(end) => {
                if slots.iter().all(|s| s.running.is_none()) {
                    break;
                }
                let wait = end.deadline.saturating_duration_since(Instant::now());
                match receiver.recv_timeout(wait) {
                    Ok(event) => event,
                    Err(RecvTimeoutError::Timeout) if !end.killed => {
                        for slot in slots.iter().filter(|s| s.running.is_some()) {
                            eprintln!(
                                "[launch] {} still running {} s after it was told to stop; sending SIGKILL",
                                slot.spec,
                                plan.grace.as_secs()
                            );
                        }
                        signal_running(&slots, libc::SIGKILL);
                        end.killed = true;
                        end.deadline = Instant::now() + AFTER_KILL_WAIT;
                        continue;
                    }
                    Err(_) => {
                        eprintln!("[launch] processes survived SIGKILL; giving up on them");
                        break;
                    }
                }
            }
        };
        match event {
            // Only a collective job's output router sends it; these jobs have none.
            Event::Stop(_) => {}
            Event::Signal(signal) => {
                signal_running(&slots, signal);
                if ending.is_none() {
                    eprintln!(
                        "[launch] received signal {signal}; forwarded to every process, stopping the job"
                    );
                    let end = begin_ending(plan, &slots, Outcome::Interrupted(signal));
                    ending = Some(end);
                }
            }
            Event::Exited {
                slot: index,
                status,
            } => {
                slots[index].running = None;
                if ending.is_some() {
                    continue;
                }
                if let Some(outcome) = on_exit(plan, &mut slots, index, status, &sender) {
                    ending = Some(begin_ending(plan, &slots, outcome));
                }
            }
        }
    }
    match ending {
        Some(end) => end.outcome,
        None => Outcome::Bug("the job ended without an outcome"),
    }
}

/// Handles the end of the process in slot `index` while the job runs; returns how the job ends
/// if it does.
fn on_exit(
    plan: &JobPlan,
    slots: &mut [Slot],
    index: usize,
    status: io::Result<ExitStatus>,
    sender: &Sender<Event>,
) -> Option<Outcome> {
    let spec = slots[index].spec;
    let status = status.map_err(|err| format!("waiting for it failed: {err}"));
    if matches!(&status, Ok(s) if s.success()) {
        if spec.role == Role::Worker {
            slots[index].finished = true;
            return workers_ended(slots);
        } else {
            eprintln!("[launch] {spec} exited with status 0 before the workers finished");
        }
        return None;
    }
    let shown = describe(&status);
    let slot = &mut slots[index];
    if spec.role != Role::Scheduler && slot.restarts_used < plan.restarts {
        slot.restarts_used += 1;
        eprintln!(
            "[launch] {spec} (rank {}) failed ({shown}); restarting it ({} of {})",
            spec.rank, slot.restarts_used, plan.restarts
        );
        return match start(plan, slots, index, sender) {
            Ok(()) => None,
            Err(error) => Some(Outcome::StartFailed { spec, error }),
        };
    }
    // A parameter-server job survives a lost worker (docs/PS.md): the others take its rows.
    if spec.role == Role::Worker && plan.num_servers > 0 {
        eprintln!(
            "[launch] {spec} (rank {}) failed ({shown}) with no restarts left; the parameter-server job goes on without it",
            spec.rank
        );
        slot.lost = Some(format!("{spec} (rank {}) ({shown})", spec.rank));
        return workers_ended(slots);
    }
    Some(Outcome::Failed {
        spec,
        status,
        log: slot.log.path().to_path_buf(),
    })
}

/// The job's end once every worker has finished or was lost (`None` while one runs): success
/// when any finished, otherwise every worker was lost.
fn workers_ended(slots: &[Slot]) -> Option<Outcome> {
    let workers = || slots.iter().filter(|s| s.spec.role == Role::Worker);
    if !workers().all(|s| s.finished || s.lost.is_some()) {
        return None;
    }
    let lost: Vec<String> = workers().filter_map(|s| s.lost.clone()).collect();
    let finished = workers().filter(|s| s.finished).count();
    Some(match finished {
        0 => Outcome::AllWorkersLost(lost),
        _ => Outcome::Success { finished, lost },
    })
}

/// Starts the process of slot `index` with its current restart count.
fn start(
    plan: &JobPlan,
    slots: &mut [Slot],
    index: usize,
    sender: &Sender<Event>,
) -> io::Result<()> {
    let slot = &mut slots[index];
    let set = plan.environment(&slot.spec, slot.restarts_used);
    let remove: Vec<&'static str> = LAUNCHER_VARS
        .iter()
        .copied()
        .filter(|name| !set.iter().any(|(k, _)| k == name))
        .collect();
    slot.log.write_line(
        output::attempt_header(&slot.spec.to_string(), slot.spec.rank, slot.restarts_used)
            .as_bytes(),
    );
    let request = StartRequest {
        command: &plan.command,
        set: &set,
        remove: &remove,
        output: Arc::new(Prefixed {
            prefix: slot.prefix.clone(),
            log: slot.log.clone(),
        }),
        name: slot.spec.to_string(),
        slot: index,
    };
    slot.running = Some(child::start(request, sender)?);
    Ok(())
}

/// Starts ending the job with `outcome`: SIGTERM to the processes that should stop (after
/// success only the scheduler and servers are left; after a signal it was forwarded already).
fn begin_ending(plan: &JobPlan, slots: &[Slot], outcome: Outcome) -> Ending {
    match &outcome {
        Outcome::Success { .. } => {
            if slots.iter().any(|s| s.running.is_some()) {
                eprintln!("[launch] every worker finished; stopping the scheduler and servers");
            }
            signal_running(slots, libc::SIGTERM);
        }
        Outcome::Failed { spec, .. } | Outcome::StartFailed { spec, .. } => {
            if slots.iter().any(|s| s.running.is_some()) {
                eprintln!("[launch] {spec} failed; stopping every other process");
            }
            signal_running(slots, libc::SIGTERM);
        }
        Outcome::AllWorkersLost(_) => {
            if slots.iter().any(|s| s.running.is_some()) {
                eprintln!("[launch] every worker was lost; stopping every other process");
            }
            signal_running(slots, libc::SIGTERM);
        }
        Outcome::Bug(_) => signal_running(slots, libc::SIGTERM),
        Outcome::Interrupted(_) => {}
    }
    Ending {
        outcome,
        deadline: Instant::now() + plan.grace,
        killed: false,
    }
}

/// Sends `signal` to the process group of every running process.
fn signal_running(slots: &[Slot], signal: i32) {
    for slot in slots {
        if let Some(running) = &slot.running {
            child::signal_group(running.pid, signal);
        }
    }
}

/// `exit status: 3`, `signal: 9 (SIGKILL)`, or why waiting failed.
pub fn describe(status: &Result<ExitStatus, String>) -> String {
    match status {
        Ok(status) => status.to_string(),
        Err(reason) => reason.clone(),
    }
}

/// A channel for [`supervise`], with the sending side that signal forwarding also uses.
pub fn channel() -> (Sender<Event>, Receiver<Event>) {
    mpsc::channel()
}
