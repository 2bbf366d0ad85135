//! The output of one `mpirun --tag-output` job, split back into the ranks' log files.
//!
//! OpenMPI prefixes what a rank writes with `[JOB,RANK]<stdout>:` or `<stderr>:` — each piece
//! it forwards, not each line: a line a rank wrote in several writes (Rust's unbuffered stderr
//! does) arrives as several tagged pieces, and pieces of different ranks may share one line of
//! `mpirun`'s output. The router keeps each rank's (and stream's) pieces until a newline ends
//! its line, then writes the line, without tags, to `worker_<RANK>.log` and to the console
//! prefixed `[worker RANK] `. `mpirun`'s own lines (untagged: its error reports) go to
//! `mpirun.log` and the console prefixed `[mpirun] `. The router remembers the first rank
//! reported as failed: by `tessera rank-env`'s line on that rank's stderr
//! ([`RANK_FAILED_LINE`], believed only when it ends with this job's [`FAILURE_TOKEN`](runtime::launch_env::FAILURE_TOKEN), which
//! the ranks' commands never see), or by `mpirun`'s report (which it sometimes leaves out).
//! When `mpirun` has ended, [`TaggedRouter::flush`] writes the pieces no newline ended.
//!
//! A rank's output is the rank's to write, so one thing stays open: a rank may print text that
//! looks like another rank's tag in the middle of a line, and it is taken as one (`mpirun`
//! itself starts a piece of another rank there when a line was left unended).

use std::collections::HashMap;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use runtime::launch_env::{
    MpiProgress, RANK_ENDED_BEFORE_MPI_LINE, RANK_FAILED_LINE, RANK_MPI_STARTING_LINE,
};

use super::hang::{HangRules, RankStates};
use super::mpi_start::MpiStarts;
use crate::launch::child::Event;
use crate::rank_env_cmd::{
    RANK_CONTINUED_LINE, RANK_FINISHED_LINE, RANK_PROGRESS_LINE, RANK_STOPPED_LINE,
};

use crate::launch::output::{cut_by_reader, write_out, LogFile, Router, MAX_LINE_BYTES};

/// One rank's log file and console prefix.
#[derive(Debug)]
pub struct RankOutput {
    /// `worker_<rank>.log`.
    pub log: Arc<LogFile>,
    /// `[worker <rank>] `.
    pub prefix: String,
}

/// Routes `mpirun --tag-output` lines to the ranks' logs.
#[derive(Debug)]
pub struct TaggedRouter {
    ranks: Vec<RankOutput>,
    own: RankOutput,
    /// Pieces of a line not yet ended, by (rank, from stderr).
    pending: Mutex<HashMap<(usize, bool), Vec<u8>>>,
    /// The first rank reported as failed in this job's run (by its rank-env or by `mpirun`),
    /// with how its command ended when its rank-env said so (`exit code 3`, `signal 9`).
    failed_rank: Mutex<Option<(usize, Option<String>)>>,
    /// This job's [`FAILURE_TOKEN`](runtime::launch_env::FAILURE_TOKEN): rank-env's failure line ends with ` [<token>]`.
    token: String,
    /// Which ranks said they started MPI, and which ended without.
    mpi_starts: Mutex<MpiStarts>,
    /// Which ranks' commands ended or are stopped (the watchdog's view, `--hang_time_out`).
    states: Mutex<RankStates>,
    /// The ranks stopped by a signal when the first failure was reported (`mpirun` may continue
    /// them as it stops the job).
    stopped_at_failure: Mutex<Vec<String>>,
    /// The ranks outside MPI while others waited inside it when the first failure was reported
    /// ([`RankStates::outside_while_others_wait`]).
    outside_at_failure: Mutex<Option<String>>,
    /// Why the watchdog took this attempt as hung, once it did.
    hung: Mutex<Option<String>>,
    /// Where to say that the job cannot complete ([`Event::Stop`]).
    stop: Mutex<Option<Sender<Event>>>,
    /// Per reader thread (`mpirun`'s stdout and stderr are read by one each, at once): what the
    /// last line that reader cut at [`MAX_LINE_BYTES`] leaves to its next line. One slot shared
    /// by both readers let a line of the other pipe take it, and the rest of a rank's long line
    /// went to `mpirun.log`.
    continued: Mutex<HashMap<std::thread::ThreadId, Carry>>,
}

/// What a line cut by its reader at [`MAX_LINE_BYTES`] leaves to the reader's next line.
#[derive(Debug, Default)]
struct Carry {
    /// The rank and stream whose piece ended the cut line: the next line goes on with it until
    /// a tag says otherwise (`None`: the cut line was `mpirun`'s own).
    to: Option<(usize, bool)>,
    /// The cut line's end that may be the start of a tag the cut split (`[1,0]<std`, at most
    /// [`MAX_PARTIAL_TAG`] bytes): put before the next line, so the tag is recognised whole.
    /// Without it, the piece after such a tag went to the rank before it.
    held: Vec<u8>,
}

/// The longest start of a tag that is not yet a whole tag: `[`, 47 bytes of ids and `]` (the
/// most [`tag_at`] looks for its `]` in), and `<stdout>` without its `:`.
const MAX_PARTIAL_TAG: usize = 1 + 47 + 1 + 8;

