//! Unit and property tests of [`super::Decoder`] and [`super::Reassembly`].

use super::*;
use crate::ws::tests::client_frame;
use proptest::prelude::*;

const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CONT: u8 = 0x0;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xA;
const M: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

/// An event with its payload copied out, to compare runs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    Msg(bool, Vec<u8>),
    Z(bool, Vec<u8>),
    Frag,
    Ping(Vec<u8>),
    Pong,
    Close(u16),
    Fail(u16),
}

fn own(ev: Event<'_>) -> Ev {
    match ev {
        Event::Message { binary, payload } => Ev::Msg(binary, payload.to_vec()),
        Event::Compressed { binary, payload } => Ev::Z(binary, payload.to_vec()),
        Event::Fragment => Ev::Frag,
        Event::Ping(p) => Ev::Ping(p.to_vec()),
        Event::Pong => Ev::Pong,
        Event::Close { code } => Ev::Close(code),
    }
}

/// Feeds `stream` as reads of `sizes` bytes (cycled) into a pending buffer, as the worker
/// does, until a close or an error. Returns the events and the most bytes ever left pending.
fn feed(max: usize, stream: &[u8], sizes: &[usize]) -> (Vec<Ev>, usize) {
    let mut dec = Decoder::new(max);
    let (mut events, mut pending, mut most) = (Vec::new(), Vec::new(), 0);
    let mut rest = stream;
    for &size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (read, r) = rest.split_at(size.clamp(1, rest.len()));
        rest = r;
        pending.extend_from_slice(read);
        let mut pos = 0;
        loop {
            match dec.decode(&mut pending[pos..]) {
                Ok(None) => break,
                Ok(Some((n, ev))) => {
                    pos += n;
                    let ev = own(ev);
                    let closed = matches!(ev, Ev::Close(_));
                    events.push(ev);
                    if closed {
                        return (events, most);
                    }
                }
                Err(e) => {
                    events.push(Ev::Fail(e.close_code()));
                    assert!(dec.is_idle(), "an error resets the decoder");
                    return (events, most);
                }
            }
        }
        pending.drain(..pos);
        most = most.max(pending.len());
    }
    (events, most)
}

fn whole(max: usize, stream: &[u8]) -> Vec<Ev> {
    feed(max, stream, &[stream.len()]).0
}

fn frames(parts: &[(bool, u8, &[u8])]) -> Vec<u8> {
    parts
        .iter()
        .flat_map(|&(fin, op, p)| client_frame(fin, op, p, M))
        .collect()
}

#[test]
fn an_unfragmented_message_is_lent_in_place_from_the_callers_buffer() {
    let mut dec = Decoder::new(100);
    let mut buf = frames(&[(true, TEXT, b"hello")]);
    let range = buf.as_ptr_range();
    let (n, ev) = dec.decode(&mut buf).unwrap().unwrap();
    assert_eq!(n, 11);
    let Event::Message { binary, payload } = ev else {
        panic!("{ev:?}")
    };
    assert!(!binary);
    assert_eq!(payload, b"hello");
    assert!(range.contains(&payload.as_ptr()), "the payload was copied");
    assert!(dec.is_idle());
}

#[test]
fn every_prefix_of_a_frame_is_need_more_and_leaves_the_bytes_untouched() {
    for len in [0usize, 3, 125, 126, 300, 65535, 65536] {
        let payload: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
        let f = client_frame(true, BINARY, &payload, M);
        let mut dec = Decoder::new(1 << 20);
        for cut in [0, 1, 2, 5, 9, 13, f.len() - 1] {
            let mut part = f[..cut.min(f.len() - 1)].to_vec();
            assert_eq!(dec.decode(&mut part), Ok(None), "len={len} cut={cut}");
            assert_eq!(part, &f[..part.len()]);
        }
        let mut all = f.clone();
        let (n, ev) = dec.decode(&mut all).unwrap().unwrap();
        assert_eq!((n, own(ev)), (f.len(), Ev::Msg(true, payload)));
    }
}

#[test]
fn frame_header_violations_close_with_1002() {
    let unmasked = vec![0x81u8, 0x01, b'a'];
    let cases: [(&str, Vec<u8>); 5] = [
        ("unmasked", unmasked),
        ("reserved bit", client_frame(true, 0x40 | TEXT, b"a", M)),
        ("unknown opcode", client_frame(true, 0x3, b"a", M)),
        ("fragmented ping", client_frame(false, PING, b"a", M)),
        ("ping of 126 bytes", client_frame(true, PING, &[0; 126], M)),
    ];
    for (what, f) in cases {
        assert_eq!(whole(1000, &f), vec![Ev::Fail(1002)], "{what}");
    }
}

