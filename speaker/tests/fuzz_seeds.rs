//! Every seed of the fuzz targets in `speaker/fuzz/seeds/` through the function its target calls
//! (`swimlb_speaker::fuzzing`), in a stable `cargo test`: none panics, and the seeds whose
//! outcome is known give it. A crashing input the fuzzer finds is added to the seeds, so it is
//! replayed here from then on.

use std::path::{Path, PathBuf};

use swimlb_speaker::fuzzing::{kubernetes_views, standalone_file};

fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "no seed in {}", dir.display());
    seeds
}

#[test]
fn every_standalone_file_seed_gives_the_error_its_first_line_names_or_a_report() {
    for (name, bytes) in seeds("standalone_file") {
        let outcome = standalone_file(&bytes);
        let text = String::from_utf8_lossy(&bytes);
        match text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# error: "))
        {
            Some(error) => {
                // A YAML syntax error quotes the lines around it after its first line.
                let first_lines = outcome.map_err(|errors| {
                    errors
                        .iter()
                        .map(|e| e.lines().next().unwrap_or_default().to_string())
                        .collect::<Vec<_>>()
                });
                assert_eq!(first_lines, Err(vec![error.to_string()]), "{name}");
            }
            None if name.ends_with(".yaml") => {
                let report = outcome.unwrap_or_else(|e| panic!("{name}: {e:?}"));
                assert!(report.starts_with("valid: "), "{name}: {report}");
            }
            // A fuzzer's input: it must only not panic.
            None => {}
        }
    }
}

#[test]
fn every_kubernetes_views_seed_builds_a_snapshot_without_panic() {
    let mut reasons_seen = std::collections::BTreeSet::new();
    for (name, bytes) in seeds("kubernetes_views") {
        let Some(built) = kubernetes_views(&bytes) else {
            assert!(
                !name.ends_with(".json"),
                "{name}: a seed of ours is not a JSON object"
            );
            continue;
        };
        reasons_seen.extend(built.dropped.iter().map(|d| d.as_str()));
        let served: Vec<String> = built
            .snapshot
            .iter()
            .map(|(ip, _)| ip.to_string())
            .collect();
        match name.as_str() {
            "empty.json" => assert!(served.is_empty() && built.dropped.is_empty(), "{name}"),
            "one_service.json" => assert_eq!(served, ["198.51.100.10"], "{name}"),
            "shared_ip_and_conflict.json" => assert_eq!(served, ["198.51.100.30"], "{name}"),
            _ => {}
        }
    }
    for reason in [
        "invalid_pool",
        "invalid_advertisement",
        "invalid_ingress_ip",
        "outside_pools",
        "split_across_pools",
        "ip_conflict",
    ] {
        assert!(
            reasons_seen.contains(reason),
            "no seed is dropped for {reason}: {reasons_seen:?}"
        );
    }
}
