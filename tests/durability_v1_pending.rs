//! WalletConnect 1.0 pending frames across `kill -9` and restarts at other worker counts
//! (DECISIONS §6 and §8), through the real binary on one data directory: a frame pending at
//! a kill is delivered after the restart, once and in order; a frame that a `sub` took never
//! comes back, however many restarts follow and whatever their `--threads`. Both ways a
//! restart can take the logs are run, and each restart's start-up log is checked for the one
//! it took: adopted as they are (every topic's records already in its home worker's log) or
//! rewritten for the new layout.
//!
//! A topic's home worker is found from outside, without writing anything: a v1 `sub` makes
//! the topic known to its home (`walletrelay_topics{core=..}`) until the connection closes.
//! What a `sub` received is checked up to a marker: a frame kept on another topic with the
//! same home, taken by the same connection right after (the home answers the two takes in
//! order), so a frame that should not be there arrives where the marker is expected.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::durability::Node;
use common::metrics::series;
use common::v1::sent_pub;
use common::wait::poll;
use common::RawWs;
use common::TempDir;

/// Workers of the first run; topics are placed by their home at this count (a topic's home
/// at 2 and 1 workers follows from it: the placement is a hash modulo the worker count).
const FIRST: usize = 4;

/// Hex characters of filler in each subject frame.
const FRAME: usize = 8192;

/// A topic and its home worker at [`FIRST`] workers.
struct Placed {
    topic: String,
    home: usize,
}

/// One data directory, its topics and the frames each should have pending.
struct Case {
    dir: TempDir,
    /// The topics whose frames are checked.
    subjects: Vec<Placed>,
    /// Per home worker (at [`FIRST`]): the topic of the markers.
    markers: BTreeMap<usize, String>,
    /// Per subject: its pending frames, oldest first.
    pending: Vec<Vec<String>>,
    /// Runs of the binary so far.
    runs: usize,
}

/// The per-worker values of metric `name` (`workers` of them), once `/metrics` answers.
fn per_core(node: &Node, name: &str, workers: usize) -> Option<Vec<f64>> {
    let text = node.metrics_text()?;
    Some(
        (0..workers)
            .map(|i| series(&text, &format!("{name}{{core=\"{i}\"}}")).unwrap_or(0.0))
            .collect(),
    )
}

/// Polls the per-worker values of `name` until `ok` holds (20 s at most); returns them.
fn wait_cores(node: &Node, name: &str, workers: usize, ok: impl Fn(&[f64]) -> bool) -> Vec<f64> {
    let mut last = None;
    let found = poll(Duration::from_secs(20), || {
        let v = per_core(node, name, workers)?;
        if ok(&v) {
            return Some(v);
        }
        last = Some(v);
        None
    });
    match (found, last) {
        (Some(v), _) => v,
        (None, Some(v)) => panic!("{name} stayed at {v:?}"),
        (None, None) => panic!("/metrics did not answer"),
    }
}

/// Every worker has finished the loop round it was in: what it kept until then was handed to
/// the kernel at the end of that round, so a kill cannot lose it.
fn settle(node: &Node, workers: usize) {
    let name = "walletrelay_loop_iterations_total";
    let now = wait_cores(node, name, workers, |_| true);
    wait_cores(node, name, workers, |v| {
        v.iter().zip(&now).all(|(a, b)| a > b)
    });
}

/// The home worker of `topic` in `node` (at [`FIRST`] workers, nothing subscribed).
fn home_of(node: &Node, topic: &str) -> usize {
    let name = "walletrelay_topics";
    let before = wait_cores(node, name, FIRST, |_| true);
    let known: f64 = before.iter().sum();
    let mut probe = RawWs::open(node);
    probe.v1_sub(topic);
    let after = wait_cores(node, name, FIRST, |v| v.iter().sum::<f64>() > known);
    let home = (0..FIRST)
        .find(|&i| after[i] > before[i])
        .expect("a worker counts the topic");
    drop(probe);
    node.wait_unsubscribed(0.0);
    wait_cores(node, name, FIRST, |v| v.iter().sum::<f64>() == known);
    home
}

impl Case {
    /// Starts the first run (at [`FIRST`] workers) on a fresh directory and finds, for each
    /// worker of `homes`, a subject topic homed there and a marker topic of each home.
    fn start(name: &str, homes: &[usize]) -> (Case, Node) {
        let dir = TempDir::new(name);
        let node = Node::start(&dir, &["--threads", &FIRST.to_string()]);
        let (mut subjects, mut markers) = (Vec::new(), BTreeMap::new());
        let mut wanted: Vec<usize> = homes.to_vec();
        let mut tries = 0;
        while !wanted.is_empty() || homes.iter().any(|h| !markers.contains_key(h)) {
            tries += 1;
            assert!(tries < 500, "no topic found for the homes {homes:?}");
            let topic = common::topic();
            let home = home_of(&node, &topic);
            if let Some(i) = wanted.iter().position(|&h| h == home) {
                wanted.swap_remove(i);
                subjects.push(Placed { topic, home });
            } else if homes.contains(&home) && !markers.contains_key(&home) {
                markers.insert(home, topic);
            }
        }
        let pending = vec![Vec::new(); subjects.len()];
        let case = Case {
            dir,
            subjects,
            markers,
            pending,
            runs: 1,
        };
        (case, node)
    }

