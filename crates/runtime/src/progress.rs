//! Gradient buckets reduced while the backward pass computes (`[parallel.overlap]`
//! `grad_computation_allreduce_overlap`).
//!
//! On the local backend a progress thread per rank runs each bucket's collective as soon as the
//! bucket is handed over, with its own reshard runner whose group communicators were created
//! when the executor was built (every rank in the same order, so the groups match across ranks
//! and never race the main runner's). MPI serialises a process's calls under one lock held for
//! a whole collective, so a second thread in a collective could deadlock two ranks' main
//! threads; there the buckets are packed when ready and reduced, in order, when the backward
//! pass ends — the same memory, no overlap.

use std::sync::mpsc;
use std::thread::JoinHandle;

use reshard::{PackedReduction, ReshardError, ReshardRunner};

/// A bucket handed over: its index and its packed gradients.
type Job = (usize, PackedReduction);

/// Where handed-over buckets are reduced.
#[derive(Debug)]
pub(crate) enum BucketReducer {
    /// A progress thread (the local backend).
    Thread {
        /// Jobs to the thread (dropped to stop it).
        jobs: Option<mpsc::Sender<Job>>,
        /// Results back, in the order handed over.
        done: mpsc::Receiver<(usize, Result<PackedReduction, ReshardError>)>,
        /// The thread (detached on drop: a thread stuck in a collective whose peers failed
        /// ends with that collective's error).
        _thread: JoinHandle<()>,
        /// Buckets handed over and not yet collected.
        in_flight: usize,
    },
    /// Reduced when collected, in order (MPI).
    Deferred {
        /// The runner.
        runner: ReshardRunner,
        /// Buckets handed over and not yet reduced.
        pending: Vec<Job>,
    },
}

impl BucketReducer {
    /// A reducer on a progress thread running `runner`.
    pub(crate) fn thread(mut runner: ReshardRunner) -> BucketReducer {
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (outbox, done) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            for (bucket, mut packed) in inbox {
                let result = runner.reduce_packed(&mut packed).map(|()| packed);
                if outbox.send((bucket, result)).is_err() {
                    break;
                }
            }
        });
        BucketReducer::Thread {
            jobs: Some(jobs),
            done,
            _thread: thread,
            in_flight: 0,
        }
    }

    /// A reducer that reduces at collection time with `runner`.
    pub(crate) fn deferred(runner: ReshardRunner) -> BucketReducer {
        BucketReducer::Deferred {
            runner,
            pending: Vec::new(),
        }
    }

    /// Hands bucket `bucket` over.
    pub(crate) fn submit(&mut self, bucket: usize, packed: PackedReduction) {
        match self {
            BucketReducer::Thread {
                jobs, in_flight, ..
            } => {
                // A send fails only when the thread has ended; `collect` then reports it.
                if jobs
                    .as_ref()
                    .is_some_and(|j| j.send((bucket, packed)).is_ok())
                {
                    *in_flight += 1;
                }
            }
            BucketReducer::Deferred { pending, .. } => pending.push((bucket, packed)),
        }
    }

    /// Every bucket handed over since the last collection, reduced, in order.
    pub(crate) fn collect(&mut self) -> Result<Vec<(usize, PackedReduction)>, ReshardError> {
        match self {
            BucketReducer::Thread {
                done, in_flight, ..
            } => {
                let mut out = Vec::with_capacity(*in_flight);
                while *in_flight > 0 {
                    *in_flight -= 1;
                    let (bucket, result) = done.recv().map_err(|_| ReshardError::Unsupported {
                        what: "the communication progress thread ended".to_string(),
                    })?;
                    out.push((bucket, result?));
                }
                Ok(out)
            }
            BucketReducer::Deferred { runner, pending } => {
                let mut out = Vec::with_capacity(pending.len());
                for (bucket, mut packed) in pending.drain(..) {
                    runner.reduce_packed(&mut packed)?;
                    out.push((bucket, packed));
                }
                Ok(out)
            }
        }
    }
}

impl Drop for BucketReducer {
    fn drop(&mut self) {
        if let BucketReducer::Thread { jobs, .. } = self {
            jobs.take();
        }
    }
}
