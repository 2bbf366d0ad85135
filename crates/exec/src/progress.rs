//! Communication that runs while the steps go on (`[parallel.overlap]`): gradient buckets
//! reduced during the backward pass (`grad_computation_allreduce_overlap`), and hsdp weight
//! gathers (levels 1–3) one gather ahead (`computation_allgather_overlap`).
//!
//! On the local backend a progress thread per rank runs each job as soon as it is handed over,
//! with its own reshard runner whose group communicators were created when the executor was
//! built (every rank in the same order, so the groups match across ranks and never race the
//! main runner's). MPI serialises a process's calls under one lock held for a whole
//! collective, so a second thread in a collective could deadlock two ranks' main threads; there
//! a bucket starts as MPI's nonblocking all-reduce or reduce-scatter, and a gather as its
//! nonblocking all-gather, when handed over, and progresses while the steps go on (advanced
//! between steps, finished when the buckets are collected or the gather is taken).
//! Deterministic buckets, and gathers that are not one all-gather, run when handed over.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use reshard::ReshardPlan;
use reshard_exec::{
    ExecError as ReshardExecError, PackedReduction, ReshardRunner, StartedReduction, StartedReshard,
};
use tensor::Tensor;

/// Work handed over.
#[derive(Debug)]
pub(crate) enum Job {
    /// Gradient bucket `.0`, packed.
    Bucket(usize, PackedReduction),
    /// The gather of step `step`: `src` (this rank's piece) into `dst`.
    Gather {
        /// The program step.
        step: usize,
        /// Its plan.
        plan: Arc<ReshardPlan>,
        /// This rank's source slice (a copy).
        src: Tensor,
        /// The destination slice, written by the gather.
        dst: Tensor,
    },
}

impl Job {
    /// Runs the job with `runner`.
    fn run(self, runner: &mut ReshardRunner) -> Result<Job, ReshardExecError> {
        match self {
            Job::Bucket(b, mut packed) => {
                runner.reduce_packed(&mut packed)?;
                Ok(Job::Bucket(b, packed))
            }
            Job::Gather {
                step,
                plan,
                src,
                dst,
            } => {
                let mut out = [dst];
                runner.run_into(&plan, &[&src], &mut out)?;
                let [dst] = out;
                Ok(Job::Gather {
                    step,
                    plan,
                    src,
                    dst,
                })
            }
        }
    }
}

/// Where handed-over jobs run.
#[derive(Debug)]
enum Worker {
    /// A progress thread (the local backend).
    Thread {
        /// Jobs to the thread (dropped to stop it).
        jobs: Option<mpsc::Sender<Job>>,
        /// Results back, in the order handed over.
        done: mpsc::Receiver<Result<Job, ReshardExecError>>,
        /// The thread (detached on drop: a thread stuck in a collective whose peers failed
        /// ends with that collective's error).
        _thread: JoinHandle<()>,
        /// Jobs handed over and not yet received back.
        in_flight: usize,
        /// The groups the thread's runner created before it started (it creates no others).
        groups: Vec<Vec<usize>>,
    },
    /// This thread (MPI): gathers and buckets started when handed over as nonblocking
    /// collectives, advanced between steps ([`Progress::poll`]) and finished when taken or
    /// collected.
    Inline {
        /// The runner.
        runner: ReshardRunner,
        /// Buckets started and not yet collected, with their index.
        started: Vec<(usize, StartedReduction)>,
        /// Gathers started and not yet taken.
        gathers: Vec<StartedGather>,
    },
}

/// A gather started on this thread: its step, plan and source copy, and the reshard in flight.
#[derive(Debug)]
struct StartedGather {
    step: usize,
    plan: Arc<ReshardPlan>,
    src: Tensor,
    reshard: StartedReshard,
}

/// The jobs of one rank, and the finished ones not yet taken.
#[derive(Debug)]
pub(crate) struct Progress {
    worker: Worker,
    /// Finished jobs received while waiting for another.
    finished: VecDeque<Job>,
}