/// What one of rank-env's token-ended lines reports.
enum RankReport {
    /// The command failed: the line as shown.
    Failed(Vec<u8>),
    /// The command is starting MPI.
    MpiStarting,
    /// The command ended with exit code 0 without starting MPI: the line as shown.
    EndedBeforeMpi(Vec<u8>),
    /// The command ended with exit code 0 (after starting MPI).
    Finished,
    /// The command was stopped by this signal: the line as shown.
    Stopped(i32, Vec<u8>),
    /// The stopped command continued: the line as shown.
    Continued(Vec<u8>),
    /// The command's MPI backend reported its progress.
    Progress(MpiProgress),
}

/// One tagged piece of a line: its rank, its stream and its text.
#[derive(Debug, PartialEq, Eq)]
struct Piece<'l> {
    rank: usize,
    stderr: bool,
    text: &'l [u8],
}

impl TaggedRouter {
    /// A router for `ranks` (indexed by rank) and `mpirun`'s own lines, whose ranks' rank-env
    /// get `token` as their [`FAILURE_TOKEN`](runtime::launch_env::FAILURE_TOKEN).
    pub fn new(ranks: Vec<RankOutput>, own: RankOutput, token: &str) -> TaggedRouter {
        TaggedRouter {
            ranks,
            own,
            pending: Mutex::new(HashMap::new()),
            failed_rank: Mutex::new(None),
            token: token.to_string(),
            mpi_starts: Mutex::new(MpiStarts::default()),
            states: Mutex::new(RankStates::default()),
            hung: Mutex::new(None),
            stopped_at_failure: Mutex::new(Vec::new()),
            outside_at_failure: Mutex::new(None),
            stop: Mutex::new(None),
            continued: Mutex::new(HashMap::new()),
        }
    }

    /// Sends [`Event::Stop`] to `sender` when the job's ranks show that it cannot complete.
    pub fn stop_through(&self, sender: Sender<Event>) {
        *self.stop.lock().unwrap_or_else(|p| p.into_inner()) = Some(sender);
    }

    /// Why this attempt cannot complete, once the ranks' reports showed it (or the watchdog
    /// took it as hung: [`TaggedRouter::check_hung`]).
    pub fn cannot_complete(&self) -> Option<String> {
        let mpi = self
            .mpi_starts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .verdict()
            .map(str::to_string);
        mpi.or_else(|| self.hung.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// Why this attempt is hung under `rules` (`--hang_time_out`), the first time it is
    /// ([`RankStates::hung`]); `None` before, and after it was said once.
    pub fn check_hung(&self, rules: HangRules) -> Option<String> {
        let mut hung = self.hung.lock().unwrap_or_else(|p| p.into_inner());
        if hung.is_some() {
            return None;
        }
        let verdict =
            self.lock_states()
                .hung(self.ranks.len(), std::time::Instant::now(), rules)?;
        *hung = Some(verdict.clone());
        Some(verdict)
    }

    /// `rank 1's command is stopped (signal 19, SIGSTOP)` for each rank stopped when the first
    /// failure was reported (or now, without one).
    pub fn stopped_at_failure(&self) -> Vec<String> {
        let at = self
            .stopped_at_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match self.failed().is_some() {
            true => at,
            false => self.lock_states().stopped_now(),
        }
    }

    /// The ranks outside every MPI call while others waited inside one when the first failure
    /// was reported (or now, without one): the failed rank may have waited for them.
    pub fn outside_at_failure(&self) -> Option<String> {
        match self.failed().is_some() {
            true => self
                .outside_at_failure
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            false => self
                .lock_states()
                .outside_while_others_wait(std::time::Instant::now()),
        }
    }

    /// Records the first failure (`rank`, how its command ended when known) and the ranks
    /// stopped, or outside MPI while others waited inside it, at that moment.
    fn note_failure(&self, rank: usize, status: Option<String>) {
        let mut failed = self.failed_rank.lock().unwrap_or_else(|p| p.into_inner());
        if failed.is_none() {
            *failed = Some((rank, status));
            let states = self.lock_states();
            *self
                .stopped_at_failure
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = states.stopped_now();
            *self
                .outside_at_failure
                .lock()
                .unwrap_or_else(|p| p.into_inner()) =
                states.outside_while_others_wait(std::time::Instant::now());
        }
    }

    fn lock_states(&self) -> std::sync::MutexGuard<'_, RankStates> {
        self.states.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records one rank's MPI report; a new verdict is sent on as [`Event::Stop`].
    fn note_mpi(&self, rank: usize, started: bool) {
        let verdict = {
            let mut starts = self.mpi_starts.lock().unwrap_or_else(|p| p.into_inner());
            match started {
                true => starts.started(rank),
                false => starts.ended_without(rank),
            }
        };
        if let Some(verdict) = verdict {
            if let Some(stop) = &*self.stop.lock().unwrap_or_else(|p| p.into_inner()) {
                let _ = stop.send(Event::Stop(verdict));
            }
        }
    }

    /// The [`FAILURE_TOKEN`](runtime::launch_env::FAILURE_TOKEN) the ranks' rank-env get.
    pub fn failure_token(&self) -> &str {
        &self.token
    }

    /// Writes every piece still waiting for its newline, as a whole line, in rank order: the
    /// last words of ranks that ended without a newline (`mpirun` has ended, so nothing more
    /// of those lines will come).
    ///
    /// A cut line's end held back as a possible start of a tag goes first to the rank it
    /// continues (or, after a line of `mpirun`'s own, to `mpirun.log`): no tag followed it.
    pub fn flush(&self) {
        let carries: Vec<Carry> = self
            .continued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, carry)| carry)
            .collect();
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let mut console_line = Vec::new();
        for carry in carries.into_iter().filter(|c| !c.held.is_empty()) {
            match carry.to {
                Some(key) => pending
                    .entry(key)
                    .or_default()
                    .extend_from_slice(&carry.held),
                None => {
                    let mut text = carry.held;
                    text.push(b'\n');
                    write_out(&self.own.log, &self.own.prefix, &text, &mut console_line);
                }
            }
        }
        let mut left: Vec<((usize, bool), Vec<u8>)> = pending
            .drain()
            .filter(|(_, text)| !text.is_empty())
            .collect();
        left.sort_by_key(|(key, _)| *key);
        for ((rank, _), mut text) in left {
            text.push(b'\n');
            let out = &self.ranks[rank];
            write_out(&out.log, &out.prefix, &text, &mut console_line);
        }
    }