#[test]
fn out_of_sequence_frames_close_with_1002_from_their_header_alone() {
    let cont = client_frame(true, CONT, b"abc", M);
    let mut dec = Decoder::new(100);
    let e = dec.decode(&mut cont[..6].to_vec()).unwrap_err();
    assert_eq!(e, WsError::Protocol("continuation without a message"));
    assert_eq!(e.close_code(), 1002);

    let s = frames(&[(false, TEXT, b"ab"), (true, TEXT, b"cd")]);
    assert_eq!(whole(100, &s), vec![Ev::Frag, Ev::Fail(1002)]);
    let s = frames(&[(false, BINARY, b"ab"), (false, BINARY, b"cd")]);
    assert_eq!(whole(100, &s), vec![Ev::Frag, Ev::Fail(1002)]);
}

#[test]
fn close_frames_are_validated_and_give_the_code_to_echo() {
    let close = |p: &[u8]| whole(100, &client_frame(true, CLOSE, p, M));
    assert_eq!(close(b""), vec![Ev::Close(1000)]);
    assert_eq!(close(b"\x0f\xa0bye"), vec![Ev::Close(4000)]);
    assert_eq!(close(b"\x03\xe9"), vec![Ev::Close(1001)]);
    assert_eq!(close(b"\x03"), vec![Ev::Fail(1002)]);
    assert_eq!(close(&1005u16.to_be_bytes()), vec![Ev::Fail(1002)]);
    assert_eq!(close(&999u16.to_be_bytes()), vec![Ev::Fail(1002)]);
    assert_eq!(close(b"\x03\xe8\xff"), vec![Ev::Fail(1007)]);
}

#[test]
fn invalid_utf8_text_closes_with_1007_binary_is_not_checked() {
    assert_eq!(
        whole(100, &frames(&[(true, TEXT, b"a\xffb")])),
        [Ev::Fail(1007)]
    );
    assert_eq!(
        whole(100, &frames(&[(true, BINARY, b"a\xffb")])),
        [Ev::Msg(true, b"a\xffb".to_vec())]
    );
    let s = frames(&[(false, BINARY, b"\xff"), (true, CONT, b"\xfe")]);
    assert_eq!(whole(100, &s), [Ev::Frag, Ev::Msg(true, vec![0xff, 0xfe])]);
}

#[test]
fn fragmented_text_fails_in_the_fragment_that_makes_it_invalid() {
    let euro = "€".as_bytes();
    let ok = frames(&[
        (false, TEXT, &euro[..1]),
        (false, CONT, &euro[1..2]),
        (true, CONT, &euro[2..]),
    ]);
    let want = [Ev::Frag, Ev::Frag, Ev::Msg(false, euro.to_vec())];
    assert_eq!(whole(100, &ok), want);
    // An impossible byte fails at its fragment, before the final one arrives.
    let s = frames(&[(false, TEXT, b"ok"), (false, CONT, b"\xff")]);
    assert_eq!(whole(100, &s), [Ev::Frag, Ev::Fail(1007)]);
    // So does a sequence nothing can complete, in the first fragment.
    let s = frames(&[(false, TEXT, b"\xe2\x28")]);
    assert_eq!(whole(100, &s), [Ev::Fail(1007)]);
    // A message that ends inside a sequence fails at its final fragment.
    let s = frames(&[(false, TEXT, b"a"), (true, CONT, &euro[..2])]);
    assert_eq!(whole(100, &s), [Ev::Frag, Ev::Fail(1007)]);
}

#[test]
fn the_message_limit_holds_across_fragments() {
    let exactly = frames(&[(true, TEXT, &[b'a'; 10])]);
    assert_eq!(whole(10, &exactly), [Ev::Msg(false, vec![b'a'; 10])]);
    assert_eq!(whole(9, &exactly), [Ev::Fail(1009)]);
    let split = frames(&[(false, BINARY, &[1; 6]), (true, CONT, &[2; 4])]);
    let mut want = vec![1; 6];
    want.extend([2; 4]);
    assert_eq!(whole(10, &split), [Ev::Frag, Ev::Msg(true, want)]);
    // One byte too many is refused from the continuation's header, before its payload.
    let over = frames(&[(false, BINARY, &[1; 6]), (true, CONT, &[2; 5])]);
    let mut dec = Decoder::new(10);
    let mut buf = over[..over.len() - 5].to_vec();
    assert_eq!(dec.decode(&mut buf).unwrap().map(|(n, _)| n), Some(12));
    assert_eq!(dec.decode(&mut buf[12..]), Err(WsError::TooBig));
    assert_eq!(WsError::TooBig.close_code(), 1009);
}

