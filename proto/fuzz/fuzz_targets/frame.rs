//! `Frame::parse` on arbitrary bytes: must not panic, and whatever it accepts must survive
//! `parse(emit(parse(x))) == parse(x)`.
//!
//! `cd proto && cargo fuzz run -s none frame fuzz/corpus/frame fuzz/seeds/frame -- -max_total_time=300`
#![no_main]

use libfuzzer_sys::fuzz_target;
use swimlb_proto::Frame;

fuzz_target!(|data: &[u8]| {
    let Ok(frame) = Frame::parse(data) else {
        return;
    };
    let mut buf = [0u8; 2048];
    match frame {
        Frame::Arp { arp, .. } => {
            arp.emit_frame(&mut buf).expect("arp fits");
            let Ok(Frame::Arp { arp: again, .. }) = Frame::parse(&buf[..arp.frame_len()]) else {
                panic!("emitted arp does not parse");
            };
            assert_eq!(again, arp);
        }
        Frame::Ndp(ndp) => {
            ndp.emit(&mut buf).expect("ndp fits");
            assert_eq!(Frame::parse(&buf[..ndp.frame_len()]), Ok(Frame::Ndp(ndp)));
        }
        Frame::Vrrp(vrrp) => {
            let len = vrrp.frame_len();
            if len <= buf.len() {
                vrrp.emit(&mut buf).expect("vrrp fits");
                assert_eq!(Frame::parse(&buf[..len]), Ok(Frame::Vrrp(vrrp)));
            }
        }
        Frame::Other { .. } => {}
    }
});
