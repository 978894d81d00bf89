//! Damage to the data directory and a second process on it (DECISIONS §6), through the
//! real binary: a second server on the same directory is refused with a clear message and
//! a non-zero exit; a torn tail (bytes cut off, or garbage appended, while the server was
//! stopped) is cut at start and logged, and every whole record is served; a record whose
//! bytes were damaged in the middle of a segment is skipped, logged and counted, and the
//! others are served.

mod common;

use std::io::Write;

use common::durability::{history, run_to_exit, Node};
use common::TempDir;

/// A server on `dir` at `--threads 1` with `n` messages published on one topic, stopped
/// with SIGTERM. Returns the topic and its messages in order.
fn stopped_with_messages(dir: &TempDir, n: usize) -> (String, Vec<String>) {
    let topic = common::topic();
    let node = Node::start(dir, &["--threads", "1"]);
    let mut ws = node.ws();
    let messages: Vec<String> = (0..n)
        .map(|i| format!("message {i:03} {}", common::hex(200, i as u64 + 7)))
        .collect();
    for m in &messages {
        ws.publish(&topic, m);
    }
    assert!(node.sigterm().success());
    (topic, messages)
}

/// The one segment file of a `--threads 1` server that wrote once.
fn only_segment(dir: &TempDir) -> std::path::PathBuf {
    let segs = dir.files_with_ext("log");
    assert_eq!(segs.len(), 1, "{segs:?}");
    segs[0].clone()
}

#[test]
fn a_second_process_on_the_same_directory_is_refused_with_a_clear_message() {
    let dir = TempDir::new("second");
    let first = Node::start(&dir, &["--threads", "1"]);
    let (status, stderr) = run_to_exit(&dir, &["--threads", "1"]);
    assert!(!status.success(), "the second process ran: {status}");
    let want = format!(
        "data directory {} is in use by another walletrelay process (pid {})",
        dir.arg(),
        first.child.id()
    );
    assert!(stderr.contains(&want), "stderr: {stderr}");
    first.assert_serving("a second process was refused");
    first.kill9();
    // The lock died with the process: the directory is free again.
    let again = Node::start(&dir, &["--threads", "1"]);
    again.assert_serving("restart after kill -9");
}

#[test]
fn a_torn_tail_is_cut_and_logged_and_every_whole_record_is_served() {
    let dir = TempDir::new("torn");
    let (topic, messages) = stopped_with_messages(&dir, 20);
    let seg = only_segment(&dir);
    let whole = std::fs::metadata(&seg).unwrap().len();

    // Garbage appended (a crash while extending the file, a disk that wrote junk).
    let mut f = std::fs::OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all(&[0xAB; 100]).unwrap();
    drop(f);
    let node = Node::start(&dir, &["--threads", "1"]);
    let cut = node.wait_log("torn tail of 100 bytes");
    assert!(cut.contains(&format!("at offset {whole} cut off")), "{cut}");
    let (n, _, line) = node.recovered();
    assert_eq!(n, 20, "{line}");
    assert!(line.contains("1 torn tails cut"), "{line}");
    assert_eq!(node.metric("walletrelay_store_truncated_bytes"), 100.0);
    assert_eq!(history(&node, &topic, "marker-1"), messages);
    assert!(node.sigterm().success());

    // The last record cut short (a crash mid-write): it is dropped, the rest served. The
    // marker of the first check is the newest record of this run's own segment.
    let newest = dir.files_with_ext("log").pop().unwrap();
    let len = std::fs::metadata(&newest).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&newest)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    let node = Node::start(&dir, &["--threads", "1"]);
    node.wait_log("torn tail of");
    let (n, _, line) = node.recovered();
    assert_eq!(n, 20, "the marker is gone, the 20 remain: {line}");
    assert_eq!(history(&node, &topic, "marker-2"), messages);
    node.assert_serving("a torn tail");
}

