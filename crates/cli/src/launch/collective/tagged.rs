//! The output of one `mpirun --tag-output` job, split back into the ranks' log files.
//!
//! OpenMPI prefixes every line a rank writes with `[JOB,RANK]<stdout>:` or `<stderr>:`. A
//! tagged line goes, without its tag, to `worker_<RANK>.log` and to the console prefixed
//! `[worker RANK] `, as `tessera launch` shows every process's lines; `mpirun`'s own lines
//! (untagged: its error reports) go to `mpirun.log` and to the console prefixed `[mpirun] `.
//! From those the router also remembers which rank `mpirun` reported as failed.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use crate::launch::output::{LogFile, Router};

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
    /// The first rank `mpirun` reported as failed in this job's run.
    failed_rank: Mutex<Option<usize>>,
}

impl TaggedRouter {
    /// A router for `ranks` (indexed by rank) and `mpirun`'s own lines.
    pub fn new(ranks: Vec<RankOutput>, own: RankOutput) -> TaggedRouter {
        TaggedRouter {
            ranks,
            own,
            failed_rank: Mutex::new(None),
        }
    }

    /// The rank `mpirun` named as the first to fail, if its report said so.
    pub fn failed_rank(&self) -> Option<usize> {
        *self.failed_rank.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets the failed rank (before the job is started again).
    pub fn reset(&self) {
        *self.failed_rank.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Every rank's log file, in rank order.
    pub fn rank_logs(&self) -> impl Iterator<Item = &Arc<LogFile>> {
        self.ranks.iter().map(|r| &r.log)
    }
}

impl Router for TaggedRouter {
    fn route<'l>(&self, line: &'l [u8]) -> (&LogFile, &str, Cow<'l, [u8]>) {
        if let Some((rank, body)) = split_tag(line) {
            if let Some(out) = self.ranks.get(rank) {
                let tag = &line[..line.len() - body.len()];
                return (&out.log, &out.prefix, strip_inner_tags(body, tag));
            }
        }
        if let Some(rank) = reported_failure(line) {
            let mut failed = self.failed_rank.lock().unwrap_or_else(|p| p.into_inner());
            failed.get_or_insert(rank);
        }
        (&self.own.log, &self.own.prefix, Cow::Borrowed(line))
    }
}

/// `body` without the further copies of `tag` OpenMPI puts where a rank's line was written in
/// several pieces (`error: [1,3]<stderr>:message`).
fn strip_inner_tags<'l>(body: &'l [u8], tag: &[u8]) -> Cow<'l, [u8]> {
    let found = |from: usize| {
        body[from..]
            .windows(tag.len())
            .position(|w| w == tag)
            .map(|p| p + from)
    };
    let Some(mut at) = found(0) else {
        return Cow::Borrowed(body);
    };
    let mut out = Vec::with_capacity(body.len());
    let mut from = 0;
    loop {
        out.extend_from_slice(&body[from..at]);
        from = at + tag.len();
        match found(from) {
            Some(next) => at = next,
            None => break,
        }
    }
    out.extend_from_slice(&body[from..]);
    Cow::Owned(out)
}

/// `[JOB,RANK]<stdout>:BODY` (or `<stderr>:`) → (RANK, BODY).
pub fn split_tag(line: &[u8]) -> Option<(usize, &[u8])> {
    let rest = line.strip_prefix(b"[")?;
    let close = rest.iter().position(|&b| b == b']')?;
    let (ids, after) = (&rest[..close], &rest[close + 1..]);
    let comma = ids.iter().position(|&b| b == b',')?;
    if !ids[..comma].iter().all(u8::is_ascii_digit) || comma == 0 {
        return None;
    }
    let rank = parse_number(&ids[comma + 1..])?;
    let body = after
        .strip_prefix(b"<stdout>:")
        .or_else(|| after.strip_prefix(b"<stderr>:"))?;
    Some((rank, body))
}

/// The rank named by one of `mpirun`'s failure reports: `… process rank 3 with PID …` or
/// `Process name: [[41230,1],3]`.
pub fn reported_failure(line: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(line).ok()?;
    if let Some(at) = text.find("process rank ") {
        let digits: String = text[at + 13..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        return digits.parse().ok();
    }
    let at = text.find("Process name: [[")?;
    let inner = &text[at + 16..];
    let close = inner.find(']')?;
    let after = inner[close + 1..].strip_prefix(',')?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn parse_number(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_name_the_rank_and_are_removed() {
        assert_eq!(
            split_tag(b"[1,3]<stdout>:loss 2.5\n"),
            Some((3, &b"loss 2.5\n"[..]))
        );
        assert_eq!(
            split_tag(b"[41230,12]<stderr>:error: x\n"),
            Some((12, &b"error: x\n"[..]))
        );
        for untagged in [
            &b"mpirun noticed that ...\n"[..],
            b"[1,x]<stdout>:a\n",
            b"[,1]<stdout>:a\n",
            b"[1,2]<stdin>:a\n",
            b"[1,2]",
        ] {
            assert_eq!(split_tag(untagged), None);
        }
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
    }

    #[test]
    fn lines_go_to_their_ranks_log_and_the_rest_to_mpiruns() {
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str, prefix: &str| RankOutput {
            log: Arc::new(LogFile::open(dir.path().join(name)).unwrap()),
            prefix: prefix.to_string(),
        };
        let router = TaggedRouter::new(
            vec![open("w0", "[worker 0] "), open("w1", "[worker 1] ")],
            open("m", "[mpirun] "),
        );
        let (log, prefix, body) = router.route(b"[1,1]<stdout>:hello\n");
        assert_eq!(
            (log.path(), prefix, &*body),
            (&*dir.path().join("w1"), "[worker 1] ", &b"hello\n"[..])
        );
        // A line written in pieces carries the tag again inside; it is removed.
        let (_, _, body) = router.route(b"[1,0]<stderr>:error: [1,0]<stderr>:bad[1,0]<stderr>:\n");
        assert_eq!(&*body, b"error: bad\n");
        // A rank beyond the job's is mpirun's line, kept whole.
        let (log, _, body) = router.route(b"[1,7]<stdout>:x\n");
        assert_eq!(
            (log.path(), &*body),
            (&*dir.path().join("m"), &b"[1,7]<stdout>:x\n"[..])
        );
        assert_eq!(router.failed_rank(), None);
        router.route(b"  Process name: [[5,1],1]\n");
        router.route(b"mpirun noticed that process rank 0 with PID 1\n");
        assert_eq!(router.failed_rank(), Some(1), "the first report wins");
        router.reset();
        assert_eq!(router.failed_rank(), None);
    }
}
