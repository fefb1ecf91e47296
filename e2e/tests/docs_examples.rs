//! The book's example files (`docs/examples/`, `deploy/standalone/`) are ones the programs
//! accept, and give what the pages say they give:
//!
//! - every standalone file passes `swimlb-speaker check-config` (with its `keyFile` pointed at a
//!   key `keygen` made), and what the standalone page prints for it is what the command prints;
//! - every Kubernetes object parses as swimlb's resource types or as a Service with no field left
//!   unread, and the pools and advertisements validate;
//! - the Services of the configuration page get, from the allocator, the addresses the page
//!   names, and the impossible one the error it names;
//! - `convert-metallb` converts the MetalLB example and refuses the BGP one with exit 65;
//! - the trial overlay gives both components the class and the speakers another port
//!   (`kubectl kustomize`, when kubectl is installed);
//! - the systemd unit has the limits the page describes and passes `systemd-analyze verify`
//!   (which test.sh installs; without it the test fails); the nftables example passes `nft -c`
//!   (as root, when installed);
//! - as root: the speaker runs with the unit's two capabilities alone, owns a VIP, and
//!   removes its link when stopped.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Service;
use serde_json::Value;
use swimlb_config::crd::{IPAddressPool, L2Advertisement};
use swimlb_config::pools::validate;
use swimlb_config::service::view_of;
use swimlb_controller::allocator::{AllocationError, Allocator, Verdict};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn examples() -> PathBuf {
    repo().join("docs/examples")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `swimlb-lab speaker ARGS` or `swimlb-lab controller ARGS`: the same entry points as the
/// `swimlb-speaker` and `swimlb-controller` binaries.
fn lab(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_swimlb-lab"));
    command.args(args);
    command
}

fn run(mut command: Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A scratch folder of this test, empty.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("docs-examples-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

fn on_path(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// A key file made by `keygen`, in `dir`.
fn key_file(dir: &Path) -> PathBuf {
    let out = run(lab(&["speaker", "keygen"]));
    assert!(out.status.success(), "keygen: {}", text(&out.stderr));
    let line = text(&out.stdout);
    assert_eq!(
        line.len(),
        45,
        "one base64 key of 32 bytes and a newline: {line:?}"
    );
    let path = dir.join("keys");
    // Mode 0600: the speaker refuses a key file others may read.
    swimlb_config::keyfile::write_key_file(&path, &line).expect("key file");
    path
}

/// The example `file` with its `keyFile` pointed at `keys`, written into `dir`.
fn with_key(file: &Path, keys: &Path, dir: &Path) -> PathBuf {
    let original = read(file);
    assert!(
        original.contains("keyFile: /etc/swimlb/keys"),
        "{}: the examples name the key file of the pages",
        file.display()
    );
    let name = file.file_name().expect("a file name");
    let path = dir.join(name);
    let keyed = original.replace(
        "keyFile: /etc/swimlb/keys",
        &format!("keyFile: {}", keys.display()),
    );
    std::fs::write(&path, keyed).expect("example copy");
    path
}

/// `swimlb-speaker check-config FILE`, through the lab binary.
fn check_config(file: &Path) -> Output {
    run(lab(&[
        "speaker",
        "check-config",
        file.to_str().expect("utf-8"),
    ]))
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn standalone_files() -> Vec<PathBuf> {
    let mut files = yaml_files(&examples().join("standalone"));
    files.push(examples().join("keepalived/swimlb.yaml"));
    files
}

#[test]
fn every_standalone_example_passes_check_config() {
    let dir = scratch("check-config");
    let keys = key_file(&dir);
    let files = standalone_files();
    assert!(files.len() >= 3, "{files:?}");
    for file in files {
        let copy = with_key(&file, &keys, &dir);
        let out = check_config(&copy);
        assert!(
            out.status.success(),
            "{}: check-config refused it:\n{}",
            file.display(),
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).starts_with("valid: "),
            "{}",
            text(&out.stdout)
        );
    }
}

#[test]
fn the_standalone_page_shows_what_check_config_prints() {
    let dir = scratch("page-output");
    let keys = key_file(&dir);
    let page = read(&repo().join("docs/src/install/standalone.md"));
    let copy = with_key(&examples().join("standalone/speaker.yaml"), &keys, &dir);
    let out = check_config(&copy);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    assert!(
        page.contains(&printed),
        "docs/src/install/standalone.md does not show what check-config prints now:\n{printed}"
    );
    // The page's broken file: the errors it shows, under the page's path.
    let broken = dir.join("speaker.yaml");
    std::fs::write(
        &broken,
        "cluster: edge-1\nbind: 192.0.2.10:7946\npeers: [192.0.2.11:7946]\nkeyFile: /etc/swimlb/keys\n\
         groups:\n  - name: api\n    addresses: [192.0.2.100/24]\n    checks:\n      \
         - {name: api, tcp: \"127.0.0.1:6443\", interval: 1, fall: 2}\n",
    )
    .expect("broken file");
    let out = check_config(&broken);
    assert_eq!(out.status.code(), Some(64), "an invalid file exits 64");
    let errors =
        text(&out.stderr).replace(broken.to_str().expect("utf-8"), "/etc/swimlb/speaker.yaml");
    assert!(
        page.contains(&errors),
        "docs/src/install/standalone.md does not show what check-config prints for the broken file:\n{errors}"
    );
}

/// The paths of `given`'s fields with a value that `kept` (the same object read and written
/// back) lacks: what a type would silently drop.
fn dropped_fields(given: &Value, kept: &Value, path: &str, out: &mut Vec<String>) {
    match (given, kept) {
        (Value::Object(g), Value::Object(k)) => {
            for (key, value) in g {
                let here = format!("{path}.{key}");
                match k.get(key) {
                    Some(kept) => dropped_fields(value, kept, &here, out),
                    None if !value.is_null() => out.push(here),
                    None => {}
                }
            }
        }
        (Value::Array(g), Value::Array(k)) if g.len() == k.len() => {
            for (i, (g, k)) in g.iter().zip(k).enumerate() {
                dropped_fields(g, k, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// `doc` read as `T`, with no field left unread.
fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value, origin: &str) -> T {
    let value: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{origin}: {e}"));
    let mut dropped = Vec::new();
    let back = serde_json::to_value(&value).expect("serialize");
    dropped_fields(doc, &back, "", &mut dropped);
    assert!(
        dropped.is_empty(),
        "{origin}: fields nobody reads: {dropped:?}"
    );
    value
}

/// The objects of the Kubernetes example files under `dir`, by kind.
#[derive(Default)]
struct Objects {
    pools: Vec<IPAddressPool>,
    advertisements: Vec<L2Advertisement>,
    services: Vec<Service>,
}

fn objects(files: &[PathBuf]) -> Objects {
    let mut found = Objects::default();
    for file in files {
        let docs: Vec<Value> = serde_saphyr::from_multiple(&read(file))
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for (i, doc) in docs.iter().enumerate() {
            let origin = format!("{} document {i}", file.display());
            match (doc["apiVersion"].as_str(), doc["kind"].as_str()) {
                (Some("swimlb.io/v1beta1"), Some("IPAddressPool")) => {
                    found.pools.push(typed(doc, &origin))
                }
                (Some("swimlb.io/v1beta1"), Some("L2Advertisement")) => {
                    found.advertisements.push(typed(doc, &origin))
                }
                (Some("v1"), Some("Service")) => found.services.push(typed(doc, &origin)),
                other => panic!("{origin}: an object the examples do not hold: {other:?}"),
            }
        }
    }
    found
}

fn kubernetes_files() -> Vec<PathBuf> {
    let mut files = yaml_files(&examples().join("kubernetes"));
    files.extend(
        yaml_files(&examples().join("kubernetes/trial"))
            .into_iter()
            .filter(|p| !p.ends_with("kustomization.yaml")),
    );
    files
}

#[test]
fn every_kubernetes_example_parses_and_its_pools_and_advertisements_validate() {
    let files = kubernetes_files();
    let all = objects(&files);
    assert!(all.pools.len() >= 4 && all.services.len() >= 7, "{files:?}");
    // Each file's pools and advertisements form a valid configuration of their own.
    for file in files {
        let one = objects(std::slice::from_ref(&file));
        let validated = validate(&one.pools, &one.advertisements);
        assert!(
            validated.errors.is_empty(),
            "{}: {:?}",
            file.display(),
            validated.errors
        );
    }
}

/// What the allocator gives each Service of `services` (in order) from the pools of `pools`.
fn assign(
    pools: &str,
    services: &str,
    namespaces: &BTreeMap<&str, BTreeMap<String, String>>,
) -> Vec<(String, Verdict)> {
    let config = objects(&[examples().join(pools)]);
    let model = validate(&config.pools, &config.advertisements)
        .into_result()
        .expect("the example pools are valid");
    let mut allocator = Allocator::new(None, &model);
    assert!(allocator.load_existing(&[]).is_empty());
    objects(&[examples().join(services)])
        .services
        .iter()
        .map(|svc| {
            let namespace = svc.metadata.namespace.as_deref().unwrap_or("default");
            let labels = namespaces.get(namespace).cloned().unwrap_or_default();
            let view = view_of(svc, &labels);
            (view.key.to_string(), allocator.assign(&view))
        })
        .collect()
}

fn assigned(ips: &[&str], pool: &str) -> Verdict {
    Verdict::Assigned {
        ips: ips
            .iter()
            .map(|ip| ip.parse().expect("test address"))
            .collect(),
        pool: pool.into(),
    }
}

#[test]
fn the_first_service_gets_the_lowest_address_of_the_first_pool() {
    let verdicts = assign(
        "kubernetes/first-pool.yaml",
        "kubernetes/web-service.yaml",
        &BTreeMap::new(),
    );
    assert_eq!(
        verdicts,
        [("default/web".to_string(), assigned(&["192.0.2.100"], "lan"))]
    );
}

#[test]
fn the_services_of_the_configuration_page_get_what_it_says() {
    let namespaces = BTreeMap::from([(
        "shop",
        BTreeMap::from([("team".to_string(), "a".to_string())]),
    )]);
    let verdicts = assign(
        "kubernetes/pools.yaml",
        "kubernetes/services.yaml",
        &namespaces,
    );
    let expected = [
        ("default/dns", assigned(&["198.51.100.10"], "reserved")),
        ("default/dns-tcp", assigned(&["198.51.100.10"], "reserved")),
        ("default/metrics", assigned(&["198.51.100.11"], "reserved")),
        (
            "default/web-dual",
            assigned(&["192.0.2.96", "2001:db8:100::"], "lan"),
        ),
        ("default/ingress", assigned(&["192.0.2.97"], "lan")),
        ("shop/cart", assigned(&["203.0.113.0"], "team-a")),
    ];
    let expected: Vec<(String, Verdict)> = expected
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(verdicts, expected);
    // The page names each address and pool.
    let page = read(&repo().join("docs/src/configuration/services.md"));
    for (service, verdict) in &expected {
        let Verdict::Assigned { ips, pool } = verdict else {
            unreachable!()
        };
        let name = service.rsplit('/').next().expect("a name");
        let ips: Vec<String> = ips.iter().map(|ip| format!("`{ip}`")).collect();
        let row = format!("| `{name}` | {} | `{pool}` |", ips.join(", "));
        assert!(page.contains(&row), "the page lacks the row {row}");
    }
}

#[test]
fn the_impossible_service_gets_the_error_the_page_names() {
    let verdicts = assign(
        "kubernetes/pools.yaml",
        "kubernetes/impossible-service.yaml",
        &BTreeMap::new(),
    );
    let ip: IpAddr = "10.99.0.1".parse().expect("address");
    assert_eq!(
        verdicts,
        [(
            "default/lost".to_string(),
            Verdict::Error(AllocationError::IpNotInPool(ip))
        )]
    );
    let message = AllocationError::IpNotInPool(ip).to_string();
    let page = read(&repo().join("docs/src/configuration/services.md"));
    assert!(
        page.contains(&message),
        "the page lacks the Event's note {message:?}"
    );
}

fn convert(file: &str) -> Output {
    let mut child = lab(&["controller", "convert-metallb"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("convert-metallb");
    let input = read(&examples().join(file));
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), input.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("convert-metallb")
}

#[test]
fn convert_metallb_converts_the_example_into_valid_swimlb_objects() {
    let out = convert("metallb/metallb.json");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list: Value = serde_json::from_slice(&out.stdout).expect("a JSON List");
    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().expect("items");
    let kinds: Vec<&str> = items.iter().filter_map(|i| i["kind"].as_str()).collect();
    assert_eq!(kinds, ["IPAddressPool", "L2Advertisement"]);
    for item in items {
        assert_eq!(item["apiVersion"], "swimlb.io/v1beta1");
        assert_eq!(item["metadata"]["namespace"], "swimlb-system");
        assert!(
            item["status"].is_null(),
            "no status is carried over: {item}"
        );
        assert!(
            item["metadata"]["uid"].is_null(),
            "no uid is carried over: {item}"
        );
    }
    assert!(
        !text(&out.stdout).contains("last-applied-configuration"),
        "kubectl's record of MetalLB's object is dropped"
    );
    let pool: IPAddressPool = typed(&items[0], "converted pool");
    let ad: L2Advertisement = typed(&items[1], "converted advertisement");
    assert_eq!(ad.spec.interfaces, ["eth0"]);
    assert!(validate(&[pool], &[ad]).errors.is_empty());
}

#[test]
fn convert_metallb_refuses_bgp_with_exit_65_and_says_where() {
    let out = convert("metallb/metallb-bgp.json");
    assert_eq!(out.status.code(), Some(65), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty(), "nothing to apply on a refusal");
    let stderr = text(&out.stderr);
    assert!(
        stderr
            .contains("BGPAdvertisement metallb-system/upstream: swimlb announces in layer 2 only"),
        "{stderr}"
    );
    let page = read(&repo().join("docs/src/switching/metallb.md"));
    assert!(
        page.contains(stderr.trim_end()),
        "the MetalLB page shows the refusal:\n{stderr}"
    );
}

#[test]
fn the_trial_overlay_gives_both_components_the_class_and_the_speakers_other_ports() {
    if !on_path("kubectl") {
        eprintln!("skipped: no kubectl on the PATH (test.sh installs it)");
        return;
    }
    let mut command = Command::new("kubectl");
    command
        .arg("kustomize")
        .arg(examples().join("kubernetes/trial"));
    let out = run(command);
    assert!(
        out.status.success(),
        "kubectl kustomize: {}",
        text(&out.stderr)
    );
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text(&out.stdout)).expect("YAML");
    let find = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
            .clone()
    };
    let speakers: DaemonSet = serde_json::from_value(find("DaemonSet")).expect("DaemonSet");
    let controller: Deployment = serde_json::from_value(find("Deployment")).expect("Deployment");
    let container = |template: k8s_openapi::api::core::v1::PodTemplateSpec| {
        template.spec.expect("pod spec").containers[0].clone()
    };
    let speaker = container(speakers.spec.template);
    let args = speaker.args.clone().unwrap_or_default();
    assert!(
        args.contains(&"--load-balancer-class=swimlb.io/l2".to_string()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--bind=$(POD_IP):7956".to_string()),
        "{args:?}"
    );
    let ports: Vec<(i32, String)> = speaker
        .ports
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.container_port, p.protocol.unwrap_or_default()))
        .collect();
    assert!(
        ports.contains(&(7956, "UDP".into())) && ports.contains(&(7957, "UDP".into())),
        "{ports:?}"
    );
    assert!(
        !ports.iter().any(|(p, _)| *p == 7946 || *p == 7947),
        "{ports:?}"
    );
    let controller = container(controller.spec.template);
    let args = controller.args.unwrap_or_default();
    assert!(
        args.contains(&"--load-balancer-class=swimlb.io/l2".to_string()),
        "{args:?}"
    );
}

fn unit() -> String {
    read(&repo().join("deploy/standalone/swimlb-speaker.service"))
}

#[test]
fn the_systemd_unit_keeps_two_capabilities_reloads_with_sighup_and_leaves_proc_sys_writable() {
    let unit = unit();
    let lines: Vec<&str> = unit.lines().map(str::trim).collect();
    for line in [
        "ExecStartPre=/usr/bin/swimlb-speaker check-config /etc/swimlb/speaker.yaml",
        "ExecStart=/usr/bin/swimlb-speaker standalone --config /etc/swimlb/speaker.yaml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "RestartPreventExitStatus=64",
        "CapabilityBoundingSet=CAP_NET_RAW CAP_NET_ADMIN",
        "NoNewPrivileges=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK AF_PACKET",
    ] {
        assert!(lines.contains(&line), "the unit lacks {line:?}");
    }
    // The ARP sysctls are written under /proc/sys: nothing may make it read-only.
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("ProtectKernelTunables=yes")),
        "ProtectKernelTunables would stop the speaker from setting arp_ignore"
    );
    // The flags the unit passes are the speaker's.
    let out = run(lab(&["speaker", "standalone", "--help"]));
    assert!(
        text(&out.stdout).contains("--config <CONFIG>"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        on_path("systemd-analyze"),
        "systemd-analyze is not installed: test.sh installs it (Debian's `systemd`) as root"
    );
    let dir = scratch("unit");
    let runnable = unit.replace(
        "/usr/bin/swimlb-speaker",
        &format!("{} speaker", env!("CARGO_BIN_EXE_swimlb-lab")),
    );
    let path = dir.join("swimlb-speaker.service");
    std::fs::write(&path, runnable).expect("unit copy");
    let mut command = Command::new("systemd-analyze");
    command.arg("verify").arg(&path);
    let out = run(command);
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}",
        text(&out.stderr)
    );
}

#[test]
fn the_nftables_example_loads() {
    if !swimlb_e2e::netns::is_root() || !on_path("nft") {
        eprintln!("skipped: `nft -c` needs root and nft (test.sh installs nftables as root)");
        return;
    }
    let mut command = Command::new("nft");
    command
        .arg("-c")
        .arg("-f")
        .arg(repo().join("deploy/standalone/swimlb.nft"));
    let out = run(command);
    assert!(out.status.success(), "nft -c: {}", text(&out.stderr));
}

/// A network namespace of this test, deleted on drop.
struct Netns(String);

impl Netns {
    fn new() -> Self {
        let name = format!("swdoc{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(Stdio::null())
            .status();
        let this = Netns(name);
        for args in [
            vec!["netns", "add", &this.0],
            vec![
                "-n", &this.0, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0",
            ],
            vec!["-n", &this.0, "addr", "add", "192.0.2.10/24", "dev", "eth0"],
            vec!["-n", &this.0, "link", "set", "eth0", "up"],
            vec!["-n", &this.0, "link", "set", "peer0", "up"],
            vec!["-n", &this.0, "link", "set", "lo", "up"],
        ] {
            let status = Command::new("ip").args(&args).status().expect("ip");
            assert!(status.success(), "ip {args:?}");
        }
        this
    }

    fn exec(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.0, program]);
        command
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
#[ignore = "needs root: a network namespace, and a speaker run under setpriv"]
fn the_speaker_runs_with_the_units_two_capabilities_alone() {
    let netns = Netns::new();
    let dir = scratch("capabilities");
    let keys = key_file(&dir);
    let config = dir.join("speaker.yaml");
    std::fs::write(
        &config,
        format!(
            "cluster: edge-1\nnode: master-0\nbind: 192.0.2.10:7946\nkeyFile: {}\n\
             listen: 127.0.0.1:7572\ngroups:\n  - name: api\n    addresses: [192.0.2.100]\n    \
             interface: eth0\n",
            keys.display()
        ),
    )
    .expect("config");
    let mut speaker = netns.exec("setpriv");
    speaker
        .args([
            "--bounding-set",
            "-all,+net_raw,+net_admin",
            "--inh-caps",
            "-all",
            "--no-new-privs",
        ])
        .arg(env!("CARGO_BIN_EXE_swimlb-lab"))
        .args(["speaker", "standalone", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = speaker.spawn().expect("speaker");
    // Up to 15 s: 75 looks, 200 ms apart.
    let mut owner = false;
    for _ in 0..75 {
        let mut status = netns.exec(env!("CARGO_BIN_EXE_swimlb-lab"));
        status.args(["speaker", "status", "127.0.0.1:7572"]);
        let table = text(&run(status).stdout);
        owner = table
            .lines()
            .any(|l| l.starts_with("192.0.2.100") && l.contains(" owner"));
        if owner || child.try_wait().expect("wait").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(term.success(), "kill -TERM the speaker");
    let out = child.wait_with_output().expect("speaker exit");
    let log = text(&out.stderr);
    assert!(
        owner,
        "the speaker never owned 192.0.2.100 with NET_RAW and NET_ADMIN alone:\n{log}"
    );
    assert!(
        out.status.success(),
        "the speaker did not stop cleanly:\n{log}"
    );
    let link = run({
        let mut c = Command::new("ip");
        c.args(["-n", &netns.0, "link", "show", "swimlb0"]);
        c
    });
    assert!(!link.status.success(), "swimlb0 is left after a clean stop");
}

#[test]
fn the_keepalived_example_is_one_keepalived_accepts() {
    if !on_path("keepalived") {
        eprintln!("skipped: keepalived is not installed (test.sh installs it as root)");
        return;
    }
    let dir = scratch("keepalived");
    // The scripts the file names, as the host of the example has them.
    let conf = read(&examples().join("keepalived/keepalived.conf"))
        .replace("/etc/keepalived/check_apiserver.sh", "/bin/true")
        .replace("/etc/keepalived/notify.sh", "/bin/true");
    let path = dir.join("keepalived.conf");
    std::fs::write(&path, conf).expect("keepalived.conf copy");
    let log = dir.join("config-test.log");
    let mut command = Command::new("keepalived");
    command
        .arg(format!("--config-test={}", log.display()))
        .arg("-f")
        .arg(&path);
    let out = run(command);
    assert!(
        out.status.success(),
        "keepalived --config-test: {}{}",
        std::fs::read_to_string(&log).unwrap_or_default(),
        text(&out.stderr)
    );
}

/// The README's standalone quick start: its configuration block passes `check-config`.
#[test]
fn the_readmes_standalone_file_passes_check_config() {
    let readme = read(&repo().join("README.md"));
    let blocks: Vec<String> = readme
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next().map(str::to_string))
        .filter(|block| block.contains("cluster:"))
        .collect();
    assert_eq!(
        blocks.len(),
        1,
        "the README's quick start has one standalone file"
    );
    let dir = scratch("readme");
    let keys = key_file(&dir);
    let file = dir.join("readme.yaml");
    std::fs::write(&file, &blocks[0]).expect("the README's file");
    let keyed = dir.join("keyed");
    std::fs::create_dir_all(&keyed).expect("keyed folder");
    let copy = with_key(&file, &keys, &keyed);
    let out = check_config(&copy);
    assert!(
        out.status.success(),
        "check-config refused the README's file:\n{}",
        text(&out.stderr)
    );
}
