//! The conformance suite and the failure scenarios on the MPI backend.
//!
//! `cargo test -p tessera-comm --features mpi --test mpi_conformance` starts this binary as a
//! plain process; it then runs itself under `mpirun --allow-run-as-root --oversubscribe -np 4`
//! eight times — for each of the two [`OnTimeout`] modes: the conformance suite, a rank that
//! panics, a rank that never joins; and, polled, ranks that all-reduce different lengths (small
//! and large) — checks each outcome, prints one `mpi: N passed, M failed` line and exits
//! non-zero on any failure.
//!
//! With [`OnTimeout::ReturnError`] the failures must come back as errors on the three healthy
//! ranks. With [`OnTimeout::AbortJob`] they cannot (the collectives are blocking MPI calls): the
//! job must end instead, promptly and saying why — never hang.
//!
//! Under `mpirun` every rank runs every case on the world (4 ranks), on the pairs {0,1} and
//! {2,3} at the same time, and on {0} and {1,2,3} at the same time; after each case the ranks
//! agree on the outcome with an all-reduce over the world.

use std::io::{Read, Write};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use comm::conformance::CASES;
use comm::mpi::{MpiComm, OnTimeout, ThreadLevel};
use comm::{CommError, Communicator, CommunicatorExt, PeerFailure, ReduceOp};

const RANKS: usize = 4;
/// A hung `mpirun` is killed after this long and counts as a failure.
const WATCHDOG: Duration = Duration::from_secs(600);

fn main() -> ExitCode {
    let under_mpi = std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some()
        || std::env::var_os("PMI_SIZE").is_some();
    let scenario = std::env::args().find_map(|a| a.strip_prefix("--scenario=").map(String::from));
    let on_timeout = if std::env::args().any(|a| a == "--watchdog") {
        OnTimeout::AbortJob
    } else {
        OnTimeout::ReturnError
    };
    match (under_mpi, scenario.as_deref()) {
        (false, _) => launch(),
        (true, Some("panic")) => scenario_panic(on_timeout),
        (true, Some("late")) => scenario_late(on_timeout),
        (true, Some("mismatch-small")) => scenario_mismatch(1_000),
        (true, Some("mismatch-large")) => scenario_mismatch(200_000),
        (true, _) => suite(on_timeout),
    }
}

/// Under [`ThreadLevel::Single`] a call from another thread is refused without harm; under
/// [`ThreadLevel::Serialized`] it works. Returns complaints: about the other thread's call,
/// and about a later call on this thread. Preferring another level once MPI runs changes
/// nothing.
fn check_thread_level(world: &MpiComm, level: ThreadLevel) -> (Option<String>, Option<String>) {
    let other = match level {
        ThreadLevel::Single => ThreadLevel::Serialized,
        ThreadLevel::Serialized => ThreadLevel::Single,
    };
    if comm::mpi::prefer_thread_level(other) != level {
        return (
            Some(format!("preferring {other} changed the level in force")),
            None,
        );
    }
    let from_other_thread = std::thread::scope(|s| s.spawn(|| world.barrier()).join());
    let other_thread = match (level, from_other_thread) {
        (_, Err(_)) => Some("the other thread panicked".to_string()),
        (ThreadLevel::Single, Ok(Err(CommError::InvalidArgument { reason, .. })))
            if reason.contains("thread") =>
        {
            None
        }
        (ThreadLevel::Single, Ok(got)) => Some(format!(
            "a call from another thread gave {got:?}, not a refusal"
        )),
        (ThreadLevel::Serialized, Ok(Ok(()))) => None,
        (ThreadLevel::Serialized, Ok(Err(err))) => {
            Some(format!("a call from another thread failed: {err}"))
        }
    };
    // Under Single the other ranks' barrier is still waiting for this one.
    let again = match level {
        ThreadLevel::Single => world.barrier().err(),
        ThreadLevel::Serialized => None,
    };
    (
        other_thread,
        again.map(|err| format!("the owner thread's call failed: {err}")),
    )
}

// ---------------------------------------------------------------------------------------------
// The launcher (a plain process).

/// Runs `mpirun -np RANKS <this binary> [args]` and returns (finished, how long it took,
/// stdout + stderr).
fn mpirun(args: &[&str]) -> (bool, Duration, String) {
    let exe = std::env::current_exe().expect("the test binary has a path");
    let mut command = Command::new("mpirun");
    command
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            &RANKS.to_string(),
        ])
        .arg(&exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => return (false, Duration::ZERO, format!("cannot start mpirun: {err}")),
    };
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let finished = loop {
        match child.try_wait() {
            Ok(Some(_)) => break true,
            Ok(None) if start.elapsed() > WATCHDOG => {
                let _ = child.kill();
                let _ = child.wait();
                break false;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(_) => break false,
        }
    };
    let took = start.elapsed();
    let text = format!(
        "{}{}",
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default()
    );
    (finished, took, text)
}

