//! A standalone configuration file's bytes through what `check-config` decides
//! ([`swimlb_speaker::fuzzing::standalone_file`]): parsing, validation, the daemon's start-up
//! refusals and the report. Must not panic; the properties are the function's.
//!
//! `cd speaker && cargo fuzz run -s none standalone_file fuzz/corpus/standalone_file fuzz/seeds/standalone_file -- -dict=fuzz/standalone_file.dict -max_total_time=600`
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = swimlb_speaker::fuzzing::standalone_file(data);
});
