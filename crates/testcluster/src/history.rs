//! Checked histories, in the manner of Jepsen and Porcupine: concurrent clients record
//! when each operation was invoked and when (and how) it completed, and the checker
//! searches for a linearization, an order of the operations that respects real time (one
//! that completed before another was invoked comes first) and that a single copy of the
//! namespace would have answered the same way. The search is Wing and Gong's, with the
//! memo of Lowe (a set of already explored (linearized operations, state) pairs).
//!
//! The model is a few files holding one value each: reads, overwrites, puts (create or
//! replace, with contents: batch-file writes), exclusive creates of an empty file (value
//! [`EMPTY`]), renames (which may replace their target) and unlinks. An operation whose
//! outcome the client could not learn (a transport error, `EIO`) may have taken effect at
//! any time after its invocation, or never.

use plusfs_proto::Errno;
use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A key: an index into the names the workload uses.
pub type Key = usize;
/// The value of a file (its 8 bytes).
pub type Value = u64;
/// The value of an empty file (no written value: those are above 2^32 and below this).
pub const EMPTY: Value = u64::MAX - 1;
/// What a read of a file whose size is neither 0 nor 8 bytes shows (no value the model
/// knows, so always a violation). Eight zero bytes show as 0, also never written.
pub const TORN: Value = u64::MAX;

/// One operation on the keys.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Read the file's value.
    Read(Key),
    /// Overwrite an existing file's value.
    Write(Key, Value),
    /// Create the file, empty; refused if it exists.
    Create(Key),
    /// Create or replace the file with a value.
    Put(Key, Value),
    /// Rename the first file to the second (replacing it).
    Rename(Key, Key),
    /// Remove the file.
    Unlink(Key),
}

/// How an operation completed, as its client saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A read's answer (`None`: no such file).
    Read(Option<Value>),
    /// Done.
    Done,
    /// Refused with an errno the model explains (`ENOENT`, `EEXIST`).
    Refused(Errno),
    /// Not known: it may or may not have taken effect.
    Unknown,
}

/// The state of the keys: each file's value, or `None`.
type State = Vec<Option<Value>>;

/// What a single copy of the keys in `state` answers `op`, and the state after it.
fn step(state: &State, op: &Op) -> (Outcome, State) {
    let mut next = state.clone();
    let outcome = match *op {
        Op::Read(k) => Outcome::Read(state[k]),
        Op::Write(k, v) => match state[k] {
            Some(_) => {
                next[k] = Some(v);
                Outcome::Done
            }
            None => Outcome::Refused(Errno::ENOENT),
        },
        Op::Create(k) => match state[k] {
            Some(_) => Outcome::Refused(Errno::EEXIST),
            None => {
                next[k] = Some(EMPTY);
                Outcome::Done
            }
        },
        Op::Put(k, v) => {
            next[k] = Some(v);
            Outcome::Done
        }
        Op::Rename(a, b) => match state[a] {
            None => Outcome::Refused(Errno::ENOENT),
            Some(_) if a == b => Outcome::Done,
            Some(v) => {
                next[a] = None;
                next[b] = Some(v);
                Outcome::Done
            }
        },
        Op::Unlink(k) => match state[k] {
            Some(_) => {
                next[k] = None;
                Outcome::Done
            }
            None => Outcome::Refused(Errno::ENOENT),
        },
    };
    (outcome, next)
}

/// One recorded operation.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The client that ran it.
    pub client: usize,
    pub op: Op,
    /// When it was invoked (the recorder's clock).
    pub call: u64,
    /// When it completed (`None`: never, or its outcome is unknown).
    pub ret: Option<u64>,
    pub outcome: Outcome,
    /// When its client learnt the outcome (wall clock; `None`: not yet, or unknown).
    pub finished: Option<std::time::Instant>,
    /// When it was invoked (wall clock; `None` in hand-made histories).
    pub started: Option<std::time::Instant>,
}

impl Entry {
    /// How long the operation took, if it completed.
    pub fn latency(&self) -> Option<std::time::Duration> {
        Some(self.finished? - self.started?)
    }
}

/// Records the operations of concurrent clients, on one clock.
#[derive(Default)]
pub struct Recorder {
    clock: AtomicU64,
    entries: Mutex<Vec<Entry>>,
}

impl Recorder {
    /// Notes that `client` invokes `op`; answers the entry's id.
    pub fn invoke(&self, client: usize, op: Op) -> usize {
        let call = self.clock.fetch_add(1, Ordering::SeqCst);
        let mut e = self.entries.lock().expect("history");
        let started = Some(std::time::Instant::now());
        e.push(Entry { client, op, call, ret: None, outcome: Outcome::Unknown, finished: None, started });
        e.len() - 1
    }

