//! `WatchMessage::parse` on arbitrary bytes: must not panic, and whatever it accepts must emit
//! back to exactly the bytes it was read from (the format has one encoding per message).
//!
//! `cd proto && cargo fuzz run -s none watch_parse fuzz/corpus/watch_parse fuzz/seeds/watch_parse -- -max_total_time=300`
#![no_main]

use libfuzzer_sys::fuzz_target;
use swimlb_proto::heartbeat::{MAX_LEN, WatchMessage};

fuzz_target!(|data: &[u8]| {
    let Ok(message) = WatchMessage::parse(data) else {
        return;
    };
    assert!(WatchMessage::is_watch(data));
    assert_eq!(message.buffer_len(), data.len());
    assert!(data.len() <= MAX_LEN);
    let mut buf = [0u8; MAX_LEN];
    let len = message.emit(&mut buf).expect("a parsed message emits");
    assert_eq!(&buf[..len], data);
});
