//! The lab's own keepalived configuration, as `swimlb_e2e::keepalived::config` renders it for
//! node-1 in both tunings, is the one the converter's corpus holds
//! (`speaker/tests/convert_keepalived/lab_*.conf`), and converts with the other nodes given on
//! the command line.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use swimlb_config::keepalived::{Disk, Options, convert};
use swimlb_e2e::keepalived::{Tuning, config};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../speaker/tests/convert_keepalived")
}

#[test]
fn the_corpus_holds_what_the_lab_renders_and_it_converts() {
    let fifo = Path::new("/run/swimlb-lab/keepalived-node-1.fifo");
    let vip = Ipv4Addr::new(198, 51, 100, 100);
    for (tuning, name) in [
        (Tuning::Defaults, "lab_defaults.conf"),
        (Tuning::Fast, "lab_fast.conf"),
    ] {
        let rendered = config("node-1", vip, 24, 100, tuning, fifo);
        let copy = std::fs::read_to_string(corpus().join(name)).expect("the corpus copy");
        assert_eq!(rendered, copy, "{name} is not what the lab renders");
        let options = Options {
            bind: Some("198.51.100.11".parse().unwrap()),
            peers: vec!["198.51.100.12".parse().unwrap()],
            ..Options::default()
        };
        let converted = convert(Some(Path::new(name)), &rendered, &Disk, &options)
            .unwrap_or_else(|e| panic!("{name}: {e:#?}"));
        let file = swimlb_config::standalone::Standalone::parse(&converted.yaml).unwrap();
        assert_eq!(file.node.as_deref(), Some("node-1"));
        assert_eq!(file.groups[0].addresses, [std::net::IpAddr::V4(vip)]);
        assert_eq!(file.groups[0].interface.as_deref(), Some("eth0"));
    }
}