    /// Notes how entry `id` completed.
    pub fn complete(&self, id: usize, outcome: Outcome) {
        let ret = self.clock.fetch_add(1, Ordering::SeqCst);
        let mut e = self.entries.lock().expect("history");
        if outcome != Outcome::Unknown {
            e[id].ret = Some(ret);
            e[id].finished = Some(std::time::Instant::now());
        }
        e[id].outcome = outcome;
    }

    /// How many operations completed with a known outcome between `from` and `to`.
    pub fn completed_between(&self, from: std::time::Instant, to: std::time::Instant) -> usize {
        let e = self.entries.lock().expect("history");
        e.iter().filter(|e| e.finished.is_some_and(|t| t >= from && t <= to)).count()
    }

    /// The history recorded so far.
    pub fn entries(&self) -> Vec<Entry> {
        self.entries.lock().expect("history").clone()
    }
}

/// What the checker found.
#[derive(Debug)]
pub struct Verdict {
    /// Operations checked, and how many of them had an unknown outcome.
    pub ops: usize,
    pub unknown: usize,
    /// (linearized set, state) pairs the search explored.
    pub explored: usize,
    /// Why no linearization exists (none: the history is linearizable).
    pub violation: Option<String>,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} operations ({} with unknown outcome), {} states explored: ",
            self.ops, self.unknown, self.explored
        )?;
        match &self.violation {
            None => write!(f, "linearizable"),
            Some(v) => write!(f, "NOT linearizable: {v}"),
        }
    }
}

/// A search budget: histories whose search explores more states are reported as such.
const MAX_EXPLORED: usize = 500_000;

/// Checks that `history`, starting from `initial`, is linearizable.
pub fn check(history: &[Entry], initial: State) -> Verdict {
    let mut order: Vec<usize> = (0..history.len()).collect();
    order.sort_by_key(|&i| history[i].call);
    let mut search = Search {
        h: history,
        order,
        done: vec![0; history.len().div_ceil(64)],
        memo: HashSet::new(),
        best: (0, Vec::new()),
        path: Vec::new(),
    };
    let definite = history.iter().filter(|e| e.ret.is_some()).count();
    // The search recurses once per operation placed: a deep stack of its own.
    let found = std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(1 << 30)
            .spawn_scoped(s, || search.dfs(&initial, definite))
            .expect("a thread for the search")
            .join()
            .expect("the search")
    });
    let unknown = history.len() - definite;
    let explored = search.memo.len();
    let violation = match found {
        Some(true) => None,
        Some(false) => Some(search.explain()),
        None => Some(format!("search gave up after {MAX_EXPLORED} states")),
    };
    Verdict { ops: history.len(), unknown, explored, violation }
}

struct Search<'a> {
    h: &'a [Entry],
    /// Entry ids by invocation time.
    order: Vec<usize>,
    /// Placed operations, one bit each.
    done: Vec<u64>,
    memo: HashSet<(Vec<u64>, State)>,
    /// The longest linearized prefix met, for the report.
    best: (usize, Vec<usize>),
    path: Vec<usize>,
}

impl Search<'_> {
    fn is_done(&self, i: usize) -> bool {
        self.done[i / 64] & (1 << (i % 64)) != 0
    }

    fn flip(&mut self, i: usize) {
        self.done[i / 64] ^= 1 << (i % 64);
    }

    /// Linearizes what is left (`left`: definite operations not yet placed) from `state`.
    /// `None`: the budget ran out.
    fn dfs(&mut self, state: &State, left: usize) -> Option<bool> {
        if left == 0 {
            return Some(true);
        }
        if !self.memo.insert((self.done.clone(), state.clone())) {
            return Some(false);
        }
        if self.memo.len() > MAX_EXPLORED {
            return None;
        }
        let definite_done = self.path.iter().filter(|&&i| self.h[i].ret.is_some()).count();
        if definite_done >= self.best.0 {
            self.best = (definite_done, self.path.clone());
        }
        // An operation may come next if none still open completed before it was invoked.
        let horizon = (0..self.h.len()).filter(|&i| !self.is_done(i)).filter_map(|i| self.h[i].ret).min();
        for k in 0..self.order.len() {
            let i = self.order[k];
            let e = &self.h[i];
            if horizon.is_some_and(|r| e.call > r) {
                break;
            }
            if self.is_done(i) {
                continue;
            }
            let (expected, next) = step(state, &e.op);
            if e.outcome != Outcome::Unknown && expected != e.outcome {
                continue;
            }
            self.flip(i);
            self.path.push(i);
            let r = self.dfs(&next, left - e.ret.is_some() as usize);
            self.path.pop();
            self.flip(i);
            match r {
                Some(false) => {}
                other => return other,
            }
        }
        Some(false)
    }

    /// The longest linearizable prefix, and the operations none of which could follow it.
    fn explain(&self) -> String {
        let (_, path) = &self.best;
        let placed: HashSet<usize> = path.iter().copied().collect();
        let tail: Vec<String> = path.iter().rev().take(6).rev().map(|&i| self.describe(i)).collect();
        let horizon = (0..self.h.len()).filter(|i| !placed.contains(i)).filter_map(|i| self.h[i].ret).min();
        let mut open: Vec<usize> = self
            .order
            .iter()
            .copied()
            .filter(|i| !placed.contains(i) && horizon.is_none_or(|r| self.h[*i].call <= r))
            .collect();
        // Operations with a known outcome first: those are what could not be explained.
        open.sort_by_key(|&i| (self.h[i].ret.is_none(), self.h[i].call));
        let stuck: Vec<String> = open.iter().take(8).map(|&i| self.describe(i)).collect();
        format!(
            "after {} operations in order (last: {}), none of these can come next: {}",
            path.len(),
            tail.join("; "),
            stuck.join("; ")
        )
    }

    fn describe(&self, i: usize) -> String {
        let e = &self.h[i];
        let ret = e.ret.map_or("?".to_string(), |r| r.to_string());
        format!("client {} {:?} -> {:?} [{}..{}]", e.client, e.op, e.outcome, e.call, ret)
    }
}