#[test]
fn control_frames_between_fragments_leave_the_message_intact() {
    let s = frames(&[
        (false, TEXT, b"{\"a\""),
        (true, PING, b"p1"),
        (false, CONT, b":"),
        (true, PONG, b""),
        (true, PING, b""),
        (true, CONT, b"1}"),
    ]);
    let want = [
        Ev::Frag,
        Ev::Ping(b"p1".to_vec()),
        Ev::Frag,
        Ev::Pong,
        Ev::Ping(vec![]),
        Ev::Msg(false, b"{\"a\":1}".to_vec()),
    ];
    assert_eq!(whole(100, &s), want);
    // A close between fragments is a close.
    let s = frames(&[(false, TEXT, b"a"), (true, CLOSE, b"")]);
    assert_eq!(whole(100, &s), [Ev::Frag, Ev::Close(1000)]);
}

#[test]
fn a_64_bit_length_frame_is_decoded() {
    let payload = vec![b'x'; 70_000];
    let f = client_frame(true, TEXT, &payload, M);
    assert_eq!(f[1] & 0x7f, 127);
    assert_eq!(whole(1 << 20, &f), [Ev::Msg(false, payload)]);
}

#[test]
fn the_decoder_holds_no_heap_once_a_reassembled_message_is_done() {
    let mut dec = Decoder::new(100);
    let mut s = frames(&[(false, TEXT, b"ab"), (true, CONT, b"cd")]);
    let (n, _) = dec.decode(&mut s).unwrap().unwrap();
    assert!(!dec.is_idle());
    let (m, ev) = dec.decode(&mut s[n..]).unwrap().unwrap();
    assert_eq!(own(ev), Ev::Msg(false, b"abcd".to_vec()));
    assert!(dec.is_idle());
    assert_eq!(dec.decode(&mut s[n + m..]), Ok(None));
    assert_eq!(dec.frag.buf.capacity(), 0);
    // It sits in every WebSocket's state.
    assert!(std::mem::size_of::<Decoder>() <= 40);
}

#[test]
fn reassembly_enforces_the_limit() {
    let mut r = Reassembly::default();
    r.start(Opcode::Text, b"abc").unwrap();
    assert!(r.push(b"de", 5).is_ok());
    assert_eq!(r.push(b"f", 5), Err(WsError::TooBig));
    let (op, buf) = r.finish();
    assert_eq!((op, &buf[..]), (Opcode::Text, &b"abcde"[..]));
    assert!(r.opcode.is_none());
}

// ------------------------------------------------------------------------------------------
// Properties

/// One client frame of a valid stream, and the event it must make.
#[derive(Debug, Clone)]
struct Part {
    fin: bool,
    op: u8,
    payload: Vec<u8>,
    mask: [u8; 4],
}

/// A data message cut into fragments at `cuts`, with a control frame after some fragments.
fn message() -> impl Strategy<Value = Vec<Part>> {
    let data = prop_oneof![
        any::<String>().prop_map(|s| (TEXT, s.into_bytes())),
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(|v| (BINARY, v)),
    ];
    let control = proptest::option::of((
        prop_oneof![Just(PING), Just(PONG)],
        proptest::collection::vec(any::<u8>(), 0..=125),
    ));
    let cuts = proptest::collection::vec((any::<prop::sample::Index>(), control), 0..4);
    (data, cuts, any::<[u8; 4]>()).prop_map(|((op, payload), cuts, mask)| {
        let mut at: Vec<(usize, _)> = cuts
            .into_iter()
            .map(|(i, c)| (i.index(payload.len() + 1), c))
            .collect();
        at.sort_by_key(|(i, _)| *i);
        let mut parts = Vec::new();
        let mut from = 0;
        for (to, control) in at {
            let op = if parts.is_empty() { op } else { CONT };
            parts.push(Part::data(false, op, &payload[from..to], mask));
            if let Some((op, p)) = control {
                parts.push(Part::data(true, op, &p, mask));
            }
            from = to;
        }
        let last = if parts.is_empty() { op } else { CONT };
        parts.push(Part::data(true, last, &payload[from..], mask));
        parts
    })
}

