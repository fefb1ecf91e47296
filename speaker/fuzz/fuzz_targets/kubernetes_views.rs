//! Services, EndpointSlices, Nodes, IPAddressPools and L2Advertisements as JSON through the
//! speaker's snapshot ([`swimlb_speaker::fuzzing::kubernetes_views`]): untrimmed and trimmed
//! caches, `build` and the running speaker's `Keeper`. Must not panic; the properties are the
//! function's.
//!
//! `cd speaker && cargo fuzz run -s none kubernetes_views fuzz/corpus/kubernetes_views fuzz/seeds/kubernetes_views -- -dict=fuzz/kubernetes_views.dict -max_total_time=600`
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = swimlb_speaker::fuzzing::kubernetes_views(data);
});