/// How a workload client picks its operations.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The files' paths (key `k` is `paths[k]`); their directories must exist.
    pub paths: Vec<String>,
    /// Operations per client at most.
    pub max_ops: usize,
    /// Renames between any two keys; otherwise only between keys `2i` and `2i + 1` (the
    /// caller puts each pair in one directory).
    pub cross_dir_renames: bool,
    /// Exclusive creates of empty files among the operations.
    pub exclusive_creates: bool,
}

/// One client's part of a checked workload: random operations on `w.paths` until `stop`
/// (or `w.max_ops`), each recorded in `rec`. Values are unique per write.
pub async fn run_client(
    c: plusfs_client::Client,
    rec: std::sync::Arc<Recorder>,
    client: usize,
    w: std::sync::Arc<Workload>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed + client as u64);
    let n = w.paths.len();
    for seq in 0..w.max_ops {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let value = ((client as u64 + 1) << 32) | seq as u64;
        let a = rng.gen_range(0..n);
        let b = if w.cross_dir_renames { rng.gen_range(0..n) } else { (a ^ 1).min(n - 1) };
        let op = match rng.gen_range(0..100) {
            0..35 => Op::Read(a),
            35..52 => Op::Write(a, value),
            52..62 => Op::Put(a, value),
            62..74 if w.exclusive_creates => Op::Create(a),
            62..74 => Op::Read(a),
            74..88 => Op::Rename(a, b),
            _ => Op::Unlink(a),
        };
        let id = rec.invoke(client, op.clone());
        let outcome = apply(&c, &w.paths, &op).await;
        rec.complete(id, outcome);
    }
}

/// Runs `op` on `paths` with `c` as client `client`, recorded in `rec`; answers its outcome.
pub async fn run_op(c: &plusfs_client::Client, rec: &Recorder, client: usize, paths: &[String], op: Op) -> Outcome {
    let id = rec.invoke(client, op.clone());
    let outcome = apply(c, paths, &op).await;
    rec.complete(id, outcome.clone());
    outcome
}

