//! The fuzz seeds of the exact-round-trip targets, replayed on stable Rust with the targets'
//! checks: every seed parses, and emits back to its own bytes. The gossip seeds are written by
//! `tests/golden/generate.py --seeds fuzz/seeds`.

use std::fs;
use std::path::PathBuf;

use swimlb_proto::{GossipMessage, WatchMessage, golden};

/// Every seed file of one fuzz target, with its name.
fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut seeds: Vec<_> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, fs::read(&path).unwrap())
        })
        .collect();
    seeds.sort();
    seeds
}

#[test]
fn every_gossip_seed_parses_and_emits_back_to_itself() {
    let seeds = seeds("gossip_parse");
    assert_eq!(seeds.len(), 11, "one seed per golden gossip payload");
    for (name, bytes) in &seeds {
        let message = GossipMessage::parse(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(message.buffer_len(), bytes.len(), "{name}");
        let mut out = Vec::new();
        message.emit_vec(&mut out);
        assert_eq!(&out, bytes, "{name}");
    }
}

#[test]
fn the_gossip_seeds_are_the_golden_payloads() {
    let seeds = seeds("gossip_parse");
    for golden in [
        &golden::GOSSIP_FOCA[..],
        &golden::GOSSIP_META,
        &golden::GOSSIP_META_PULL,
        &golden::GOSSIP_META_PULL_OF,
        &golden::GOSSIP_SYNC,
        &golden::GOSSIP_INQUIRE,
        &golden::GOSSIP_PING,
        &golden::GOSSIP_PONG,
        &golden::GOSSIP_VERDICT_UNREACHABLE,
        &golden::GOSSIP_VERDICT_REACHABLE,
        &golden::GOSSIP_WATCH,
    ] {
        assert!(
            seeds.iter().any(|(_, bytes)| bytes == golden),
            "no seed holds {golden:02x?}"
        );
    }
}

#[test]
fn every_watch_seed_parses_and_emits_back_to_itself() {
    let seeds = seeds("watch_parse");
    assert!(!seeds.is_empty());
    for (name, bytes) in &seeds {
        let message = WatchMessage::parse(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut out = vec![0u8; message.buffer_len()];
        message.emit(&mut out).unwrap();
        assert_eq!(&out, bytes, "{name}");
    }
}