    fn total(&self) -> f64 {
        self.pending.iter().map(Vec::len).sum::<usize>() as f64
    }

    /// Kills `node` once what it kept is in its log.
    fn kill(&self, node: Node, workers: usize) {
        settle(&node, workers);
        node.kill9();
    }

    /// Restarts on the directory at `workers` and requires the start-up to have adopted the
    /// logs or (`rewritten`) rewritten them, and the pending frames to be all there.
    fn restart(&mut self, workers: usize, rewritten: bool) -> Node {
        self.runs += 1;
        let node = Node::start(&self.dir, &["--threads", &workers.to_string()]);
        let (_, _, line) = node.recovered();
        assert_eq!(
            line.contains("rewritten to the new layout"),
            rewritten,
            "run {} at --threads {workers}: {line}",
            self.runs
        );
        let want = self.total();
        assert_eq!(
            node.wait_gauge("walletrelay_cached_messages", |n| n == want),
            want,
            "run {} at --threads {workers}: pending frames after the restart",
            self.runs
        );
        node
    }

    /// A `sub` of subject `i` gets exactly its pending frames, then nothing but the marker.
    fn check(&mut self, node: &Node, publ: &mut RawWs, i: usize) {
        let who = format!("run {}, subject {i}", self.runs);
        let subject = &self.subjects[i].topic;
        let marker = &self.markers[&self.subjects[i].home];
        let mark = format!("mark-{}-{i}", self.runs);
        publ.v1_pub(marker, &mark, Some(true));
        // Kept at the home before the sub asks for it.
        let want = self.total() + 1.0;
        assert_eq!(
            node.wait_gauge("walletrelay_cached_messages", |n| n == want),
            want
        );
        let mut sub = RawWs::open(node);
        sub.v1_sub(subject);
        sub.v1_sub(marker);
        for f in &self.pending[i] {
            sub.expect_text(&sent_pub(subject, f, true), &who);
        }
        sub.expect_text(&sent_pub(marker, &mark, true), &who);
        drop(sub);
        self.pending[i].clear();
        // Gone from its home before anything else is published there (a pub would go to
        // the closed subscription instead of waiting).
        node.wait_unsubscribed(0.0);
    }

    /// Publishes `n` frames to subject `i` (it has no subscriber: they are kept pending).
    /// They are much larger than the markers and the logs' other records, so that the
    /// segments holding them stay mostly live and are not compacted before they are taken:
    /// a frame read back at start is then taken from the very record it was read from.
    fn publish(&mut self, publ: &mut RawWs, i: usize, n: usize) {
        for k in 0..n {
            let seed = (self.runs * 100 + i * 10 + k) as u64;
            let frame = format!("r{}-s{i}-{k}-{}", self.runs, common::hex(FRAME, seed));
            publ.v1_pub(&self.subjects[i].topic, &frame, Some(true));
            self.pending[i].push(frame);
        }
    }

    /// One run's work: each subject, in turn over the runs, is checked and left empty
    /// (its frames taken), checked again (nothing may come back) and given two frames, then
    /// given one more (kept over a restart and taken in the next run).
    fn work(&mut self, node: &Node) {
        let mut publ = RawWs::open(node);
        for i in 0..self.subjects.len() {
            match (i + self.runs) % 3 {
                0 => self.check(node, &mut publ, i),
                1 => {
                    self.check(node, &mut publ, i);
                    self.publish(&mut publ, i, 2);
                }
                _ => self.publish(&mut publ, i, 1),
            }
        }
        let want = self.total();
        assert_eq!(
            node.wait_gauge("walletrelay_cached_messages", |n| n == want),
            want
        );
    }

    /// Runs at each worker count of `layouts` in turn (the first run is at [`FIRST`]),
    /// killing each with `kill -9`; `rewritten` says whether a restart from `a` to `b`
    /// workers rewrites the logs. A last run checks every subject.
    fn run(mut self, node: Node, layouts: &[usize], rewritten: impl Fn(usize, usize) -> bool) {
        self.work(&node);
        self.kill(node, FIRST);
        let mut prev = FIRST;
        for &w in layouts {
            let node = self.restart(w, rewritten(prev, w));
            self.work(&node);
            self.kill(node, w);
            prev = w;
        }
        let node = self.restart(FIRST, rewritten(prev, FIRST));
        let mut publ = RawWs::open(&node);
        for i in 0..self.subjects.len() {
            self.check(&node, &mut publ, i);
        }
    }
}

/// Worker counts of the restarts after the first run.
const LAYOUTS: [usize; 7] = [1, 4, 4, 2, 1, 1, 4];

#[test]
fn a_taken_frame_never_comes_back_when_restarts_adopt_the_logs() {
    // Every topic homed on worker 0 at 4 workers is homed on worker 0 at 2 and at 1 too:
    // no record is ever in another worker's log, and no restart rewrites the logs.
    let (case, node) = Case::start("v1-adopt", &[0, 0, 0]);
    case.run(node, &LAYOUTS, |_, _| false);
}

#[test]
fn a_taken_frame_never_comes_back_when_restarts_rewrite_the_logs() {
    // A topic on each worker: every run leaves records in every worker's log, so a restart
    // at another worker count finds some in the wrong log and rewrites them all.
    let (case, node) = Case::start("v1-rewrite", &[0, 1, 2, 3]);
    case.run(node, &LAYOUTS, |a, b| a != b);
}
