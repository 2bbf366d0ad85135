//! The unsafe edge: thin wrappers over rsmpi's raw MPI bindings. Every function returns MPI's
//! error code and message instead of aborting (our communicators use `MPI_ERRORS_RETURN`).

use std::ffi::c_void;
use std::os::raw::c_int;
use std::time::{Duration, Instant};

use ::mpi::ffi;

use crate::error::PeerFailure;
use crate::op::ReduceOp;

/// An MPI error: code and message.
pub(super) type MpiError = (i32, String);

/// Why a poll ended without completion.
pub(super) enum WaitError {
    Mpi(i32, String),
    Timeout,
    /// A member (group rank) announced a failure: a panic, or an error its run returned.
    PeerFailed(usize, PeerFailure),
    /// A member (group rank) disagrees with this one about the call: it sent a message of
    /// another length than the schedule expects.
    Mismatch {
        peer: usize,
        reason: String,
    },
}

impl From<MpiError> for WaitError {
    fn from((code, message): MpiError) -> WaitError {
        WaitError::Mpi(code, message)
    }
}

/// The element types MPI reduces.
#[derive(Debug, Clone, Copy)]
pub(super) enum Datatype {
    F64,
    F32,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
}

/// A communicator handle.
pub(super) struct Comm(ffi::MPI_Comm);

/// A request handle (transparent, so a slice of them is an array of `MPI_Request`).
#[repr(transparent)]
pub(super) struct Request(ffi::MPI_Request);

/// A matched, not yet received message.
pub(super) struct Message(ffi::MPI_Message);

/// The tag of failure notices on the control communicator.
const FAILURE_TAG: c_int = 1;

/// What a failure notice says. On the wire: one byte (1: panicked), or 2 followed by the
/// process's error message (UTF-8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Notice {
    /// The process is panicking.
    Panicked,
    /// The process's run returned this error.
    Failed(String),
}

impl Notice {
    /// The bytes sent.
    fn encode(&self) -> Vec<u8> {
        match self {
            Notice::Panicked => vec![1],
            Notice::Failed(reason) => {
                let mut bytes = vec![2];
                bytes.extend_from_slice(reason.as_bytes());
                bytes
            }
        }
    }

    /// What the peers report of a sender of `bytes`.
    fn cause(bytes: &[u8]) -> PeerFailure {
        match bytes.split_first() {
            Some((2, reason)) => PeerFailure::Aborted(String::from_utf8_lossy(reason).into_owned()),
            _ => PeerFailure::Panicked,
        }
    }
}

/// How long a failing process lingers after sending its notices.
const NOTICE_GRACE: Duration = Duration::from_millis(250);

/// The process's MPI handles: initialisation, the control communicator for failure notices,
/// and the notices seen so far.
pub(super) struct Raw {
    owns_init: bool,
    /// MPI accepts calls from any thread, one at a time (`MPI_THREAD_SERIALIZED` or more).
    pub(super) any_thread: bool,
    /// The thread that initialised (or looked up) MPI is MPI's main thread.
    pub(super) main_thread: bool,
    /// `MPI_IN_PLACE`, which is a macro: `(void *) 1` in OpenMPI, `(void *) -1` in MPICH.
    in_place: *mut c_void,
    ctrl: ffi::MPI_Comm,
    world_rank: usize,
    world_size: usize,
    /// What every world rank that announced a failure said.
    failed: Vec<Option<PeerFailure>>,
    /// [`Raw::poll_all`]'s statuses, kept across calls.
    statuses: Vec<ffi::MPI_Status>,
}

// SAFETY: the handles are plain identifiers; the runtime lock serialises every use of them
// (MPI_THREAD_SERIALIZED).
unsafe impl Send for Raw {}

fn error_string(code: c_int) -> String {
    let mut buf = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer has MPI_MAX_ERROR_STRING + 1 bytes, as MPI requires.
    unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    buf.truncate(usize::try_from(len).unwrap_or(0));
    String::from_utf8_lossy(&buf).into_owned()
}

fn check(rc: c_int) -> Result<(), MpiError> {
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err((rc, error_string(rc)))
    }
}