#[test]
fn a_damaged_record_is_skipped_logged_and_counted_and_the_others_are_served() {
    let dir = TempDir::new("damaged");
    let (topic, messages) = stopped_with_messages(&dir, 20);
    let seg = only_segment(&dir);
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes
        .windows(11)
        .position(|w| w == b"message 010")
        .expect("message 10 in the segment");
    bytes[at + 20] ^= 0x55;
    std::fs::write(&seg, &bytes).unwrap();

    let node = Node::start(&dir, &["--threads", "1"]);
    let warn = node.wait_log("damaged bytes at offset");
    assert!(warn.contains(&seg.display().to_string()), "{warn}");
    let (n, _, line) = node.recovered();
    assert_eq!(n, 19, "{line}");
    assert!(line.contains("1 damaged regions skipped"), "{line}");
    assert_eq!(node.metric("walletrelay_store_skipped_records"), 1.0);
    let mut want = messages.clone();
    want.remove(10);
    assert_eq!(history(&node, &topic, "marker"), want);
    node.assert_serving("a damaged record");
}

#[test]
fn entries_with_a_segments_name_that_are_no_regular_file_are_ignored_and_never_reused() {
    let dir = TempDir::new("strangers");
    let (topic, messages) = stopped_with_messages(&dir, 5);
    // A FIFO (an `open` for reading would wait for a writer forever), a directory and a
    // dangling link, each named like a segment past the one written.
    let fifo = dir.path().join("w0-00000000000000f0.log");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    std::fs::create_dir(dir.path().join("w0-00000000000000f1.log")).unwrap();
    std::os::unix::fs::symlink("/nonexistent", dir.path().join("w0-00000000000000f2.log")).unwrap();

    let node = Node::start(&dir, &["--threads", "1"]);
    node.wait_log("has a segment's name but is no regular file; ignored");
    let (n, _, line) = node.recovered();
    assert_eq!(n, 5, "{line}");
    assert_eq!(node.metric("walletrelay_store_foreign_files"), 3.0);
    assert_eq!(history(&node, &topic, "marker-1"), messages);
    // New segments are numbered past every such name: the publishes above were stored.
    assert!(node.sigterm().success());
    let node = Node::start(&dir, &["--threads", "1"]);
    let (n, _, line) = node.recovered();
    assert_eq!(n, 6, "the five and the first marker: {line}");
    let mut want = messages.clone();
    want.push("marker-1".to_string());
    assert_eq!(history(&node, &topic, "marker-2"), want);
    node.assert_serving("strangers in the data directory");
    for p in ["w0-00000000000000f0.log", "w0-00000000000000f1.log"] {
        assert!(dir.path().join(p).exists(), "{p} was removed");
    }
}

#[test]
fn a_whole_record_that_does_not_decode_is_counted_and_not_replayed() {
    use walletrelay::store::entry::{Entry, Ns};
    use walletrelay::store::record;
    let dir = TempDir::new("undecodable");
    let (topic, messages) = stopped_with_messages(&dir, 5);
    // A record whose checksum holds but whose message is not UTF-8: never written by this
    // server (a forgery, or a bug), and replayed it would be a text frame that is no text.
    let forged = Entry::Message {
        ns: Ns::V2,
        topic: &topic,
        epoch: 1,
        seq: 1_000,
        expires_unix_ms: u64::MAX / 2,
        prompt: false,
        body: true,
        data: b"{\"topic\":\"x\",\"message\":\"\xff\"}",
    };
    let mut payload = Vec::new();
    forged.encode(&mut payload).unwrap();
    let mut rec = Vec::new();
    record::encode(&payload, &mut rec).unwrap();
    let seg = only_segment(&dir);
    let mut f = std::fs::OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all(&rec).unwrap();
    drop(f);

    let node = Node::start(&dir, &["--threads", "1"]);
    let (n, _, line) = node.recovered();
    assert_eq!(n, 5, "{line}");
    assert!(line.contains("1 undecodable"), "{line}");
    assert_eq!(node.metric("walletrelay_store_undecodable_records"), 1.0);
    assert_eq!(node.metric("walletrelay_store_skipped_records"), 0.0);
    assert_eq!(history(&node, &topic, "marker"), messages);
    node.assert_serving("an undecodable record");
}
