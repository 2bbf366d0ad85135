//! Writing several destination files at once: jobs (one file each) are taken in order by a few
//! threads, and their progress is forwarded to the caller's sink on the calling thread (a
//! [`Progress`] need not be `Sync`). The calling thread also polls the sink's stop after every
//! event it forwards and passes it on to the workers, whose own polls then end their jobs.
//!
//! Why files and not the pieces of one file: on ext4 a buffered write holds the inode's lock
//! exclusively, so two threads writing one file take turns (profiled on the 1 GiB 8→4
//! conversion: the second thread spins in `rwsem_spin_on_owner`), while two files are copied
//! into the page cache on two cores at once.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Mutex;

use crate::error::{CkptError, Result};
use crate::progress::{stop_point, Progress};

/// Files written at once where that is allowed: the machines Tessera is measured on have two
/// cores, and a third writer only adds contention for them.
const FILE_THREADS: usize = 2;

/// How many files to write at once: [`FILE_THREADS`], or fewer on a machine with fewer cores.
pub(crate) fn file_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(FILE_THREADS))
}

/// A progress event of a worker thread.
enum Event {
    Advance(u64),
    FileDone(PathBuf),
}

/// The progress sink of a worker thread: sends every event to the calling thread, and asks to
/// stop once the calling thread has seen the caller's sink ask.
struct Forward<'a> {
    events: mpsc::Sender<Event>,
    stop: &'a AtomicBool,
}

impl Progress for Forward<'_> {
    fn advance(&self, bytes: u64) {
        // The caller stops listening only once every worker is done.
        let _ = self.events.send(Event::Advance(bytes));
    }

    fn file_done(&self, path: &Path) {
        let _ = self.events.send(Event::FileDone(path.to_path_buf()));
    }

    fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// Runs `job(progress, j)` for every job of `jobs` on `n_threads` threads (one: on this thread,
