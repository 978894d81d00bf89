//! Differential: `rpc::decode_fast` (the scanner for messages of the usual shape) against
//! `rpc::decode_general` (`serde` + `simd-json`, the reference) on arbitrary bytes. Whenever
//! the fast path handles a message, both give the same result, and so do `conn::methods::parse` on it and
//! `rpc::decode` (which takes the fast path first). Declining is always allowed.
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use walletrelay::conn::methods;
use walletrelay::rpc::{self, Incoming, Item};

/// `max_topic` of the default `Limits`.
const MAX_TOPIC: usize = 256;

fn ops(i: Incoming<'_>) -> Option<Result<methods::Request<'_>, rpc::RpcError>> {
    match i {
        Incoming::Single(Item::Call(mut c)) => Some(methods::parse(&mut c, MAX_TOPIC)),
        _ => None,
    }
}

thread_local! {
    static BUFFERS: RefCell<simd_json::Buffers> = RefCell::new(simd_json::Buffers::new(4096));
}

fuzz_target!(|data: &[u8]| {
    let Some(fast) = rpc::decode_fast(data) else {
        return;
    };
    BUFFERS.with(|b| {
        let mut scratch = b.borrow_mut();
        let mut copy = data.to_vec();
        let general = rpc::decode_general(&mut copy, &mut scratch);
        assert_eq!(
            Ok(&fast),
            general.as_ref(),
            "fast path differs on {:?}",
            String::from_utf8_lossy(data)
        );
        let mut again = data.to_vec();
        let full = rpc::decode(&mut again, &mut scratch);
        assert_eq!(full.as_ref(), general.as_ref());
        if let Ok(general) = general {
            assert_eq!(ops(fast), ops(general));
        }
    });
});
