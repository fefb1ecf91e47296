//! `KeyRing::open` and `KeyRing::peek_key_id` on arbitrary bytes: must not panic, and must agree
//! on the header checks.
//!
//! `cd proto && cargo fuzz run -s none envelope_open fuzz/corpus/envelope_open fuzz/seeds/envelope_open -- -max_total_time=300`
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use swimlb_proto::{Error, KeyRing};

fn ring() -> &'static KeyRing {
    static RING: OnceLock<KeyRing> = OnceLock::new();
    // The key and cluster of the golden envelope, so the seed opens.
    RING.get_or_init(|| KeyRing::new("edge-1", &[[0x11; 32]]).expect("valid ring"))
}

fuzz_target!(|data: &[u8]| {
    let peek = KeyRing::peek_key_id(data);
    let mut buf = data.to_vec();
    match ring().open(&mut buf) {
        Ok(payload) => {
            assert!(peek.is_ok());
            assert_eq!(payload.len() + swimlb_proto::envelope::OVERHEAD, data.len());
        }
        Err(Error::UnknownKey(_) | Error::AuthenticationFailed) => assert!(peek.is_ok()),
        Err(e) => assert_eq!(peek, Err(e)),
    }
});
