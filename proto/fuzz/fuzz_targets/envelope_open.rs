//! `KeyRing::open_envelope` and `KeyRing::peek_key_id` on arbitrary bytes: must not panic, must
//! agree on the header checks, and an envelope that opens must carry the sequence its header
//! bytes spell.
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

fn be64(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes.try_into().expect("8 bytes"))
}

fuzz_target!(|data: &[u8]| {
    let peek = KeyRing::peek_key_id(data);
    let mut buf = data.to_vec();
    match ring().open_envelope(&mut buf) {
        Ok(opened) => {
            assert_eq!(peek, Ok(opened.key_id));
            assert_eq!(opened.payload.len() + swimlb_proto::envelope::OVERHEAD, data.len());
            assert_eq!(opened.sequence.sender, be64(&data[9..17]));
            assert_eq!(opened.sequence.epoch, be64(&data[17..25]));
            assert_eq!(opened.sequence.counter, be64(&data[29..37]));
        }
        Err(Error::UnknownKey(_) | Error::AuthenticationFailed) => assert!(peek.is_ok()),
        Err(e) => assert_eq!(peek, Err(e)),
    }
});