fn mpi_type(dtype: Datatype) -> ffi::MPI_Datatype {
    // SAFETY: reading rsmpi's exported constants.
    unsafe {
        match dtype {
            Datatype::F64 => ffi::RSMPI_DOUBLE,
            Datatype::F32 => ffi::RSMPI_FLOAT,
            Datatype::I64 => ffi::RSMPI_INT64_T,
            Datatype::I32 => ffi::RSMPI_INT32_T,
            Datatype::I16 => ffi::RSMPI_INT16_T,
            Datatype::I8 => ffi::RSMPI_INT8_T,
            Datatype::U64 => ffi::RSMPI_UINT64_T,
            Datatype::U32 => ffi::RSMPI_UINT32_T,
            Datatype::U16 => ffi::RSMPI_UINT16_T,
            Datatype::U8 => ffi::RSMPI_UINT8_T,
        }
    }
}

fn byte() -> ffi::MPI_Datatype {
    mpi_type(Datatype::U8)
}

fn mpi_op(op: ReduceOp) -> ffi::MPI_Op {
    // SAFETY: reading rsmpi's exported constants.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Mean => ffi::RSMPI_SUM,
            ReduceOp::Max => ffi::RSMPI_MAX,
            ReduceOp::Min => ffi::RSMPI_MIN,
        }
    }
}

/// A buffer address for MPI. An empty slice has a dangling address equal to its alignment —
/// `(void *) 1` for bytes, which is OpenMPI's `MPI_IN_PLACE` — so addresses in the first page
/// (never a real allocation) are replaced by a static that MPI never touches (count 0).
fn addr(p: *const u8) -> *mut c_void {
    static EMPTY: [u64; 1] = [0];
    if (p as usize) < 4096 {
        EMPTY.as_ptr() as *mut c_void
    } else {
        p as *mut c_void
    }
}