impl Part {
    fn data(fin: bool, op: u8, payload: &[u8], mask: [u8; 4]) -> Part {
        Part {
            fin,
            op,
            payload: payload.to_vec(),
            mask,
        }
    }
}

/// The events a valid stream must make, computed from its parts alone.
fn expected(parts: &[Part]) -> Vec<Ev> {
    let mut msg: Option<(bool, Vec<u8>)> = None;
    let mut out = Vec::new();
    for p in parts {
        match p.op {
            PING => out.push(Ev::Ping(p.payload.clone())),
            PONG => out.push(Ev::Pong),
            op => {
                let m = msg.get_or_insert((op == BINARY, Vec::new()));
                m.1.extend_from_slice(&p.payload);
                if p.fin {
                    let (binary, data) = msg.take().unwrap_or_default();
                    out.push(Ev::Msg(binary, data));
                } else {
                    out.push(Ev::Frag);
                }
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_valid_stream_in_any_chunks_makes_exactly_its_events(
        messages in proptest::collection::vec(message(), 1..6),
        sizes in proptest::collection::vec(1usize..80, 1..6),
    ) {
        let parts: Vec<Part> = messages.concat();
        let stream: Vec<u8> = parts
            .iter()
            .flat_map(|p| client_frame(p.fin, p.op, &p.payload, p.mask))
            .collect();
        let biggest = parts.iter().map(|p| p.payload.len() + 14).max().unwrap_or(0);
        let want = expected(&parts);
        prop_assert_eq!(&whole(1 << 20, &stream), &want);
        let (got, most) = feed(1 << 20, &stream, &sizes);
        prop_assert_eq!(got, want);
        prop_assert!(most < biggest, "{} bytes pending", most);
    }

    #[test]
    fn any_bytes_in_any_chunks_decode_as_whole_within_the_limit(
        stream in proptest::collection::vec(any::<u8>(), 0..600),
        sizes in proptest::collection::vec(1usize..40, 1..6),
        max in 0usize..200,
    ) {
        let want = whole(max, &stream);
        let (got, most) = feed(max, &stream, &sizes);
        prop_assert_eq!(&got, &want);
        prop_assert!(most < max + 14);
        for ev in &got {
            match ev {
                Ev::Msg(_, p) => prop_assert!(p.len() <= max),
                Ev::Fail(c) => prop_assert!(matches!(c, 1002 | 1007 | 1009)),
                _ => {}
            }
        }
    }
}

#[test]
fn rsv1_marks_a_compressed_message_only_once_deflate_is_negotiated() {
    // A compressed text frame (RSV1) and a compressed message in two fragments (RSV1 on the
    // first only); the bytes are not checked as UTF-8 until inflated.
    let mut stream = client_frame(true, 0x41, &[0xff, 0x01], [1, 2, 3, 4]);
    stream.extend(client_frame(false, 0x42, &[0xfe], [5, 6, 7, 8]));
    stream.extend(client_frame(true, 0x00, &[0xfd], [9, 9, 9, 9]));
    let run = |deflate: bool| {
        let mut dec = Decoder::new(100);
        dec.set_deflate(deflate);
        let mut buf = stream.clone();
        let mut pos = 0;
        let mut evs = Vec::new();
        loop {
            match dec.decode(&mut buf[pos..]) {
                Ok(Some((n, ev))) => {
                    pos += n;
                    evs.push(own(ev));
                }
                Ok(None) => return evs,
                Err(e) => {
                    evs.push(Ev::Fail(e.close_code()));
                    return evs;
                }
            }
        }
    };
    assert_eq!(
        run(true),
        [
            Ev::Z(false, vec![0xff, 0x01]),
            Ev::Frag,
            Ev::Z(true, vec![0xfe, 0xfd])
        ]
    );
    assert_eq!(run(false), [Ev::Fail(1002)], "RSV1 without the extension");
    // RSV1 on a continuation or a control frame is refused even when negotiated.
    let mut bad = client_frame(false, 0x01, b"a", [0; 4]);
    bad.extend(client_frame(true, 0x40, b"b", [0; 4]));
    let mut dec = Decoder::new(100);
    dec.set_deflate(true);
    let (n, _) = dec.decode(&mut bad).unwrap().unwrap();
    assert_eq!(dec.decode(&mut bad[n..]).unwrap_err().close_code(), 1002);
}