fn launch() -> ExitCode {
    let (mut passed, mut failed) = (0, 0);
    for mode in [None, Some("--watchdog")] {
        let (finished, _, output) = mpirun(&Vec::from_iter(mode));
        for line in output.lines().filter(|l| l.starts_with("rank ")) {
            println!("{line}");
        }
        let counts = output
            .lines()
            .find_map(|l| l.strip_prefix("SUITE "))
            .and_then(|l| {
                let mut it = l
                    .split_whitespace()
                    .map(|w| w.split('=').nth(1)?.parse::<usize>().ok());
                Some((it.next()??, it.next()??))
            });
        match (finished, counts) {
            (true, Some((p, f))) => {
                passed += p;
                failed += f;
            }
            _ => {
                failed += 1;
                println!("FAILED: the conformance suite ({mode:?}) did not finish\n{output}");
            }
        }
    }
    // ReturnError: every healthy rank reports the expected error.
    for (arg, expected, reporters, what) in [
        (
            "--scenario=panic",
            "expected PeerFailed",
            RANKS - 1,
            "a panicking rank",
        ),
        (
            "--scenario=late",
            "expected Timeout",
            RANKS - 1,
            "a rank that never joins",
        ),
        (
            "--scenario=mismatch-small",
            "refused as expected",
            RANKS,
            "ranks all-reducing different lengths (recursive doubling)",
        ),
        (
            "--scenario=mismatch-large",
            "refused as expected",
            RANKS,
            "ranks all-reducing different lengths (ring)",
        ),
    ] {
        let (finished, _, output) = mpirun(&[arg]);
        let seen = output.matches(expected).count();
        // Where ranks disagree, at least one of them must say so.
        let named = !arg.contains("mismatch") || output.contains("Mismatch with peer");
        if finished && seen == reporters && named {
            passed += 1;
        } else {
            failed += 1;
            println!("FAILED: {what}: {seen} of {reporters} ranks reported it\n{output}");
        }
    }
    // AbortJob: the job ends, promptly (long before the panicking scenario's 300 s timeout, and
    // before the late rank wakes up after 20 s), and the output says why.
    for (arg, expected, within, what) in [
        (
            "--scenario=panic",
            "rank 2 fails on purpose",
            Duration::from_secs(60),
            "a panicking rank under the watchdog",
        ),
        (
            "--scenario=late",
            "did not complete within 3s",
            Duration::from_secs(15),
            "a rank that never joins, under the watchdog",
        ),
    ] {
        let (finished, took, output) = mpirun(&[arg, "--watchdog"]);
        let ok = finished
            && took < within
            && output.contains(expected)
            && !output.contains("unexpected");
        if ok {
            passed += 1;
        } else {
            failed += 1;
            println!(
                "FAILED: {what}: finished={finished} after {took:?} (limit {within:?}), \
                 {expected:?} in output: {}\n{output}",
                output.contains(expected)
            );
        }
    }
    println!("mpi: {passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

// ---------------------------------------------------------------------------------------------
// Under mpirun.

/// A sub-communicator and what to call it in messages.
type NamedGroup = (&'static str, Box<dyn Communicator>);

fn suite(on_timeout: OnTimeout) -> ExitCode {
    // The polled run initialises MPI for this thread alone, the watchdog run for any thread.
    let level = match on_timeout {
        OnTimeout::ReturnError => ThreadLevel::Single,
        OnTimeout::AbortJob => ThreadLevel::Serialized,
    };
    comm::mpi::prefer_thread_level(level);
    let world = match MpiComm::world_with(Duration::from_secs(60), on_timeout) {
        Ok(world) => world,
        Err(err) => {
            println!("rank ?: {err}");
            return ExitCode::FAILURE;
        }
    };
    let (n, me) = (world.size(), world.rank());
    let groups = (|| -> Result<Vec<NamedGroup>, CommError> {
        let pairs = if n.is_multiple_of(2) {
            world.group(&[me & !1, me | 1])?
        } else {
            world.group(&[me])?
        };
        let first_and_rest = if me == 0 {
            world.group(&[0])?
        } else {
            world.group(&(1..n).collect::<Vec<_>>())?
        };
        Ok(vec![("pairs", pairs), ("first+rest", first_and_rest)])
    })();
    let groups = match groups {
        Ok(groups) => groups,
        Err(err) => {
            println!("rank {me}: making groups: {err}");
            return ExitCode::FAILURE;
        }
    };
    let (mut passed, mut failed) = (0, 0);
    let (other_thread, again) = check_thread_level(&world, level);
    if let Some(complaint) = other_thread.or(again) {
        println!("rank {me}: thread level {level}: {complaint}");
        failed += 1;
    } else {
        passed += 1;
    }
    'cases: for case in CASES {
        let comms = std::iter::once(("world", &world as &dyn Communicator))
            .chain(groups.iter().map(|(name, c)| (*name, c.as_ref())));
        for (group_name, comm) in comms {
            let result = (case.run)(comm);
            if let Err(failure) = &result {
                println!("rank {me}: {} on {group_name}: {failure}", case.name);
            }
            let mut any_failed = [u32::from(result.is_err())];
            if let Err(err) = world.all_reduce_in_place(&mut any_failed, ReduceOp::Max) {
                println!("rank {me}: agreeing on {}: {err}", case.name);
                failed += 1;
                break 'cases;
            }
            if any_failed[0] == 0 {
                passed += 1;
            } else {
                failed += 1;
            }
        }
    }
    if me == 0 {
        println!("SUITE passed={passed} failed={failed}");
    }
    let _ = std::io::stdout().flush();
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Prints, then gives the other ranks time to print before this process exits (`mpirun` ends
/// the whole job when a rank exits after an MPI error).
fn say(line: String) {
    println!("{line}");
    let _ = std::io::stdout().flush();
    std::thread::sleep(Duration::from_secs(2));
}

/// Rank 2 panics while the others are in an all-reduce: they must report it at once (the
/// timeout is far longer than the launcher would tolerate for a hang). Under the watchdog the
/// job ends instead.
fn scenario_panic(on_timeout: OnTimeout) -> ExitCode {
    let world = MpiComm::world_with(Duration::from_secs(300), on_timeout).expect("MPI starts");
    world.barrier().expect("barrier");
    if world.rank() == 2 {
        panic!("rank 2 fails on purpose");
    }
    let mut x = vec![1f32; 1 << 16];
    match world.all_reduce_in_place(&mut x, ReduceOp::Sum) {
        Err(CommError::PeerFailed {
            peer: 2,
            cause: PeerFailure::Panicked,
            ..
        }) => say(format!("rank {}: expected PeerFailed", world.rank())),
        other => say(format!("rank {}: unexpected {other:?}", world.rank())),
    }
    ExitCode::SUCCESS
}

/// Every rank all-reduces `len + rank` elements. No rank may finish (with a wrong result) or
/// hang: a rank whose messages disagree with the schedule gets a Mismatch naming the peer; a
/// rank whose own messages happen to fit waits for a peer that gave up, and times out. Every
/// rank stays up until the others have timed out, so that all of them report.
fn scenario_mismatch(len: usize) -> ExitCode {
    let timeout = Duration::from_secs(3);
    let world = MpiComm::world(timeout).expect("MPI starts");
    let mut x = vec![1f32; len + world.rank()];
    let start = Instant::now();
    let outcome = world.all_reduce_in_place(&mut x, ReduceOp::Sum);
    let within = start.elapsed() < 2 * timeout;
    match outcome {
        Err(CommError::Mismatch { peer, .. }) if within => say(format!(
            "rank {}: refused as expected: Mismatch with peer {peer}",
            world.rank()
        )),
        Err(CommError::Timeout { .. }) if within => say(format!(
            "rank {}: refused as expected: Timeout",
            world.rank()
        )),
        other => say(format!(
            "rank {}: unexpected {other:?} after {:?}",
            world.rank(),
            start.elapsed()
        )),
    }
    // Up until the ranks that time out have reported, then the job may end.
    let until = timeout + Duration::from_millis(1_500);
    std::thread::sleep(until.saturating_sub(start.elapsed()));
    ExitCode::SUCCESS
}

/// Rank 3 never joins: the others must time out. Under the watchdog the job ends instead.
fn scenario_late(on_timeout: OnTimeout) -> ExitCode {
    let world = MpiComm::world_with(Duration::from_secs(3), on_timeout).expect("MPI starts");
    world.barrier().expect("barrier");
    if world.rank() == 3 {
        std::thread::sleep(Duration::from_secs(20));
        return ExitCode::SUCCESS;
    }
    let mut x = vec![1f64; 1000];
    match world.all_reduce_in_place(&mut x, ReduceOp::Mean) {
        Err(CommError::Timeout { .. }) => say(format!("rank {}: expected Timeout", world.rank())),
        other => say(format!("rank {}: unexpected {other:?}", world.rank())),
    }
    ExitCode::SUCCESS
}