/// in order, reporting to `progress` directly) and returns the results in job order. After a
/// failure no thread starts another job, and the error of the earliest failed job is returned.
/// Each thread's memory is what one job needs, so the total is `n_threads` times that.
///
/// `progress`'s stop is polled before any job starts and, with several threads, after every
/// event forwarded to it; once it asks, no thread starts another job, the jobs under way see
/// the stop at their next poll (their sink asks too), and [`CkptError::Stopped`] is returned
/// once every thread is done, whatever the jobs returned. A job must poll its sink itself
/// (the writers do, after every chunk) and leave nothing behind when it stops.
pub(crate) fn run_jobs<J: Send, T: Send>(
    jobs: Vec<J>,
    n_threads: usize,
    progress: &dyn Progress,
    job: impl Fn(&dyn Progress, J) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    stop_point(progress)?;
    let n_threads = n_threads.clamp(1, jobs.len().max(1));
    if n_threads == 1 {
        return jobs.into_iter().map(|j| job(progress, j)).collect();
    }
    let n_jobs = jobs.len();
    let queue = Mutex::new(jobs.into_iter().enumerate());
    let results: Mutex<Vec<Option<Result<T>>>> = Mutex::new((0..n_jobs).map(|_| None).collect());
    let failed = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<Event>();
    std::thread::scope(|scope| {
        for _ in 0..n_threads {
            let sink = Forward {
                events: tx.clone(),
                stop: &stop,
            };
            let (queue, results, failed, job) = (&queue, &results, &failed, &job);
            scope.spawn(move || loop {
                if failed.load(Ordering::Relaxed) || sink.stop_requested() {
                    break;
                }
                let next = queue.lock().unwrap_or_else(|p| p.into_inner()).next();
                let Some((i, j)) = next else { break };
                let result = job(&sink, j);
                if result.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(result);
            });
        }
        drop(tx);
        for event in rx {
            // Once stopped, the events of the jobs winding down are dropped.
            if stop.load(Ordering::Relaxed) {
                continue;
            }
            match event {
                Event::Advance(n) => progress.advance(n),
                Event::FileDone(path) => progress.file_done(&path),
            }
            if progress.stop_requested() {
                stop.store(true, Ordering::Relaxed);
            }
        }
    });
    if stop.into_inner() {
        return Err(CkptError::Stopped);
    }
    // Jobs are taken in order, so one that never started comes after every failure.
    let mut out = Vec::with_capacity(n_jobs);
    for result in results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .flatten()
    {
        out.push(result?);
    }
    if out.len() < n_jobs {
        return Err(CkptError::JobNotRun { job: out.len() });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Records events (not `Sync`, like a progress bar of the caller's thread).
    #[derive(Default)]
    struct Log(RefCell<Vec<String>>);

    impl Progress for Log {
        fn advance(&self, bytes: u64) {
            self.0.borrow_mut().push(format!("+{bytes}"));
        }
        fn file_done(&self, path: &Path) {
            self.0.borrow_mut().push(path.display().to_string());
        }
    }

    #[test]
    fn results_come_in_job_order_and_progress_reaches_the_caller() {
        for n_threads in [1, 2, 3] {
            let log = Log::default();
            let out = run_jobs((0..7u64).collect(), n_threads, &log, |p, j| {
                p.advance(j);
                p.file_done(Path::new(&format!("f{j}")));
                Ok(j * 10)
            })
            .unwrap();
            assert_eq!(out, (0..7).map(|j| j * 10).collect::<Vec<_>>());
            let mut events = log.0.into_inner();
            events.sort();
            assert_eq!(events.len(), 14);
            assert!(events.contains(&"+6".to_string()) && events.contains(&"f6".to_string()));
        }
    }

    /// Asks to stop once it has heard `after` advances.
    struct StopAfter {
        after: usize,
        heard: std::cell::Cell<usize>,
    }

    impl Progress for StopAfter {
        fn advance(&self, _: u64) {
            self.heard.set(self.heard.get() + 1);
        }
        fn stop_requested(&self) -> bool {
            self.heard.get() >= self.after
        }
    }

    #[test]
    fn a_stop_of_the_callers_sink_ends_the_jobs_under_way_and_starts_no_other() {
        for (n_threads, after) in [(1, 0), (1, 5), (2, 0), (2, 5), (3, 5)] {
            let started = Mutex::new(Vec::new());
            let completed = Mutex::new(Vec::new());
            let sink = StopAfter {
                after,
                heard: std::cell::Cell::new(0),
            };
            // Each job advances until its sink asks to stop, polling as the writers do (for at
            // most a minute, so that a stop that never arrives fails instead of hanging).
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            let err = run_jobs((0..50usize).collect(), n_threads, &sink, |p, j| {
                started.lock().unwrap().push(j);
                while std::time::Instant::now() < deadline {
                    stop_point(p)?;
                    p.advance(1);
                    std::thread::yield_now();
                }
                completed.lock().unwrap().push(j);
                Ok(j)
            })
            .unwrap_err();
            let case = format!("{n_threads} threads, stop after {after}");
            assert!(matches!(err, CkptError::Stopped), "{case}: {err}");
            assert_eq!(sink.heard.get(), after, "{case}: events after the stop");
            // Every job under way ended at the stop, and no thread took another one (none at
            // all for a stop asked before the first job).
            assert_eq!(completed.into_inner().unwrap(), [0; 0], "{case}");
            let started = started.into_inner().unwrap().len();
            assert!(
                started <= if after == 0 { 0 } else { n_threads },
                "{case}: {started}"
            );
        }
    }

    #[test]
    fn the_earliest_failure_is_reported_and_stops_new_jobs() {
        for n_threads in [1, 2] {
            let started = Mutex::new(Vec::new());
            let err = run_jobs(
                (0..50usize).collect(),
                n_threads,
                &Log::default(),
                |_, j| {
                    started.lock().unwrap().push(j);
                    if j >= 3 {
                        return Err(CkptError::JobNotRun { job: j });
                    }
                    Ok(j)
                },
            )
            .unwrap_err();
            assert_eq!(err.to_string(), CkptError::JobNotRun { job: 3 }.to_string());
            // Each thread may have taken one more job before it saw the failure.
            assert!(started.lock().unwrap().len() <= 3 + 2 * n_threads);
        }
    }
}
