//! `swimlb-speaker convert-keepalived` as an operator runs it, on a corpus of keepalived
//! configurations in `tests/convert_keepalived/`: real-world shapes (a two-node API server VIP,
//! unicast peers, IPv6, a sync group, scripts with positive and negative weights, includes),
//! the lab's own keepalived configuration in both its tunings (copies of what
//! `swimlb_e2e::keepalived::config` renders for node-1, which
//! `e2e/tests/keepalived_convert.rs` holds them to), and files that must be refused.
//!
//! Each `NAME.conf` runs from the corpus folder with the arguments of `NAME.args` (one a line,
//! if the file exists). A `refused_*` file must exit 65 with the refusals of `NAME.stderr`;
//! any other must exit 0, print `NAME.yaml` and warn `NAME.stderr`, and `check-config` must
//! accept its output (with a key file made here). `SWIMLB_REGENERATE=1` rewrites the recorded
//! files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use swimlb_config::standalone::{CheckKind, Standalone};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/convert_keepalived")
}

fn regenerate() -> bool {
    std::env::var_os("SWIMLB_REGENERATE").is_some()
}

/// Compares `actual` with the recorded file `path` (or records it).
fn golden(path: &Path, actual: &str) {
    if regenerate() {
        std::fs::write(path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} (SWIMLB_REGENERATE=1 records it)", path.display()));
    assert_eq!(
        actual,
        expected,
        "{} differs (SWIMLB_REGENERATE=1 records the new output)",
        path.display()
    );
}

fn speaker(dir: &Path, args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_swimlb-speaker"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A scratch folder of this test process.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "swimlb-convert-keepalived-{}-{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `check-config` on `yaml`, with its key file replaced by one made here.
fn check_config(name: &str, yaml: &str) -> Output {
    let dir = scratch(name);
    let keys = dir.join("keys");
    std::fs::write(
        &keys,
        format!("{}\n", swimlb_config::keyfile::encode_key(&[7; 32])),
    )
    .unwrap();
    std::fs::set_permissions(&keys, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let yaml = yaml.replace(
        &format!("keyFile: {}", swimlb_config::keepalived::KEY_FILE),
        &format!("keyFile: {}", keys.display()),
    );
    assert!(yaml.contains(&keys.display().to_string()), "{yaml}");
    let file = dir.join("speaker.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = speaker(&dir, &["check-config".into(), file.display().to_string()]);
    let _ = std::fs::remove_dir_all(&dir);
    out
}

fn convert(name: &str) -> Output {
    let dir = corpus();
    let mut args = vec!["convert-keepalived".to_string()];
    if let Ok(extra) = std::fs::read_to_string(dir.join(format!("{name}.args"))) {
        args.extend(extra.lines().map(str::to_string));
    }
    args.push(format!("{name}.conf"));
    speaker(&dir, &args)
}

#[test]
fn every_file_of_the_corpus_converts_or_is_refused_as_recorded() {
    let mut names: Vec<String> = std::fs::read_dir(corpus())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".conf").map(str::to_string)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 10, "{names:?}");
    for name in &names {
        let out = convert(name);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        let dir = corpus();
        if name.starts_with("refused_") {
            assert_eq!(out.status.code(), Some(65), "{name}: {stdout}{stderr}");
            assert!(stdout.is_empty(), "{name}: {stdout}");
            assert!(
                stderr.ends_with("keyword(s) refused, nothing converted\n"),
                "{name}: {stderr}"
            );
            golden(&dir.join(format!("{name}.stderr")), &stderr);
            assert!(!dir.join(format!("{name}.yaml")).exists(), "{name}");
        } else {
            assert_eq!(out.status.code(), Some(0), "{name}: {stderr}");
            golden(&dir.join(format!("{name}.yaml")), &stdout);
            golden(&dir.join(format!("{name}.stderr")), &stderr);
            let checked = check_config(name, &stdout);
            assert_eq!(
                checked.status.code(),
                Some(0),
                "{name}: check-config refuses the result:\n{}{stdout}",
                text(&checked.stderr)
            );
        }
    }
}

#[test]
fn every_refusal_names_its_file_and_line() {
    let out = convert("refused_router");
    let stderr = text(&out.stderr);
    let mut lines: Vec<&str> = stderr.lines().collect();
    let summary = lines.pop().unwrap();
    assert!(
        summary.starts_with("swimlb-speaker convert-keepalived: "),
        "{summary}"
    );
    for line in &lines {
        let mut parts = line.splitn(3, ':');
        assert_eq!(parts.next(), Some("refused_router.conf"), "{line}");
        let number: u32 = parts.next().unwrap().parse().unwrap_or(0);
        assert!(number > 0, "{line}");
    }
    for keyword in ["nopreempt", "notify_master", "eth0", "virtual_routes"] {
        assert!(
            lines.iter().any(|l| l.contains(&format!(": {keyword}: "))),
            "{keyword} is not refused:\n{stderr}"
        );
    }
}

#[test]
fn the_lab_configuration_needs_the_other_nodes_on_the_command_line() {
    let out = speaker(
        &corpus(),
        &["convert-keepalived".into(), "lab_defaults.conf".into()],
    );
    assert_eq!(out.status.code(), Some(65));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("lab_defaults.conf:6: unicast_peer: no unicast_peer: keepalived finds its peers by multicast, swimlb needs their addresses; add `--peer ADDRESS` for each other node"),
        "{stderr}"
    );
}

#[test]
fn standard_input_converts_but_cannot_include() {
    let dir = corpus();
    let run = |file: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_swimlb-speaker"))
            .arg("convert-keepalived")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let text = std::fs::read(dir.join(file)).unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), &text).unwrap();
        drop(child.stdin.take());
        child.wait_with_output().unwrap()
    };
    let out = run("api_two_nodes.conf");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).replace("(stdin)", "api_two_nodes.conf"),
        std::fs::read_to_string(dir.join("api_two_nodes.yaml")).unwrap()
    );
    let out = run("include_main.conf");
    assert_eq!(out.status.code(), Some(65));
    assert!(
        text(&out.stderr).contains("(stdin):5: include: standard input has no directory"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_file_that_cannot_be_read_exits_64() {
    let out = speaker(
        &corpus(),
        &["convert-keepalived".into(), "no-such-file.conf".into()],
    );
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).contains("no-such-file.conf"));
}