/// Runs `op` with client `c`; its outcome as the model states it. With `HISTORY_TRACE`
/// set, a failed rename prints its error and the time (to line up with server logs).
async fn apply(c: &plusfs_client::Client, paths: &[String], op: &Op) -> Outcome {
    let done = |r: Result<(), plusfs_client::FsError>| match r {
        Ok(()) => Outcome::Done,
        Err(e) if matches!(e.errno, Errno::ENOENT | Errno::EEXIST) => Outcome::Refused(e.errno),
        Err(_) => Outcome::Unknown,
    };
    match *op {
        Op::Read(k) => match c.read_all(&paths[k]).await {
            // A file of another size is no value the model knows: it shows as a violation.
            Ok(b) if b.is_empty() => Outcome::Read(Some(EMPTY)),
            Ok(b) => Outcome::Read(Some(b.try_into().map(u64::from_le_bytes).unwrap_or(TORN))),
            Err(e) if e.errno == Errno::ENOENT => Outcome::Read(None),
            Err(_) => Outcome::Unknown,
        },
        Op::Write(k, v) => done(c.write(&paths[k], 0, &v.to_le_bytes()).await.map(|_| ())),
        Op::Create(k) => done(c.create(&paths[k], 0o644, true).await.map(|_| ())),
        Op::Put(k, v) => {
            let file = plusfs_client::NewFile::new(paths[k].clone(), v.to_le_bytes().to_vec());
            let r = c.batch_write(vec![file]).await.into_iter().next().expect("one answer");
            done(r.map(|_| ()))
        }
        Op::Rename(a, b) => {
            let r = c.rename(&paths[a], &paths[b]).await;
            if let (Err(e), true) = (&r, std::env::var_os("HISTORY_TRACE").is_some()) {
                eprintln!(
                    "HISTORY_TRACE rename {} {}: {e:?} at {:?}",
                    paths[a],
                    paths[b],
                    std::time::SystemTime::now()
                );
            }
            done(r)
        }
        Op::Unlink(k) => done(c.unlink(&paths[k]).await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry invoked at `call` and completed at `ret`.
    fn e(client: usize, op: Op, call: u64, ret: Option<u64>, outcome: Outcome) -> Entry {
        Entry { client, op, call, ret, outcome, finished: None, started: None }
    }

    #[test]
    fn overlapping_operations_may_take_effect_in_either_order() {
        let h = vec![
            e(0, Op::Write(0, 5), 0, Some(3), Outcome::Done),
            e(1, Op::Read(0), 1, Some(2), Outcome::Read(Some(5))),
            e(2, Op::Read(0), 1, Some(4), Outcome::Read(Some(1))),
        ];
        let v = check(&h, vec![Some(1)]);
        assert!(v.violation.is_none(), "{v}");
    }

    #[test]
    fn a_stale_read_after_an_acknowledged_write_is_caught() {
        let h = vec![
            e(0, Op::Write(0, 5), 0, Some(1), Outcome::Done),
            e(1, Op::Read(0), 2, Some(3), Outcome::Read(Some(1))),
        ];
        let v = check(&h, vec![Some(1)]);
        assert!(v.violation.is_some(), "{v}");
        assert!(v.to_string().contains("Read(0)"), "{v}");
    }

    #[test]
    fn a_lost_create_and_a_value_never_written_are_caught() {
        let lost =
            vec![e(0, Op::Put(1, 7), 0, Some(1), Outcome::Done), e(1, Op::Read(1), 2, Some(3), Outcome::Read(None))];
        assert!(check(&lost, vec![None, None]).violation.is_some());
        let invented = vec![e(0, Op::Read(0), 0, Some(1), Outcome::Read(Some(99)))];
        assert!(check(&invented, vec![Some(1)]).violation.is_some());
    }

    #[test]
    fn a_rename_applied_twice_is_caught_and_an_unknown_one_may_have_happened() {
        // a -> b acknowledged once, yet both a second rename of a and a read of b's old
        // value succeed after it.
        let twice =
            vec![e(0, Op::Rename(0, 1), 0, Some(1), Outcome::Done), e(1, Op::Rename(0, 1), 2, Some(3), Outcome::Done)];
        assert!(check(&twice, vec![Some(3), Some(4)]).violation.is_some());
        // Unknown outcome: the later read may see it done, or not.
        for seen in [Outcome::Read(Some(3)), Outcome::Read(Some(4))] {
            let maybe = vec![e(0, Op::Rename(0, 1), 0, None, Outcome::Unknown), e(1, Op::Read(1), 5, Some(6), seen)];
            let v = check(&maybe, vec![Some(3), Some(4)]);
            assert!(v.violation.is_none(), "{v}");
        }
    }

    #[test]
    fn refusals_must_be_explained_by_the_state() {
        let h = vec![
            e(0, Op::Unlink(0), 0, Some(1), Outcome::Done),
            e(1, Op::Create(0), 2, Some(3), Outcome::Refused(Errno::EEXIST)),
        ];
        assert!(check(&h, vec![Some(1)]).violation.is_some());
        // Two exclusive creates that both succeed with nothing between them.
        let twice =
            vec![e(0, Op::Create(0), 0, Some(3), Outcome::Done), e(1, Op::Create(0), 1, Some(4), Outcome::Done)];
        assert!(check(&twice, vec![None]).violation.is_some());
        let ok = vec![
            e(0, Op::Unlink(0), 0, Some(1), Outcome::Done),
            e(1, Op::Write(0, 2), 2, Some(3), Outcome::Refused(Errno::ENOENT)),
        ];
        assert!(check(&ok, vec![Some(1)]).violation.is_none());
    }

    #[test]
    fn a_recorder_orders_events_on_one_clock() {
        let r = Recorder::default();
        let a = r.invoke(0, Op::Read(0));
        let b = r.invoke(1, Op::Write(0, 1));
        r.complete(b, Outcome::Done);
        r.complete(a, Outcome::Unknown);
        let h = r.entries();
        assert_eq!((h[0].call, h[1].call, h[1].ret, h[0].ret), (0, 1, Some(2), None));
        assert!(check(&h, vec![Some(0)]).violation.is_none());
    }
}
