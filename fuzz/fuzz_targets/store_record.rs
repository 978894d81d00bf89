//! The durable store's decoders driven the way recovery drives them (`store::recover`):
//! record framing (`record::decode`), the resync scan after damage (`record::resync`) and the
//! entry decoder (`entry::Entry::decode`) over an arbitrary segment body.
//!
//! Checks, besides "no panic": a whole record's every proper prefix is "incomplete", never
//! "invalid" and never a record; resync only lands on whole valid records, after the damage;
//! the scan always advances, so it ends; an entry that decodes re-encodes to the same bytes
//! (one encoding per entry), and a compact message (`Body`, kind 6) holds its topic in its
//! body as the writer's check wants; framing any payload decodes back to it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walletrelay::store::entry::Entry;
use walletrelay::store::record;

fuzz_target!(|data: &[u8]| {
    let mut pos = 0;
    while pos < data.len() {
        match record::decode(&data[pos..]) {
            Ok(Some((n, payload))) => {
                assert!(n >= record::HEADER_LEN && pos + n <= data.len());
                assert_eq!(n, record::HEADER_LEN + payload.len());
                assert!(matches!(record::decode(&data[pos..pos + n - 1]), Ok(None)));
                if let Ok(e) = Entry::decode(payload) {
                    let mut again = Vec::new();
                    e.encode(&mut again).expect("a decoded entry encodes");
                    assert_eq!(again, payload, "entry encoding is not canonical");
                    assert_eq!(e.encoded_len(), payload.len());
                    if let Entry::Body { topic, data, .. } = e {
                        assert!(Entry::topic_in_body(topic, data));
                    }
                }
                pos += n;
            }
            Ok(None) | Err(_) => match record::resync(data, pos + 1) {
                Some(next) => {
                    assert!(next > pos);
                    assert!(matches!(record::decode(&data[next..]), Ok(Some(_))));
                    pos = next;
                }
                None => break,
            },
        }
    }
    // Framing the input as one payload round-trips.
    let mut framed = Vec::new();
    record::encode(data, &mut framed).expect("fuzz inputs are under the record limit");
    assert_eq!(record::decode(&framed), Ok(Some((framed.len(), data))));
});