fn null_request() -> ffi::MPI_Request {
    // SAFETY: reading rsmpi's exported constant.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// Runs an MPI call that produces a request.
fn start(f: impl FnOnce(*mut ffi::MPI_Request) -> c_int) -> Result<Request, MpiError> {
    let mut request = null_request();
    check(f(&mut request))?;
    Ok(Request(request))
}

impl Raw {
    /// Initialises MPI unless the application already did, asking for
    /// `MPI_THREAD_SERIALIZED` or (`serialized == false`) `MPI_THREAD_SINGLE`.
    pub(super) fn init(serialized: bool) -> Result<Raw, String> {
        let mut flag: c_int = 0;
        // SAFETY: plain MPI queries and initialisation, before any other MPI use.
        unsafe {
            ffi::MPI_Finalized(&mut flag);
            if flag != 0 {
                return Err("MPI was already finalised in this process".to_string());
            }
            ffi::MPI_Initialized(&mut flag);
            let owns_init = flag == 0;
            if owns_init {
                crate::start_notice::announce_mpi_start();
                let mut provided: c_int = 0;
                let requested = if serialized {
                    ffi::RSMPI_THREAD_SERIALIZED
                } else {
                    ffi::RSMPI_THREAD_SINGLE
                };
                let rc = ffi::MPI_Init_thread(
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    requested,
                    &mut provided,
                );
                check(rc).map_err(|(c, m)| format!("MPI_Init_thread failed with {c}: {m}"))?;
            }
            let mut provided: c_int = 0;
            ffi::MPI_Query_thread(&mut provided);
            let any_thread = provided >= ffi::RSMPI_THREAD_SERIALIZED;
            ffi::MPI_Is_thread_main(&mut flag);
            let main_thread = flag != 0;
            let mut version = vec![0u8; ffi::RSMPI_MAX_LIBRARY_VERSION_STRING as usize + 1];
            let mut len: c_int = 0;
            ffi::MPI_Get_library_version(version.as_mut_ptr().cast(), &mut len);
            let mpich = String::from_utf8_lossy(&version).contains("MPICH");
            let in_place = if mpich { usize::MAX } else { 1 } as *mut c_void;
            let mut ctrl = ffi::RSMPI_COMM_WORLD;
            let rc = ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, &mut ctrl);
            check(rc).map_err(|(c, m)| format!("MPI_Comm_dup failed with {c}: {m}"))?;
            ffi::MPI_Comm_set_errhandler(ctrl, ffi::RSMPI_ERRORS_RETURN);
            let (mut rank, mut size) = (0, 0);
            ffi::MPI_Comm_rank(ctrl, &mut rank);
            ffi::MPI_Comm_size(ctrl, &mut size);
            let world_size = usize::try_from(size).unwrap_or(0);
            Ok(Raw {
                owns_init,
                any_thread,
                main_thread,
                in_place,
                ctrl,
                world_rank: usize::try_from(rank).unwrap_or(0),
                world_size,
                failed: vec![None; world_size],
                statuses: Vec::new(),
            })
        }
    }

    /// Frees the control communicator and finalises MPI if this crate initialised it.
    pub(super) fn finalize(&mut self) {
        // SAFETY: no request is pending (the caller checked the process is not poisoned).
        unsafe {
            ffi::MPI_Comm_free(&mut self.ctrl);
            if self.owns_init {
                ffi::MPI_Finalize();
            }
        }
    }

    /// A duplicate of `MPI_COMM_WORLD` with `MPI_ERRORS_RETURN`, its rank and size.
    pub(super) fn dup_world(&self) -> Result<(Comm, usize, usize), MpiError> {
        // SAFETY: plain MPI calls on valid handles.
        unsafe {
            let mut comm = ffi::RSMPI_COMM_WORLD;
            check(ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, &mut comm))?;
            Ok(self.adopt(comm))
        }
    }

    /// Sets `MPI_ERRORS_RETURN` on a new communicator and reads its rank and size.
    unsafe fn adopt(&self, comm: ffi::MPI_Comm) -> (Comm, usize, usize) {
        ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN);
        let (mut rank, mut size) = (0, 0);
        ffi::MPI_Comm_rank(comm, &mut rank);
        ffi::MPI_Comm_size(comm, &mut size);
        (
            Comm(comm),
            usize::try_from(rank).unwrap_or(0),
            usize::try_from(size).unwrap_or(0),
        )
    }

    /// A duplicate of `comm` with `MPI_ERRORS_RETURN` (collective over its members).
    pub(super) fn dup(&self, comm: &Comm) -> Result<Comm, MpiError> {
        // SAFETY: plain MPI calls on valid handles.
        unsafe {
            let mut dup = ffi::RSMPI_COMM_WORLD;
            check(ffi::MPI_Comm_dup(comm.0, &mut dup))?;
            Ok(self.adopt(dup).0)
        }
    }

    /// Frees a communicator.
    pub(super) fn free(&self, comm: &mut Comm) {
        // SAFETY: the handle is valid and no request on it is pending.
        unsafe { ffi::MPI_Comm_free(&mut comm.0) };
    }

    /// `MPI_Comm_create_group` of `parent` over `ranks` (ranks of `parent`).
    pub(super) fn create_group(
        &self,
        parent: &Comm,
        ranks: &[i32],
        tag: i32,
    ) -> Result<Comm, MpiError> {
        // SAFETY: plain MPI calls on valid handles; `ranks` outlives them.
        unsafe {
            let mut parent_group = std::mem::zeroed::<ffi::MPI_Group>();
            check(ffi::MPI_Comm_group(parent.0, &mut parent_group))?;
            let mut group = parent_group;
            let rc = ffi::MPI_Group_incl(
                parent_group,
                ranks.len() as c_int,
                ranks.as_ptr(),
                &mut group,
            );
            ffi::MPI_Group_free(&mut parent_group);
            check(rc)?;
            let mut comm = ffi::RSMPI_COMM_WORLD;
            let rc = ffi::MPI_Comm_create_group(parent.0, group, tag, &mut comm);
            ffi::MPI_Group_free(&mut group);
            check(rc)?;
            Ok(self.adopt(comm).0)
        }
    }

    /// Whether `request` completed (it is then freed by MPI).
    pub(super) fn test(&self, request: &mut Request) -> Result<bool, MpiError> {
        let mut flag: c_int = 0;
        // SAFETY: a valid request handle.
        check(unsafe { ffi::MPI_Test(&mut request.0, &mut flag, ffi::RSMPI_STATUS_IGNORE) })?;
        Ok(flag != 0)
    }

    /// Tests `request` until it completes or `timeout` passes (no notices watched).
    pub(super) fn wait(&self, request: &mut Request, timeout: Duration) -> Result<(), WaitError> {
        let deadline = Instant::now() + timeout;
        while !self.test(request)? {
            if Instant::now() >= deadline {
                return Err(WaitError::Timeout);
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Reads the failure notices that arrived, and returns a failed member (group rank) and
    /// what it announced.
    fn failed_member(
        &mut self,
        member: &dyn Fn(usize) -> Option<usize>,
    ) -> Result<Option<(usize, PeerFailure)>, MpiError> {
        loop {
            let mut flag: c_int = 0;
            // SAFETY: `status` is written by MPI before it is read.
            let mut status = unsafe { std::mem::zeroed::<ffi::MPI_Status>() };
            // SAFETY: valid handles; `status` describes a matched notice.
            unsafe {
                check(ffi::MPI_Iprobe(
                    ffi::RSMPI_ANY_SOURCE,
                    FAILURE_TAG,
                    self.ctrl,
                    &mut flag,
                    &mut status,
                ))?;
            }
            if flag == 0 {
                break;
            }
            let mut count: c_int = 0;
            // SAFETY: `status` was filled by the probe.
            check(unsafe { ffi::MPI_Get_count(&status, byte_type(), &mut count) })?;
            let mut notice = vec![0u8; usize::try_from(count).unwrap_or(0).max(1)];
            // SAFETY: valid handles; the notice (`count` bytes) is received into `notice`.
            check(unsafe {
                ffi::MPI_Recv(
                    notice.as_mut_ptr().cast(),
                    count,
                    byte_type(),
                    status.MPI_SOURCE,
                    FAILURE_TAG,
                    self.ctrl,
                    ffi::RSMPI_STATUS_IGNORE,
                )
            })?;
            if let Some(slot) = usize::try_from(status.MPI_SOURCE)
                .ok()
                .and_then(|r| self.failed.get_mut(r))
            {
                *slot = Some(Notice::cause(&notice));
            }
        }
        Ok((0..self.world_size).find_map(|r| {
            let cause = self.failed[r].as_ref()?;
            member(r).map(|peer| (peer, cause.clone()))
        }))
    }

    /// Polls until `check_done` reports completion, a member announces a panic, or
    /// `timeout` after `started`. Spins on MPI (which is how MPI itself waits) and yields the
    /// core when the wait is long, so oversubscribed runs make progress.
    ///
    /// The clock is read only every 64 polls (microseconds): a wait that ends sooner costs no
    /// clock read. `started` is set at the first read if still unset, so several waits of one
    /// call can share one deadline.
    fn poll_until<T>(
        &mut self,
        timeout: Duration,
        started: &mut Option<Instant>,
        member: &dyn Fn(usize) -> Option<usize>,
        mut check_done: impl FnMut(&Raw) -> Result<Option<T>, MpiError>,
    ) -> Result<T, WaitError> {
        let spin_for = Duration::from_micros(200);
        let mut spinning_since: Option<Instant> = None;
        let mut iteration = 0u64;
        loop {
            if let Some(done) = check_done(self)? {
                return Ok(done);
            }
            iteration += 1;
            // Not on the first miss: a short wait (most small collectives) then costs no
            // `MPI_Iprobe` and no clock read.
            if iteration.is_multiple_of(64) {
                if let Some((peer, cause)) = self.failed_member(member)? {
                    return Err(WaitError::PeerFailed(peer, cause));
                }
                let now = Instant::now();
                if now - *started.get_or_insert(now) >= timeout {
                    return Err(WaitError::Timeout);
                }
                if now - *spinning_since.get_or_insert(now) > spin_for {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Polls every request in `requests` to completion (`MPI_Testall`; see
    /// [`Raw::poll_until`]), then writes into `received[i]` the bytes request `i` received
    /// (meaningful for receives only). A receive whose message was longer than its buffer
    /// ends the wait early, with `received[i] = None` for it (the other requests may then be
    /// pending).
    pub(super) fn poll_all(
        &mut self,
        requests: &mut [Request],
        received: &mut Vec<Option<usize>>,
        (timeout, started): (Duration, &mut Option<Instant>),
        member: &dyn Fn(usize) -> Option<usize>,
    ) -> Result<(), WaitError> {
        let count = requests.len() as c_int;
        let array = requests.as_mut_ptr().cast::<ffi::MPI_Request>();
        let mut statuses = std::mem::take(&mut self.statuses);
        // SAFETY: `MPI_Status` is a plain C struct; zeroes are a valid value to overwrite.
        statuses.resize(requests.len(), unsafe { std::mem::zeroed() });
        let status_array = statuses.as_mut_ptr();
        let done = self.poll_until(timeout, started, member, |_| {
            let mut flag: c_int = 0;
            // SAFETY: `array` holds `count` valid (or null) request handles (`Request` is
            // transparent over `MPI_Request`) and `status_array` room for `count` statuses.
            let rc = unsafe { ffi::MPI_Testall(count, array, &mut flag, status_array) };
            if rc != 0 {
                // SAFETY: on an error MPI filled in every status's error field.
                let statuses = unsafe { std::slice::from_raw_parts(status_array, count as usize) };
                if let Some(i) = statuses.iter().position(|st| is_truncation(st.MPI_ERROR)) {
                    return Ok(Some(Some(i)));
                }
                check(rc)?;
            }
            Ok((flag != 0).then_some(None))
        });
        let truncated = done.as_ref().ok().copied().flatten();
        received.clear();
        received.extend(statuses.iter().enumerate().map(|(i, st)| {
            let mut bytes: c_int = 0;
            // SAFETY: a status MPI wrote when its request completed.
            unsafe { ffi::MPI_Get_count(st, byte_type(), &mut bytes) };
            (truncated != Some(i)).then(|| usize::try_from(bytes).unwrap_or(0))
        }));
        self.statuses = statuses;
        done.map(|_| ())
    }

    /// Polls `request` to completion; see [`Raw::poll_until`].
    pub(super) fn poll(
        &mut self,
        mut request: Request,
        timeout: Duration,
        member: impl Fn(usize) -> Option<usize>,
    ) -> Result<(), WaitError> {
        self.poll_until(timeout, &mut None, &member, |raw| {
            Ok(raw.test(&mut request)?.then_some(()))
        })
    }

    /// Waits for a message from `src` with `tag` and matches it: returns it and its length.
    pub(super) fn probe(
        &mut self,
        comm: &Comm,
        src: usize,
        tag: i32,
        timeout: Duration,
        member: impl Fn(usize) -> Option<usize>,
    ) -> Result<(Message, usize), WaitError> {
        let comm = comm.0;
        self.poll_until(timeout, &mut None, &member, |_| {
            let mut flag: c_int = 0;
            // SAFETY: valid handles; `status` and `message` are written before being read.
            unsafe {
                let mut message = std::mem::zeroed::<ffi::MPI_Message>();
                let mut status = std::mem::zeroed::<ffi::MPI_Status>();
                check(ffi::MPI_Improbe(
                    src as c_int,
                    tag,
                    comm,
                    &mut flag,
                    &mut message,
                    &mut status,
                ))?;
                if flag == 0 {
                    return Ok(None);
                }
                let mut count: c_int = 0;
                check(ffi::MPI_Get_count(&status, byte_type(), &mut count))?;
                Ok(Some((
                    Message(message),
                    usize::try_from(count).unwrap_or(0),
                )))
            }
        })
    }

    /// Tells every other world rank that this process is failing (`notice` says how), and
    /// waits (at most `timeout`) for the notices to leave.
    pub(super) fn announce_failure(&self, notice: &Notice, timeout: Duration) {
        // Leaked: a send that outlasts `timeout` must still find its buffer (this happens once,
        // on the way out of a failing process).
        let bytes: &'static [u8] = Box::leak(notice.encode().into_boxed_slice());
        let count = c_int::try_from(bytes.len()).unwrap_or(1);
        let mut requests: Vec<Request> = (0..self.world_size)
            .filter(|&r| r != self.world_rank)
            .filter_map(|r| {
                // SAFETY: `bytes` is leaked, so it outlives the send.
                start(|req| unsafe {
                    ffi::MPI_Isend(
                        bytes.as_ptr().cast(),
                        count,
                        byte_type(),
                        r as c_int,
                        FAILURE_TAG,
                        self.ctrl,
                        req,
                    )
                })
                .ok()
            })
            .collect();
        for request in &mut requests {
            if self.wait(request, timeout).is_err() {
                break;
            }
        }
        // A grace period: the peers poll for notices every few microseconds, but `mpirun`
        // tears the job down soon after this process exits.
        std::thread::sleep(NOTICE_GRACE.min(timeout));
    }

    pub(super) fn ibarrier(&self, comm: &Comm) -> Result<Request, MpiError> {
        // SAFETY: a valid communicator.
        start(|req| unsafe { ffi::MPI_Ibarrier(comm.0, req) })
    }

    /// # Safety
    /// `buf` is valid for `count` bytes until the request completes.
    pub(super) unsafe fn ibcast(
        &self,
        comm: &Comm,
        buf: *mut u8,
        count: i32,
        root: usize,
    ) -> Result<Request, MpiError> {
        start(|req| ffi::MPI_Ibcast(addr(buf), count, byte(), root as c_int, comm.0, req))
    }

    /// # Safety
    /// Buffers, counts and displacements are valid until the request completes.
    pub(super) unsafe fn ialltoallv(
        &self,
        comm: &Comm,
        (send, scounts, sdispls): (*const u8, &[i32], &[i32]),
        (recv, rcounts, rdispls): (*mut u8, &[i32], &[i32]),
    ) -> Result<Request, MpiError> {
        start(|req| {
            ffi::MPI_Ialltoallv(
                addr(send),
                scounts.as_ptr(),
                sdispls.as_ptr(),
                byte(),
                addr(recv),
                rcounts.as_ptr(),
                rdispls.as_ptr(),
                byte(),
                comm.0,
                req,
            )
        })
    }

    /// # Safety
    /// `buf` holds `count` bytes until the request completes.
    pub(super) unsafe fn isend(
        &self,
        comm: &Comm,
        buf: *const u8,
        count: i32,
        dst: usize,
        tag: i32,
    ) -> Result<Request, MpiError> {
        start(|req| ffi::MPI_Isend(addr(buf), count, byte(), dst as c_int, tag, comm.0, req))
    }

    /// # Safety
    /// `buf` is writable for `count` bytes until the request completes.
    pub(super) unsafe fn irecv(
        &self,
        comm: &Comm,
        buf: *mut u8,
        count: i32,
        src: usize,
        tag: i32,
    ) -> Result<Request, MpiError> {
        start(|req| ffi::MPI_Irecv(addr(buf), count, byte(), src as c_int, tag, comm.0, req))
    }

    /// # Safety
    /// `buf` holds `count` bytes until the request completes.
    pub(super) unsafe fn imrecv(
        &self,
        mut message: Message,
        buf: *mut u8,
        count: i32,
    ) -> Result<Request, MpiError> {
        start(|req| ffi::MPI_Imrecv(addr(buf), count, byte(), &mut message.0, req))
    }
}

/// The blocking collectives, for communicators whose calls a watchdog guards instead of a
/// deadline ([`super::OnTimeout::AbortJob`]): the same calls as the nonblocking ones above, but
/// served by OpenMPI's tuned algorithms.
impl Raw {
    pub(super) fn barrier(&self, comm: &Comm) -> Result<(), MpiError> {
        // SAFETY: a valid communicator.
        check(unsafe { ffi::MPI_Barrier(comm.0) })
    }

    /// # Safety
    /// `buf` is valid for `count` bytes.
    pub(super) unsafe fn bcast(
        &self,
        comm: &Comm,
        buf: *mut u8,
        count: i32,
        root: usize,
    ) -> Result<(), MpiError> {
        check(ffi::MPI_Bcast(
            addr(buf),
            count,
            byte(),
            root as c_int,
            comm.0,
        ))
    }

    /// In-place all-reduce.
    ///
    /// # Safety
    /// `buf` holds `count` elements of `dtype`.
    pub(super) unsafe fn allreduce(
        &self,
        comm: &Comm,
        (buf, count, dtype): (*mut u8, i32, Datatype),
        op: ReduceOp,
    ) -> Result<(), MpiError> {
        check(ffi::MPI_Allreduce(
            self.in_place,
            addr(buf),
            count,
            mpi_type(dtype),
            mpi_op(op),
            comm.0,
        ))
    }

    /// Starts an in-place all-reduce (`MPI_Iallreduce`), advanced by [`Raw::test`].
    ///
    /// # Safety
    /// `buf` holds `count` elements of `dtype` and stays valid, untouched by the caller, until
    /// the request completes.
    pub(super) unsafe fn iallreduce(
        &self,
        comm: &Comm,
        (buf, count, dtype): (*mut u8, i32, Datatype),
        op: ReduceOp,
    ) -> Result<Request, MpiError> {
        start(|req| {
            ffi::MPI_Iallreduce(
                self.in_place,
                addr(buf),
                count,
                mpi_type(dtype),
                mpi_op(op),
                comm.0,
                req,
            )
        })
    }

    /// Starts a reduce-scatter (`MPI_Ireduce_scatter`), advanced by [`Raw::test`].
    ///
    /// # Safety
    /// `send` holds the sum of `counts` elements of `dtype`, `recv` this rank's count; both
    /// buffers and `counts` stay valid, untouched by the caller, until the request completes.
    pub(super) unsafe fn ireduce_scatter(
        &self,
        comm: &Comm,
        (send, recv): (*const u8, *mut u8),
        counts: &[i32],
        dtype: Datatype,
        op: ReduceOp,
    ) -> Result<Request, MpiError> {
        start(|req| {
            ffi::MPI_Ireduce_scatter(
                addr(send),
                addr(recv),
                counts.as_ptr(),
                mpi_type(dtype),
                mpi_op(op),
                comm.0,
                req,
            )
        })
    }

    /// # Safety
    /// `send` holds the sum of `counts` elements of `dtype`, `recv` this rank's count.
    pub(super) unsafe fn reduce_scatter(
        &self,
        comm: &Comm,
        (send, recv): (*const u8, *mut u8),
        counts: &[i32],
        dtype: Datatype,
        op: ReduceOp,
    ) -> Result<(), MpiError> {
        check(ffi::MPI_Reduce_scatter(
            addr(send),
            addr(recv),
            counts.as_ptr(),
            mpi_type(dtype),
            mpi_op(op),
            comm.0,
        ))
    }

    /// Starts an all-gather of bytes (`MPI_Iallgather`), advanced by [`Raw::test`].
    ///
    /// # Safety
    /// `send` holds `count` bytes and `recv` `count × size` bytes; both stay valid, untouched
    /// by the caller, until the request completes.
    pub(super) unsafe fn iallgather(
        &self,
        comm: &Comm,
        send: *const u8,
        count: i32,
        recv: *mut u8,
    ) -> Result<Request, MpiError> {
        start(|req| {
            ffi::MPI_Iallgather(
                addr(send),
                count,
                byte(),
                addr(recv),
                count,
                byte(),
                comm.0,
                req,
            )
        })
    }

    /// # Safety
    /// `send` holds `count` bytes and `recv` `count × size` bytes.
    pub(super) unsafe fn allgather(
        &self,
        comm: &Comm,
        send: *const u8,
        count: i32,
        recv: *mut u8,
    ) -> Result<(), MpiError> {
        check(ffi::MPI_Allgather(
            addr(send),
            count,
            byte(),
            addr(recv),
            count,
            byte(),
            comm.0,
        ))
    }

    /// # Safety
    /// `send` holds `send_count` bytes; `recv` holds the counts at their displacements.
    pub(super) unsafe fn allgatherv(
        &self,
        comm: &Comm,
        (send, send_count): (*const u8, i32),
        recv: *mut u8,
        counts: &[i32],
        displs: &[i32],
    ) -> Result<(), MpiError> {
        check(ffi::MPI_Allgatherv(
            addr(send),
            send_count,
            byte(),
            addr(recv),
            counts.as_ptr(),
            displs.as_ptr(),
            byte(),
            comm.0,
        ))
    }

    /// # Safety
    /// As [`Raw::ialltoallv`].
    pub(super) unsafe fn alltoallv(
        &self,
        comm: &Comm,
        (send, scounts, sdispls): (*const u8, &[i32], &[i32]),
        (recv, rcounts, rdispls): (*mut u8, &[i32], &[i32]),
    ) -> Result<(), MpiError> {
        check(ffi::MPI_Alltoallv(
            addr(send),
            scounts.as_ptr(),
            sdispls.as_ptr(),
            byte(),
            addr(recv),
            rcounts.as_ptr(),
            rdispls.as_ptr(),
            byte(),
            comm.0,
        ))
    }

    /// This process's rank in `MPI_COMM_WORLD`.
    pub(super) fn world_rank(&self) -> usize {
        self.world_rank
    }
}

/// Ends the whole MPI job from any thread — even one racing another thread's blocking MPI call,
/// which the MPI standard leaves undefined but which is the point: the call cannot be
/// cancelled. Falls back to aborting this process (which `mpirun` also turns into the end of
/// the job) should `MPI_Abort` return.
pub(super) fn abort_job(code: i32) -> ! {
    // SAFETY: `MPI_Abort` on the world communicator; it does not return on success.
    unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, code) };
    std::process::abort()
}

/// Whether `code` is of MPI's error class "message truncated".
fn is_truncation(code: c_int) -> bool {
    let mut class: c_int = 0;
    // SAFETY: a query on an error code.
    unsafe { ffi::MPI_Error_class(code, &mut class) };
    code != 0 && class == ffi::MPI_ERR_TRUNCATE as c_int
}

fn byte_type() -> ffi::MPI_Datatype {
    byte()
}
