//! `GossipMessage::parse` on arbitrary bytes: must not panic, and whatever it accepts must emit
//! back to exactly the bytes it was read from (the format has one encoding per message).
//!
//! `cd proto && cargo fuzz run -s none gossip_parse fuzz/corpus/gossip_parse fuzz/seeds/gossip_parse -- -max_total_time=300`
#![no_main]

use libfuzzer_sys::fuzz_target;
use swimlb_proto::GossipMessage;

fuzz_target!(|data: &[u8]| {
    let Ok(message) = GossipMessage::parse(data) else {
        return;
    };
    assert_eq!(message.buffer_len(), data.len());
    assert_eq!(message.kind().code(), data[0]);
    let mut buf = Vec::new();
    message.emit_vec(&mut buf);
    assert_eq!(buf, data);
});