/// The book's worked example: the keepalived.conf of `docs/examples/keepalived/` converts to
/// `converted.yaml` there, which the page shows, and to its hand-written swimlb.yaml but for
/// what the page says differs: the group's name, the
/// check (the page asks the API server over HTTP instead of running the script), the notify
/// program's path (the page's is adapted to swimlb's arguments), `scriptUser` and `listen`.
#[test]
fn the_books_example_converts_to_its_hand_written_file_but_for_what_the_page_says() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/keepalived");
    let out = speaker(
        &dir,
        &[
            "convert-keepalived".into(),
            "--cluster".into(),
            "api".into(),
            "keepalived.conf".into(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // The page shows the output as it is.
    golden(&dir.join("converted.yaml"), &text(&out.stdout));
    let converted = Standalone::parse(&text(&out.stdout)).unwrap();
    let written =
        Standalone::parse(&std::fs::read_to_string(dir.join("swimlb.yaml")).unwrap()).unwrap();
    assert_eq!(converted.cluster, written.cluster);
    assert_eq!(converted.node, written.node);
    assert_eq!(converted.bind, written.bind);
    assert_eq!(converted.peers, written.peers);
    assert_eq!(converted.key_file, written.key_file);
    assert_eq!(converted.announce, written.announce);
    let (c, w) = (&converted.groups[0], &written.groups[0]);
    assert_eq!((c.name.as_str(), w.name.as_str()), ("VI_1", "api"));
    assert_eq!(c.addresses, w.addresses);
    assert_eq!(c.interface, w.interface);
    assert_eq!(c.preempt_delay, w.preempt_delay);
    for node in ["master-0", "master-1", "master-2"] {
        assert_eq!(c.priority.of(node), w.priority.of(node), "{node}");
    }
    let (cc, wc) = (&c.checks[0], &w.checks[0]);
    assert_eq!(
        (cc.interval, cc.timeout, cc.rise, cc.fall, cc.weight),
        (wc.interval, wc.timeout, wc.rise, wc.fall, wc.weight)
    );
    assert!(
        matches!(&cc.kind, CheckKind::Exec { argv, .. } if argv == &["/etc/keepalived/check_apiserver.sh"])
    );
    assert!(matches!(&wc.kind, CheckKind::Http { .. }));
    assert_eq!(
        c.notify.as_deref(),
        Some(Path::new("/etc/keepalived/notify.sh"))
    );
    assert_eq!(
        w.notify.as_deref(),
        Some(Path::new("/etc/swimlb/notify.sh"))
    );
}