impl Progress {
    /// Jobs on a progress thread running `runner`.
    pub(crate) fn thread(mut runner: ReshardRunner) -> Progress {
        let groups = runner.created_groups();
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (outbox, done) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            for job in inbox {
                if outbox.send(job.run(&mut runner)).is_err() {
                    break;
                }
            }
        });
        Progress {
            worker: Worker::Thread {
                jobs: Some(jobs),
                done,
                _thread: thread,
                in_flight: 0,
                groups,
            },
            finished: VecDeque::new(),
        }
    }

    /// Jobs run on this thread by `runner` (no overlap).
    pub(crate) fn inline(runner: ReshardRunner) -> Progress {
        Progress {
            worker: Worker::Inline {
                runner,
                started: Vec::new(),
                gathers: Vec::new(),
            },
            finished: VecDeque::new(),
        }
    }

    /// The rank lists of the sub-group communicators its runner created.
    pub(crate) fn created_groups(&self) -> Vec<Vec<usize>> {
        match &self.worker {
            Worker::Thread { groups, .. } => groups.clone(),
            Worker::Inline { runner, .. } => runner.created_groups(),
        }
    }

    /// Hands `job` over.
    pub(crate) fn submit(&mut self, job: Job) -> Result<(), ReshardExecError> {
        match &mut self.worker {
            Worker::Thread {
                jobs, in_flight, ..
            } => {
                let sent = jobs.as_ref().is_some_and(|j| j.send(job).is_ok());
                if !sent {
                    return Err(ended());
                }
                *in_flight += 1;
            }
            Worker::Inline {
                runner,
                started,
                gathers,
            } => match job {
                Job::Gather {
                    step,
                    plan,
                    src,
                    dst,
                } => {
                    let reshard = runner.start_into(&plan, &[&src], vec![dst])?;
                    gathers.push(StartedGather {
                        step,
                        plan,
                        src,
                        reshard,
                    });
                }
                Job::Bucket(b, packed) => started.push((b, runner.start_packed(packed)?)),
            },
        }
        Ok(())
    }

    /// The next finished job from the worker.
    fn receive(&mut self) -> Result<Job, ReshardExecError> {
        match &mut self.worker {
            Worker::Thread {
                done, in_flight, ..
            } => {
                if *in_flight == 0 {
                    return Err(ended());
                }
                *in_flight -= 1;
                done.recv().map_err(|_| ended())?
            }
            Worker::Inline { .. } => Err(ended()),
        }
    }

    /// Advances the buckets started on this thread (MPI progresses a nonblocking collective
    /// only inside its calls); nothing for a progress thread, which runs them itself.
    pub(crate) fn poll(&mut self) -> Result<(), ReshardExecError> {
        if let Worker::Inline {
            started, gathers, ..
        } = &mut self.worker
        {
            for (_, reduction) in started.iter_mut() {
                reduction.test()?;
            }
            for gather in gathers.iter_mut() {
                gather.reshard.test()?;
            }
        }
        Ok(())
    }

    /// The gather of step `step`, once done (its destination slice and copied source).
    pub(crate) fn take_gather(
        &mut self,
        step: usize,
    ) -> Result<(Tensor, Tensor), ReshardExecError> {
        if let Worker::Inline {
            runner, gathers, ..
        } = &mut self.worker
        {
            if let Some(at) = gathers.iter().position(|g| g.step == step) {
                let StartedGather {
                    plan, src, reshard, ..
                } = gathers.remove(at);
                let [dst] = <[Tensor; 1]>::try_from(runner.finish_into(&plan, reshard)?).map_err(
                    |out| ReshardExecError::LocalMismatch {
                        reason: format!("a gather gave {} destination slices, not one", out.len()),
                    },
                )?;
                return Ok((dst, src));
            }
        }
        loop {
            if let Some(at) = self
                .finished
                .iter()
                .position(|j| matches!(j, Job::Gather { step: s, .. } if *s == step))
            {
                let Some(Job::Gather { src, dst, .. }) = self.finished.remove(at) else {
                    unreachable!("found above");
                };
                return Ok((dst, src));
            }
            let job = self.receive()?;
            self.finished.push_back(job);
        }
    }

    /// Every bucket handed over, reduced, in order.
    pub(crate) fn collect_buckets(
        &mut self,
    ) -> Result<Vec<(usize, PackedReduction)>, ReshardExecError> {
        if let Worker::Inline {
            runner, started, ..
        } = &mut self.worker
        {
            for (b, reduction) in started.drain(..) {
                let packed = runner.finish_packed(reduction)?;
                self.finished.push_back(Job::Bucket(b, packed));
            }
        }
        while matches!(self.worker, Worker::Thread { in_flight, .. } if in_flight > 0) {
            let job = self.receive()?;
            self.finished.push_back(job);
        }
        let mut buckets = Vec::new();
        let mut gathers = VecDeque::new();
        for job in self.finished.drain(..) {
            match job {
                Job::Bucket(b, packed) => buckets.push((b, packed)),
                gather @ Job::Gather { .. } => gathers.push_back(gather),
            }
        }
        self.finished = gathers;
        Ok(buckets)
    }
}

fn ended() -> ReshardExecError {
    ReshardExecError::Unsupported {
        what: "the communication progress thread ended".to_string(),
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Worker::Thread { jobs, .. } = &mut self.worker {
            jobs.take();
        }
    }
}