    /// What `line` (a whole line of a rank's stderr) reports, when it is one of its rank-env's
    /// own lines (ended with this job's token): the failure line or the end-before-MPI line
    /// without the token, or the MPI-start notice.
    fn rank_report(&self, line: &[u8]) -> Option<RankReport> {
        let body = line.strip_suffix(b"\n").unwrap_or(line);
        let suffix = runtime::launch_env::failure_token_suffix(&self.token);
        let shown = body.strip_suffix(suffix.as_bytes())?;
        let with_newline = || {
            let mut shown = shown.to_vec();
            shown.push(b'\n');
            shown
        };
        if shown.starts_with(RANK_FAILED_LINE.as_bytes()) {
            Some(RankReport::Failed(with_newline()))
        } else if shown == RANK_MPI_STARTING_LINE.as_bytes() {
            Some(RankReport::MpiStarting)
        } else if shown.starts_with(RANK_ENDED_BEFORE_MPI_LINE.as_bytes()) {
            Some(RankReport::EndedBeforeMpi(with_newline()))
        } else if shown == RANK_FINISHED_LINE.as_bytes() {
            Some(RankReport::Finished)
        } else if shown == RANK_CONTINUED_LINE.as_bytes() {
            Some(RankReport::Continued(with_newline()))
        } else if let Some(report) = shown.strip_prefix(RANK_PROGRESS_LINE.as_bytes()) {
            let report = MpiProgress::parse(std::str::from_utf8(report).ok()?)?;
            Some(RankReport::Progress(report))
        } else if shown.starts_with(RANK_STOPPED_LINE.as_bytes()) {
            let text = std::str::from_utf8(&shown[RANK_STOPPED_LINE.len()..]).ok()?;
            let signal = text.trim().strip_prefix("(signal ")?.strip_suffix(')')?;
            Some(RankReport::Stopped(signal.parse().ok()?, with_newline()))
        } else {
            None
        }
    }

    /// The first rank reported as failed, by its rank-env's line or by `mpirun`'s report.
    pub fn failed_rank(&self) -> Option<usize> {
        self.failed().map(|(rank, _)| rank)
    }

    /// How the first failed rank's command ended (`exit code 3`, `signal 9`), when its rank-env
    /// said so (`mpirun`'s own report gives only mpirun's view).
    pub fn failed_status(&self) -> Option<String> {
        self.failed().and_then(|(_, status)| status)
    }

    fn failed(&self) -> Option<(usize, Option<String>)> {
        self.failed_rank
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Forgets the failed rank, the ranks' MPI reports and any unfinished line (before the job
    /// is started again).
    pub fn reset(&self) {
        *self.failed_rank.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *self.mpi_starts.lock().unwrap_or_else(|p| p.into_inner()) = MpiStarts::default();
        *self.lock_states() = RankStates::default();
        *self.hung.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.stopped_at_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        *self
            .outside_at_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        self.continued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Every rank's log file, in rank order.
    pub fn rank_logs(&self) -> impl Iterator<Item = &Arc<LogFile>> {
        self.ranks.iter().map(|r| &r.log)
    }
}

impl Router for TaggedRouter {
    fn route(&self, line: &[u8], emit: &mut dyn FnMut(&LogFile, &str, &[u8])) {
        // A line of `mpirun`'s longer than the reader takes at once comes in parts, each ended
        // by a newline the reader added (not the rank's, dropped here): the next part goes on
        // with the last piece's rank, after the end of this part that may start a tag.
        let cut = cut_by_reader(line);
        let reader = std::thread::current().id();
        let carry = self
            .continued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&reader)
            .unwrap_or_default();
        let joined;
        let whole: &[u8] = match carry.held.is_empty() {
            true => line,
            false => {
                joined = [&carry.held[..], line].concat();
                &joined
            }
        };
        let (text, held) = match cut {
            true => {
                let body = &whole[..whole.len() - 1];
                body.split_at(body.len() - partial_tag_len(body))
            }
            false => (whole, &[][..]),
        };
        let pieces = split_pieces(text, self.ranks.len(), carry.to);
        if cut {
            let to = pieces.last().map(|piece| (piece.rank, piece.stderr));
            self.continued
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(
                    reader,
                    Carry {
                        to,
                        held: held.to_vec(),
                    },
                );
        }
        if pieces.is_empty() {
            if let Some(rank) = reported_failure(text) {
                self.note_failure(rank, None);
            }
            match cut {
                true => emit(&self.own.log, &self.own.prefix, &[text, b"\n"].concat()),
                false => emit(&self.own.log, &self.own.prefix, text),
            }
            return;
        }
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        for piece in pieces {
            let out = &self.ranks[piece.rank];
            let buffer = pending.entry((piece.rank, piece.stderr)).or_default();
            buffer.extend_from_slice(piece.text);
            // A line ends at its newline; an endless one is cut as the log contract says.
            if buffer.last() == Some(&b'\n') || buffer.len() >= MAX_LINE_BYTES {
                if buffer.last() != Some(&b'\n') {
                    buffer.push(b'\n');
                }
                let now = std::time::Instant::now();
                match self.rank_report(buffer).filter(|_| piece.stderr) {
                    Some(RankReport::Failed(shown)) => {
                        let status = failure_status(&shown);
                        let how = status.clone().unwrap_or_else(|| "failed".into());
                        self.note_failure(piece.rank, status);
                        self.lock_states().ended(piece.rank, now, how);
                        emit(&out.log, &out.prefix, &shown);
                    }
                    // Not the rank's output: recorded, not shown.
                    Some(RankReport::MpiStarting) => self.note_mpi(piece.rank, true),
                    Some(RankReport::Finished) => {
                        self.lock_states()
                            .ended(piece.rank, now, "exit code 0".into());
                    }
                    Some(RankReport::EndedBeforeMpi(shown)) => {
                        self.lock_states()
                            .ended(piece.rank, now, "exit code 0".into());
                        self.note_mpi(piece.rank, false);
                        emit(&out.log, &out.prefix, &shown);
                    }
                    Some(RankReport::Stopped(signal, shown)) => {
                        self.lock_states().stopped(piece.rank, now, signal);
                        emit(&out.log, &out.prefix, &shown);
                    }
                    Some(RankReport::Continued(shown)) => {
                        self.lock_states().continued(piece.rank);
                        emit(&out.log, &out.prefix, &shown);
                    }
                    // Recorded, not shown: a few lines a run, for the watchdog.
                    Some(RankReport::Progress(report)) => {
                        self.lock_states().progress(piece.rank, now, report);
                    }
                    None => emit(&out.log, &out.prefix, buffer),
                }
                buffer.clear();
            }
        }
    }
}

/// The tag at the start of `text`: (rank, stderr, the tag's length).
fn tag_at(text: &[u8]) -> Option<(usize, bool, usize)> {
    let rest = text.strip_prefix(b"[")?;
    let close = rest.iter().take(48).position(|&b| b == b']')?;
    let ids = &rest[..close];
    let comma = ids.iter().position(|&b| b == b',')?;
    let digits = |d: &[u8]| !d.is_empty() && d.iter().all(u8::is_ascii_digit);
    if !digits(&ids[..comma]) || !digits(&ids[comma + 1..]) {
        return None;
    }
    let rank = std::str::from_utf8(&ids[comma + 1..]).ok()?.parse().ok()?;
    let after = &rest[close + 1..];
    let (stderr, name) = if after.starts_with(b"<stdout>:") {
        (false, 9)
    } else if after.starts_with(b"<stderr>:") {
        (true, 9)
    } else {
        return None;
    };
    Some((rank, stderr, 1 + close + 1 + name))
}

/// How many bytes at the end of `text` (a line cut by its reader, without the reader's newline)
/// may be the start of a tag the cut split: from a `[` at most [`MAX_PARTIAL_TAG`] bytes from
/// the end, up to the end, when that could still grow into a tag [`tag_at`] takes (`[12`,
/// `[1,0]<std`); 0 when there is none, or the end is a whole tag.
fn partial_tag_len(text: &[u8]) -> usize {
    let from = text.len().saturating_sub(MAX_PARTIAL_TAG);
    let Some(open) = text[from..].iter().rposition(|&b| b == b'[') else {
        return 0;
    };
    let start = &text[from + open..];
    match could_start_tag(start) && tag_at(start).is_none() {
        true => start.len(),
        false => 0,
    }
}

/// Whether `text` (starting with `[`) is the start of something [`tag_at`] takes as a tag:
/// `[`, digits, one comma, digits, `]` within [`tag_at`]'s reach, then a start of `<stdout>:`
/// or `<stderr>:` short of the whole.
fn could_start_tag(text: &[u8]) -> bool {
    let Some(rest) = text.strip_prefix(b"[") else {
        return false;
    };
    let ids_start = |ids: &[u8]| match ids.iter().position(|&b| b == b',') {
        None => ids.iter().all(u8::is_ascii_digit),
        Some(comma) => {
            comma > 0
                && ids[..comma].iter().all(u8::is_ascii_digit)
                && ids[comma + 1..].iter().all(u8::is_ascii_digit)
        }
    };
    match rest.iter().position(|&b| b == b']') {
        // `]` is looked for within the first 48 bytes after `[`.
        None => rest.len() < 48 && ids_start(rest),
        Some(close) => {
            let ids = &rest[..close];
            let after = &rest[close + 1..];
            close < 48
                && ids_start(ids)
                && ids
                    .iter()
                    .position(|&b| b == b',')
                    .is_some_and(|c| c + 1 < ids.len())
                && [&b"<stdout>:"[..], b"<stderr>:"]
                    .iter()
                    .any(|name| after.len() < name.len() && name.starts_with(after))
        }
    }
}

/// A tagged line's pieces (empty when it does not start with a tag of one of `ranks` ranks and
/// does not continue a cut line: then it is `mpirun`'s own). `continued` is the rank and stream
/// of the piece that ended the cut line before it, whose text goes on up to the first tag.
fn split_pieces(line: &[u8], ranks: usize, continued: Option<(usize, bool)>) -> Vec<Piece<'_>> {
    let tagged = tag_at(line).filter(|(r, _, _)| *r < ranks);
    let Some((rank, stderr, len)) = tagged.or(continued.map(|(r, e)| (r, e, 0))) else {
        return Vec::new();
    };
    let mut pieces = Vec::new();
    let mut current = (rank, stderr, len);
    let mut at = len;
    let mut start = len;
    while at < line.len() {
        if line[at] == b'[' {
            if let Some(next) = tag_at(&line[at..]).filter(|(r, _, _)| *r < ranks) {
                pieces.push(Piece {
                    rank: current.0,
                    stderr: current.1,
                    text: &line[start..at],
                });
                current = next;
                at += next.2;
                start = at;
                continue;
            }
        }
        at += 1;
    }
    pieces.push(Piece {
        rank: current.0,
        stderr: current.1,
        text: &line[start..],
    });
    pieces
}

/// What a rank-env failure line (without its token) says of the command's end: `exit code 3`
/// from `… failed (exit code 3)`.
fn failure_status(shown: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(shown).ok()?;
    let rest = text.strip_prefix(RANK_FAILED_LINE)?.trim();
    let status = rest.strip_prefix('(')?.strip_suffix(')')?;
    (!status.is_empty()).then(|| status.to_string())
}

/// The rank named by one of `mpirun`'s failure reports: `… process rank 3 with PID …` or
/// `Process name: [[41230,1],3]`.
pub fn reported_failure(line: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(line).ok()?;
    let number = |s: &str| -> Option<usize> {
        let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    if let Some(at) = text.find("process rank ") {
        return number(&text[at + 13..]);
    }
    let at = text.find("Process name: [[")?;
    let inner = &text[at + 16..];
    let close = inner.find(']')?;
    number(inner[close + 1..].strip_prefix(',')?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed(router: &TaggedRouter, line: &[u8]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        router.route(line, &mut |log, _, body| {
            let name = log
                .path()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.push((name, String::from_utf8_lossy(body).into_owned()));
        });
        out
    }

    fn router(dir: &std::path::Path) -> TaggedRouter {
        let open = |name: &str, prefix: &str| RankOutput {
            log: Arc::new(LogFile::open(dir.join(name)).unwrap()),
            prefix: prefix.to_string(),
        };
        TaggedRouter::new(
            vec![open("w0", "[worker 0] "), open("w1", "[worker 1] ")],
            open("m", "[mpirun] "),
            "T0KEN",
        )
    }

    #[test]
    fn a_rank_ending_before_mpi_while_another_started_it_stops_the_job() {
        let dir = tempfile::tempdir().unwrap();
        let router = router(dir.path());
        let (sender, receiver) = std::sync::mpsc::channel();
        router.stop_through(sender);
        // The start notice is recorded, not shown; without the token it is the rank's text.
        let start = format!("[1,0]<stderr>:{RANK_MPI_STARTING_LINE} [T0KEN]\n");
        assert!(routed(&router, start.as_bytes()).is_empty());
        let forged = format!("[1,1]<stderr>:{RANK_ENDED_BEFORE_MPI_LINE} (exit code 0)\n");
        assert_eq!(routed(&router, forged.as_bytes()).len(), 1);
        assert!(receiver.try_recv().is_err(), "not rank-env's line");
        let ended = format!("[1,1]<stderr>:{RANK_ENDED_BEFORE_MPI_LINE} (exit code 0) [T0KEN]\n");
        assert_eq!(
            routed(&router, ended.as_bytes()),
            [(
                "w1".to_string(),
                format!("{RANK_ENDED_BEFORE_MPI_LINE} (exit code 0)\n")
            )]
        );
        match receiver.try_recv() {
            Ok(Event::Stop(reason)) => assert!(
                reason.contains("rank 1 ended (exit code 0) without starting MPI, while rank 0"),
                "{reason}"
            ),
            other => panic!("expected a stop, got {other:?}"),
        }
        assert!(router.cannot_complete().is_some());
        router.reset();
        assert_eq!(router.cannot_complete(), None, "a new attempt starts clean");
    }

    /// rank-env's progress lines are recorded, not shown: with a rank outside MPI while the
    /// other waits inside it, a failure's report names it (and without the token the line is
    /// the rank's own text).
    #[test]
    fn progress_lines_are_recorded_for_a_failures_report() {
        let dir = tempfile::tempdir().unwrap();
        let router = router(dir.path());
        let inside = format!(
            "[1,0]<stderr>:{RANK_PROGRESS_LINE}inside 5000 all_reduce on group world [T0KEN]\n"
        );
        let outside = format!("[1,1]<stderr>:{RANK_PROGRESS_LINE}outside 7000 [T0KEN]\n");
        let forged = format!("[1,1]<stderr>:{RANK_PROGRESS_LINE}moving\n");
        assert!(routed(&router, inside.as_bytes()).is_empty());
        assert_eq!(
            routed(&router, forged.as_bytes()).len(),
            1,
            "not rank-env's"
        );
        assert_eq!(router.outside_at_failure(), None, "rank 1 not yet reported");
        assert!(routed(&router, outside.as_bytes()).is_empty());
        let failed = format!("[1,0]<stderr>:{RANK_FAILED_LINE} (exit code 1) [T0KEN]\n");
        routed(&router, failed.as_bytes());
        let said = router.outside_at_failure().expect("named");
        assert!(
            said.starts_with("rank 1 had run outside every MPI call for 7 s while rank 0 waited inside all_reduce on group world for 5 s"),
            "{said}"
        );
        router.reset();
        assert_eq!(
            router.outside_at_failure(),
            None,
            "a new attempt starts clean"
        );
    }

    /// A rank's line longer than the reader takes at once (it cuts at `MAX_LINE_BYTES` and adds
    /// a newline) stays the rank's: its untagged continuation goes to the rank's log, not to
    /// mpirun's.
    #[test]
    fn a_long_line_cut_by_the_reader_stays_with_its_rank() {
        let dir = tempfile::tempdir().unwrap();
        let router = router(dir.path());
        let text = vec![b'x'; MAX_LINE_BYTES + 5000];
        let mut physical = b"[1,1]<stderr>:".to_vec();
        physical.extend_from_slice(&text);
        physical.push(b'\n');
        // As the reader hands it over.
        let mut first = physical[..MAX_LINE_BYTES].to_vec();
        first.push(b'\n');
        let rest = &physical[MAX_LINE_BYTES..];
        let mut out = routed(&router, &first);
        out.extend(routed(&router, rest));
        assert!(
            out.iter().all(|(log, _)| log == "w1"),
            "{:?}",
            out.iter().map(|(l, t)| (l, t.len())).collect::<Vec<_>>()
        );
        let written: usize = out
            .iter()
            .map(|(_, t)| t.trim_end_matches('\n').len())
            .sum();
        assert_eq!(
            written,
            text.len(),
            "every byte, once, and no newline of the reader's"
        );
        // The next line starts fresh: untagged, it is mpirun's.
        assert_eq!(routed(&router, b"mpirun: a line\n")[0].0, "m");
    }

    /// `mpirun`'s stdout and stderr are read by two threads at once: a rank's line on the
    /// other pipe between the parts of a cut line does not end the cut line's continuation
    /// (it did, and the rest of a rank's long output went to `mpirun.log`).
    #[test]
    fn a_line_of_the_other_pipe_does_not_break_a_cut_line() {
        let dir = tempfile::tempdir().unwrap();
        let router = router(dir.path());
        let mut physical = b"[1,0]<stdout>:".to_vec();
        physical.extend_from_slice(&vec![b'x'; MAX_LINE_BYTES + 100]);
        physical.push(b'\n');
        let mut first = physical[..MAX_LINE_BYTES].to_vec();
        first.push(b'\n');
        let mut out = routed(&router, &first);
        // The stderr reader's line, from its own thread.
        let other = std::thread::scope(|s| {
            s.spawn(|| routed(&router, b"[1,1]<stderr>:a line of rank 1\n"))
                .join()
                .unwrap()
        });
        assert_eq!(other[0].0, "w1");
        out.extend(routed(&router, &physical[MAX_LINE_BYTES..]));
        assert!(
            out.iter().all(|(log, _)| log == "w0"),
            "{:?}",
            out.iter().map(|(l, t)| (l, t.len())).collect::<Vec<_>>()
        );
    }

    /// `mpirun`'s output as its reader hands it over: lines, and a longer run cut into lines of
    /// [`MAX_LINE_BYTES`] each ended by a newline the reader adds.
    fn reader_lines(stream: &[u8]) -> Vec<Vec<u8>> {
        let mut lines = Vec::new();
        let mut rest = stream;
        while !rest.is_empty() {
            let window = &rest[..rest.len().min(MAX_LINE_BYTES)];
            let take = match window.iter().position(|&b| b == b'\n') {
                Some(end) => end + 1,
                None => window.len(),
            };
            let mut line = rest[..take].to_vec();
            if line.last() != Some(&b'\n') {
                line.push(b'\n');
            }
            lines.push(line);
            rest = &rest[take..];
        }
        lines
    }

    /// Routes each of `lines` as its reader would, writing every line to its log.
    fn route_to_logs(router: &TaggedRouter, lines: &[Vec<u8>]) {
        for line in lines {
            router.route(line, &mut |log, _, body| log.write_line(body));
        }
    }

    /// A log's bytes without the newlines (the ranks' texts have none; the router ends a line
    /// at [`MAX_LINE_BYTES`]).
    fn log_text(dir: &std::path::Path, name: &str) -> Vec<u8> {
        let mut text = std::fs::read(dir.join(name)).unwrap();
        text.retain(|&b| b != b'\n');
        text
    }

    /// A reader's cut at [`MAX_LINE_BYTES`] may fall inside a tag (`…[1,0]<std` | `out>:…`):
    /// the tag is still recognised, and each rank's log gets exactly its own bytes, wherever in
    /// the tag (of either stream, with a short or a long job id) the cut falls. The piece
    /// after a split tag used to go to the rank before it.
    #[test]
    fn a_tag_split_by_the_readers_cut_is_still_recognised() {
        for (job, stream) in [("1", "stdout"), ("41230", "stderr")] {
            let tag = |rank: usize| format!("[{job},{rank}]<{stream}>:").into_bytes();
            for k in 0..=tag(1).len() {
                let dir = tempfile::tempdir().unwrap();
                let router = router(dir.path());
                // The ranks' distinct texts, and mpirun's one endless line of their pieces.
                let mut own = [Vec::new(), Vec::new()];
                let mut physical = Vec::new();
                let mut piece = |rank: usize, len: usize, physical: &mut Vec<u8>| {
                    physical.extend_from_slice(&tag(rank));
                    let base = [b'a', b'A'][rank];
                    let text: Vec<u8> = (0..len).map(|i| base + (i % 26) as u8).collect();
                    physical.extend_from_slice(&text);
                    own[rank].extend_from_slice(&text);
                };
                // Rank 1's tag starts k bytes before the first cut; the next cuts fall into
                // rank 0's and rank 1's tags at other places.
                let first = MAX_LINE_BYTES - tag(0).len() - k;
                piece(0, first, &mut physical);
                piece(1, 4096, &mut physical);
                let to_second = 2 * MAX_LINE_BYTES - physical.len() - (k + 3) % tag(0).len();
                piece(0, to_second, &mut physical);
                piece(1, MAX_LINE_BYTES - 1 - k % 5, &mut physical);
                piece(0, 3000, &mut physical);
                physical.extend_from_slice(&tag(0));
                physical.extend_from_slice(&tag(1));
                physical.push(b'\n');
                route_to_logs(&router, &reader_lines(&physical));
                router.flush();
                for (rank, name) in ["w0", "w1"].into_iter().enumerate() {
                    let got = log_text(dir.path(), name);
                    assert!(
                        got == own[rank],
                        "job {job} {stream}, cut {k} bytes into the tag: {name} has {} bytes, rank {rank} wrote {}",
                        got.len(),
                        own[rank].len()
                    );
                }
                assert!(log_text(dir.path(), "m").is_empty(), "cut {k}");
            }
        }
    }

    /// What a cut line's end held back as a possible tag start is not lost when no tag follows:
    /// it goes on with its rank (or `mpirun`'s own line), or is written at the end.
    #[test]
    fn a_held_back_tag_start_that_is_no_tag_stays_where_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let router = router(dir.path());
        let mut physical = b"[1,1]<stdout>:".to_vec();
        physical.resize(MAX_LINE_BYTES - 3, b'x');
        physical.extend_from_slice(b"[1,");
        physical.extend_from_slice(b"x]<stdout>:y\n");
        route_to_logs(&router, &reader_lines(&physical));
        // mpirun's own cut line, its end held back, continued by a tag.
        let mut own = vec![b'm'; MAX_LINE_BYTES - 4];
        own.extend_from_slice(b"[1,1]<stdout>:late\n");
        route_to_logs(&router, &reader_lines(&own));
        // A rank's text ending in a tag's start when mpirun ends.
        let mut last = b"[1,0]<stdout>:".to_vec();
        last.resize(MAX_LINE_BYTES - 9, b'z');
        last.extend_from_slice(b"[1,0]<std");
        let lines = reader_lines(&last);
        assert_eq!(lines.len(), 1, "cut right after the partial tag");
        route_to_logs(&router, &lines);
        router.flush();
        let w1 = log_text(dir.path(), "w1");
        assert!(
            w1.ends_with(b"xx[1,x]<stdout>:ylate"),
            "{:?}",
            &w1[w1.len() - 30..]
        );
        assert_eq!(w1.len(), MAX_LINE_BYTES - 14 + b"x]<stdout>:y".len() + 4);
        let w0 = log_text(dir.path(), "w0");
        assert_eq!(w0.len(), MAX_LINE_BYTES - 14, "every byte of rank 0, once");
        assert!(w0.ends_with(b"zz[1,0]<std"));
        let m = log_text(dir.path(), "m");
        assert!(m.len() == MAX_LINE_BYTES - 4 && m.iter().all(|&b| b == b'm'));
    }

    #[test]
    fn tags_name_the_rank_and_stream() {
        assert_eq!(tag_at(b"[1,3]<stdout>:x"), Some((3, false, 14)));
        assert_eq!(tag_at(b"[41230,12]<stderr>:x"), Some((12, true, 19)));
        for untagged in [
            &b"mpirun noticed that ...\n"[..],
            b"[1,x]<stdout>:a\n",
            b"[,1]<stdout>:a\n",
            b"[1,2]<stdin>:a\n",
            b"[1,2]",
        ] {
            assert_eq!(tag_at(untagged), None);
        }
    }

    #[test]
    fn pieces_of_several_ranks_are_joined_into_each_ranks_lines() {
        let dir = tempfile::tempdir().unwrap();
        let router = router(dir.path());
        assert_eq!(
            routed(&router, b"[1,1]<stdout>:hello\n"),
            [("w1".to_string(), "hello\n".to_string())]
        );
        // One rank's line written in pieces.
        assert_eq!(
            routed(
                &router,
                b"[1,0]<stderr>:error: [1,0]<stderr>:bad[1,0]<stderr>:\n"
            ),
            [("w0".to_string(), "error: bad\n".to_string())]
        );
        // Two ranks' pieces in one line of mpirun's: rank 0's line waits for its end.
        assert_eq!(
            routed(&router, b"[1,0]<stderr>:TIMING rank [1,1]<stderr>:done 1\n"),
            [("w1".to_string(), "done 1\n".to_string())]
        );
        assert_eq!(
            routed(&router, b"[1,0]<stderr>:0 ok\n"),
            [("w0".to_string(), "TIMING rank 0 ok\n".to_string())]
        );
        // stdout and stderr pieces of one rank are lines of their own.
        assert_eq!(
            routed(&router, b"[1,1]<stdout>:a[1,1]<stderr>:b\n").len(),
            1
        );
        assert_eq!(
            routed(&router, b"[1,1]<stdout>:c\n"),
            [("w1".to_string(), "ac\n".to_string())]
        );
        // A rank beyond the job's is mpirun's line, kept whole.
        assert_eq!(
            routed(&router, b"[1,7]<stdout>:x\n"),
            [("m".to_string(), "[1,7]<stdout>:x\n".to_string())]
        );
    }

    #[test]
    fn mpiruns_failure_reports_name_the_rank() {
        assert_eq!(
            reported_failure(
                b"mpirun noticed that process rank 2 with PID 0 on node vm exited on signal 9 (Killed).\n"
            ),
            Some(2)
        );
        assert_eq!(
            reported_failure(b"  Process name: [[41230,1],3]\n"),
            Some(3)
        );
        assert_eq!(reported_failure(b"Exit code:    1\n"), None);
        let dir = tempfile::tempdir().unwrap();
        let router = router(dir.path());
        routed(&router, b"  Process name: [[5,1],1]\n");
        routed(&router, b"mpirun noticed that process rank 0 with PID 1\n");
        assert_eq!(router.failed_rank(), Some(1), "the first report wins");
        assert_eq!(
            router.failed_status(),
            None,
            "mpirun does not say how the rank ended"
        );
        router.reset();
        assert_eq!(router.failed_rank(), None);
    }

    #[test]
    fn rank_envs_failure_line_names_the_rank_before_mpiruns_report() {
        let dir = tempfile::tempdir().unwrap();
        let router = router(dir.path());
        // On stdout it is the command's own text, not rank-env's report.
        routed(
            &router,
            format!("[1,0]<stdout>:{RANK_FAILED_LINE} (exit code 1)\n").as_bytes(),
        );
        assert_eq!(router.failed_rank(), None);
        // Without the job's token it is the command's own text too, even on stderr.
        routed(
            &router,
            format!("[1,0]<stderr>:{RANK_FAILED_LINE} (exit code 9)\n").as_bytes(),
        );
        routed(
            &router,
            format!("[1,0]<stderr>:{RANK_FAILED_LINE} (exit code 9) [OTHER]\n").as_bytes(),
        );
        assert_eq!(router.failed_rank(), None);
        // Split over two pieces, as mpirun may forward it; shown without the token.
        routed(&router, b"[1,1]<stderr>:tessera rank-env: ");
        assert_eq!(router.failed_rank(), None);
        let rest = &RANK_FAILED_LINE["tessera rank-env: ".len()..];
        let out = routed(
            &router,
            format!("[1,1]<stderr>:{rest} (exit code 3) [T0KEN]\n").as_bytes(),
        );
        assert_eq!(
            out,
            [(
                "w1".to_string(),
                format!("{RANK_FAILED_LINE} (exit code 3)\n")
            )]
        );
        routed(&router, b"  Process name: [[5,1],0]\n");
        assert_eq!(router.failed_rank(), Some(1), "the first report wins");
        assert_eq!(
            router.failed_status().as_deref(),
            Some("exit code 3"),
            "the rank's own end, not mpirun's"
        );
        assert_eq!(
            failure_status(format!("{RANK_FAILED_LINE} (signal 9)\n").as_bytes()).as_deref(),
            Some("signal 9")
        );
        assert_eq!(failure_status(b"something else (exit code 1)\n"), None);
    }

    #[test]
    fn unended_last_lines_of_every_rank_are_written_at_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let router = router(dir.path());
        // mpirun joins the two ranks' unended pieces into one line of its own.
        assert!(
            routed(&router, b"[1,0]<stdout>:last of 0[1,1]<stdout>:last of 1\n")
                .iter()
                .all(|(log, _)| log == "w1"),
        );
        router.flush();
        let w0 = std::fs::read_to_string(dir.path().join("w0")).unwrap();
        assert!(w0.ends_with("last of 0\n"), "{w0:?}");
        router.flush();
        let again = std::fs::read_to_string(dir.path().join("w0")).unwrap();
        assert_eq!(w0, again, "a flushed piece is written once");
    }
}
