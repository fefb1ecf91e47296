//! The manifests of `deploy/` (issue 14), checked with the tools operators and CI pipelines use:
//!
//! - `deploy/swimlb.yaml` is its sources put together, and `prometheusrule.yaml` is
//!   `rules.yaml` wrapped in a `PrometheusRule` (`SWIMLB_REGENERATE=1` rewrites both);
//! - every manifest passes `kubernetes-validate --strict` for the Kubernetes version k8s-openapi
//!   targets (custom resources are skipped by API group, with the reason);
//! - `checkov` fails no check, every skip written next to a manifest gives a reason, and every
//!   skip is needed (without the skips, exactly the skipped checks fail);
//! - the manifests agree with the binaries: the speaker Pods' labels match the speaker's default
//!   peer selector, the ports are the binaries' defaults, the grace periods outlast the drain
//!   deadlines, the key file is where the Secret is mounted;
//! - real `kubectl apply --server-side -f deploy/swimlb.yaml` against the fake API server stores
//!   every object, and a second apply changes nothing (the store's resourceVersion stays);
//! - the real controller, run against the fake API server through a scenario (assign, invalid
//!   pool, release, SIGTERM), makes no request its RBAC in swimlb.yaml refuses (a small RBAC
//!   evaluator over the fake server's request log; a server-side apply that creates needs
//!   `create` too). Its run uses every rule but the Events' `patch` (an Event series). The
//!   speaker's RBAC is checked by the same evaluator (`swimlb_e2e::rbac`) on the requests its
//!   code makes (listed by hand from speaker/src/kubernetes/); a run needs root and a network
//!   namespace lab: the apply lab (`e2e/tests/apply_lab.rs`) audits every request of the real
//!   speakers and controller there.
//!
//! Needs kubernetes-validate, checkov and kubectl (test.sh installs them), not root. A missing
//! tool fails.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use swimlb_e2e::manifest_tools::{self, Finding};
use swimlb_e2e::rbac::{Attributes, Grants, attributes};
use swimlb_e2e::{kubectl, manifests};

/// The Kubernetes version the manifests are validated against: the one k8s-openapi's `latest`
/// feature builds the binaries for (checked by
/// `the_validated_version_is_the_one_k8s_openapi_targets`). kubernetes-validate 1.37.0 ships its
/// schemas.
const KUBERNETES_VERSION: &str = "1.37.0";

/// API groups whose objects have no upstream schema, with the reason.
const SKIPPED_GROUPS: &[(&str, &str)] = &[
    (
        "swimlb.io",
        "custom resources of swimlb's own CRDs (their schemas are in deploy/crds.yaml, generated \
         from the Rust types and golden-tested)",
    ),
    (
        "monitoring.coreos.com",
        "Prometheus Operator custom resources (PodMonitor, PrometheusRule): not part of Kubernetes",
    ),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository")
}

/// Every `.yaml` file under `dir`, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The documents of a YAML stream as text, split at `---` lines (comment-only ones dropped).
fn documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line == "---" {
            docs.push(String::new());
        } else if let Some(doc) = docs.last_mut() {
            doc.push_str(line);
            doc.push('\n');
        }
    }
    docs.into_iter()
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .collect()
}

fn parse(text: &str, origin: &Path) -> Value {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("parsing {}: {e}", origin.display()))
}

/// The objects of `deploy/swimlb.yaml`.
fn install_objects() -> Vec<Value> {
    let path = repo().join(manifests::INSTALL);
    let text = std::fs::read_to_string(&path).expect("deploy/swimlb.yaml");
    documents(&text).iter().map(|d| parse(d, &path)).collect()
}

fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/swimlb.yaml"))
}

#[test]
fn swimlb_yaml_and_the_prometheus_rule_are_generated_from_their_sources() {
    let repo = repo();
    let install = manifests::install_from(&repo).unwrap_or_else(|e| panic!("{e:#}"));
    manifests::check_generated(&repo, manifests::INSTALL, &install)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let rule = manifests::prometheus_rule_from(&repo).unwrap_or_else(|e| panic!("{e:#}"));
    manifests::check_generated(&repo, manifests::PROMETHEUS_RULE, &rule)
        .unwrap_or_else(|e| panic!("{e:#}"));

    // The same rules, read by a YAML parser: the indentation kept every block scalar.
    let rules_path = repo.join(manifests::RULES);
    let rules = parse(
        &manifests::read(&repo, manifests::RULES).unwrap(),
        &rules_path,
    );
    let wrapped = parse(&rule, &repo.join(manifests::PROMETHEUS_RULE));
    assert_eq!(wrapped["spec"], rules);
    assert_eq!(wrapped["kind"], "PrometheusRule");
}

#[test]
fn the_validated_version_is_the_one_k8s_openapi_targets() {
    // Assigned below only when k8s-openapi builds for 1.37.
    #[allow(unused_assignments)]
    let mut targeted = None;
    k8s_openapi::k8s_if_1_37! { targeted = Some("1.37.0"); }
    assert_eq!(
        targeted,
        Some(KUBERNETES_VERSION),
        "k8s-openapi's enabled version changed: validate the manifests against it"
    );
}

#[test]
fn every_manifest_passes_kubernetes_validate_strict() {
    let repo = repo();
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("deploy-validate");
    let _ = std::fs::remove_dir_all(&out_dir);
    std::fs::create_dir_all(&out_dir).expect("a scratch directory");
    let mut files = Vec::new();
    let mut validated = 0;
    for path in yaml_files(&repo.join("deploy")) {
        let text = std::fs::read_to_string(&path).expect("readable");
        let mut kept = Vec::new();
        for doc in documents(&text) {
            let value = parse(&doc, &path);
            let (Some(api_version), Some(kind)) =
                (value["apiVersion"].as_str(), value["kind"].as_str())
            else {
                // rules.yaml and rules_test.yaml are Prometheus files, not Kubernetes objects.
                continue;
            };
            let group = api_version.split_once('/').map_or("", |(g, _)| g);
            if let Some((_, why)) = SKIPPED_GROUPS.iter().find(|(g, _)| *g == group) {
                eprintln!(
                    "skipped {kind} {} ({}): {why}",
                    value["metadata"]["name"].as_str().unwrap_or_default(),
                    path.display()
                );
                continue;
            }
            kept.push(doc);
        }
        if kept.is_empty() {
            continue;
        }
        validated += kept.len();
        let relative = path.strip_prefix(&repo).expect("under the repository");
        let copy = out_dir.join(relative.to_string_lossy().replace('/', "_"));
        std::fs::write(&copy, kept.join("---\n")).expect("a scratch file");
        files.push(copy);
    }
    // Every object of swimlb.yaml twice: there and in its sources.
    assert_eq!(validated, 2 * install_objects().len());
    let passed = manifest_tools::kubernetes_validate(KUBERNETES_VERSION, &files)
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(passed, validated);
}

#[test]
fn kubernetes_validate_rejects_an_unknown_field() {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("deploy-unknown-field.yaml");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\n  namespace: b\nautomount: true\n",
    )
    .expect("a scratch file");
    let error = manifest_tools::kubernetes_validate(KUBERNETES_VERSION, &[path])
        .expect_err("--strict refuses `automount`");
    assert!(format!("{error:#}").contains("automount"), "{error:#}");
}

fn key(f: &Finding) -> (String, String) {
    (f.check_id.clone(), f.resource.clone())
}

#[test]
fn checkov_fails_nothing_and_every_skip_is_justified_and_needed() {
    let repo = repo();
    let report = manifest_tools::checkov(&repo.join("deploy")).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        report.failed.is_empty(),
        "checkov failed checks on deploy/ (fix them, or skip one with a reason next to the \
         manifest: `checkov.io/skipN: CKV_K8S_xx=why`):\n{:#?}",
        report.failed
    );
    assert!(
        report.passed > 100,
        "checkov passed only {} checks",
        report.passed
    );
    for skip in &report.skipped {
        assert!(
            skip.reason.len() > 20,
            "the skip of {} on {} gives no reason",
            skip.check_id,
            skip.resource
        );
    }

    // Without the skips, exactly the skipped checks fail: no skip is left over.
    let bare = Path::new(env!("CARGO_TARGET_TMPDIR")).join("deploy-without-skips");
    let _ = std::fs::remove_dir_all(&bare);
    std::fs::create_dir_all(&bare).expect("a scratch directory");
    for path in yaml_files(&repo.join("deploy")) {
        let text = std::fs::read_to_string(&path).expect("readable");
        let relative = path.strip_prefix(&repo).expect("under the repository");
        std::fs::write(
            bare.join(relative.to_string_lossy().replace('/', "_")),
            manifest_tools::without_skips(&text),
        )
        .expect("a scratch file");
    }
    let unskipped = manifest_tools::checkov(&bare).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(unskipped.skipped.is_empty());
    let skipped: BTreeSet<_> = report.skipped.iter().map(key).collect();
    let failing: BTreeSet<_> = unskipped.failed.iter().map(key).collect();
    assert_eq!(
        skipped, failing,
        "the skips written next to the manifests and the checks that fail without them differ"
    );
    for (check, resource) in &skipped {
        eprintln!("skip {check} on {resource}");
    }
}

fn pod_spec<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    &object(objects, kind, name)["spec"]["template"]["spec"]
}

fn container<'a>(spec: &'a Value, name: &str) -> &'a Value {
    spec["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The default of the flag `id` of `swimlb-speaker kubernetes`.
fn speaker_default(id: &str) -> String {
    let command = <swimlb_speaker::kubernetes::cli::Args as clap::Args>::augment_args(
        clap::Command::new("swimlb-speaker"),
    );
    let arg = command
        .get_arguments()
        .find(|a| a.get_id() == id)
        .unwrap_or_else(|| panic!("no flag {id}"));
    arg.get_default_values()
        .first()
        .unwrap_or_else(|| panic!("{id} has no default"))
        .to_string_lossy()
        .into_owned()
}

#[test]
fn the_manifests_agree_with_the_binaries() {
    let objects = install_objects();
    let daemonset = object(&objects, "DaemonSet", "swimlb-speaker");
    let speaker_pod = pod_spec(&objects, "DaemonSet", "swimlb-speaker");
    let speaker = container(speaker_pod, "speaker");

    // The speaker Pods are the gossip peers: their labels match the default selector.
    let labels = &daemonset["spec"]["template"]["metadata"]["labels"];
    for pair in speaker_default("speaker_selector").split(',') {
        let (key, value) = pair.split_once('=').expect("key=value");
        assert_eq!(labels[key], value, "speaker Pod label {key}");
    }
    assert_eq!(
        daemonset["metadata"]["namespace"], "swimlb-system",
        "the speaker's default namespace"
    );

    // Ports: the HTTP listener and the gossip port the speaker uses by default.
    let listen: std::net::SocketAddr = speaker_default("listen").parse().expect("an address");
    let ports = speaker["ports"].as_array().expect("ports");
    let port = |name: &str| {
        ports
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("no port {name}"))
    };
    assert_eq!(port("metrics"), u64::from(listen.port()));
    assert_eq!(
        port("gossip"),
        u64::from(swimlb_speaker::kubernetes::cli::GOSSIP_PORT)
    );
    assert_eq!(speaker_pod["hostNetwork"], true);

    // Grace periods outlast the drains.
    let grace = |spec: &Value| spec["terminationGracePeriodSeconds"].as_u64().expect("set");
    assert!(grace(speaker_pod) > swimlb_speaker::engine::DRAIN_DEADLINE.as_secs());
    let controller_pod = pod_spec(&objects, "Deployment", "swimlb-controller");
    assert!(
        grace(controller_pod)
            > (swimlb_controller::run::DRAIN_DEADLINE + swimlb_controller::run::RELEASE_DEADLINE)
                .as_secs()
    );

    // The key file is the Secret's `keys`, mounted read-only, optional so the speaker waits.
    let env = |name: &str| {
        speaker["env"]
            .as_array()
            .and_then(|e| e.iter().find(|e| e["name"] == name))
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("no env {name}"))
            .to_string()
    };
    let key_file = env("SWIMLB_KEY_FILE");
    let volume = speaker_pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["secret"].is_object()))
        .expect("the Secret volume");
    assert_eq!(volume["secret"]["secretName"], "swimlb-gossip-key");
    assert_eq!(volume["secret"]["optional"], true);
    let mount = speaker["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == volume["name"]))
        .expect("the Secret is mounted");
    assert_eq!(mount["readOnly"], true);
    let item = &volume["secret"]["items"][0];
    assert_eq!(item["key"], "keys");
    assert_eq!(
        format!(
            "{}/{}",
            mount["mountPath"].as_str().unwrap(),
            item["path"].as_str().unwrap()
        ),
        key_file
    );

    // Capabilities: NET_RAW only, nothing privileged; both read-only and without a CPU limit.
    let security = &speaker["securityContext"];
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(
        security["capabilities"]["add"],
        serde_json::json!(["NET_RAW"])
    );
    assert_eq!(security["privileged"], false);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    let controller = container(controller_pod, "controller");
    for c in [speaker, controller] {
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert!(c["resources"]["requests"]["cpu"].is_string());
        assert!(c["resources"]["limits"]["cpu"].is_null(), "no CPU limit");
    }
    assert_eq!(controller_pod["securityContext"]["runAsNonRoot"], true);
}

/// `kubectl` from `PATH`, or a failure that says how to install it.
fn kubectl() -> PathBuf {
    kubectl::path().unwrap_or_else(|e| panic!("{e:#}"))
}

/// `kubectl apply --server-side -f deploy/swimlb.yaml` against `api`: its output, or a failure
/// with it and the server's last requests.
///
/// With the flags of [`kubectl::apply_flags`] (an old kubectl's client-side validation is
/// turned off: kubernetes-validate checks the same objects above).
async fn kubectl_apply(api: &swimlb_fake_api::FakeApi, cache: &Path) -> String {
    let minor = kubectl::minor(&kubectl()).unwrap_or_else(|e| panic!("{e:#}"));
    let old_validation = kubectl::apply_flags(minor);
    let out = tokio::process::Command::new(kubectl())
        .arg("--kubeconfig")
        .arg(api.kubeconfig_path())
        .arg("--cache-dir")
        .arg(cache)
        .args(["apply", "--server-side"])
        .args(old_validation)
        .arg("-f")
        .arg(repo().join(manifests::INSTALL))
        .output()
        .await
        .expect("kubectl runs");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        let requests: Vec<String> = api
            .requests()
            .iter()
            .rev()
            .take(10)
            .rev()
            .map(|r| format!("{} {} -> {}", r.method, r.path, r.code))
            .collect();
        panic!(
            "kubectl apply --server-side -f deploy/swimlb.yaml ({}):\n{report}\nthe fake API \
             server's last requests:\n{}",
            out.status,
            requests.join("\n")
        );
    }
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_swimlb_yaml_to_the_fake_api_server_and_a_second_apply_changes_nothing() {
    let api = swimlb_fake_api::FakeApi::start()
        .await
        .expect("the fake API server");
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("deploy-kubectl-cache");
    let _ = std::fs::remove_dir_all(&cache);

    let empty = api.resource_version();
    let first = kubectl_apply(&api, &cache).await;
    assert!(api.resource_version() > empty);
    let objects = install_objects();
    assert_eq!(
        first
            .lines()
            .filter(|l| l.ends_with(" serverside-applied"))
            .count(),
        objects.len(),
        "one line per object:\n{first}"
    );
    for o in &objects {
        let kind = o["kind"].as_str().expect("a kind");
        let api_version = o["apiVersion"].as_str().expect("an apiVersion");
        let index = swimlb_fake_api::resources::find_kind(api_version, kind)
            .unwrap_or_else(|| panic!("the fake API server does not serve {api_version} {kind}"));
        let resource = swimlb_fake_api::resources::RESOURCES[index].qualified_name();
        let stored = api.objects(&resource).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(
            stored
                .iter()
                .any(|s| s["metadata"]["name"] == o["metadata"]["name"]),
            "{kind} {} was not stored",
            o["metadata"]["name"]
        );
    }

    let before = api.resource_version();
    let second = kubectl_apply(&api, &cache).await;
    // Server-side apply: every object PATCHed twice, created (201) the first time.
    let patches = |code: u16| {
        api.requests()
            .iter()
            .filter(|r| r.method == "PATCH" && r.code == code)
            .count()
    };
    assert_eq!((patches(201), patches(200)), (objects.len(), objects.len()));
    assert_eq!(
        api.resource_version(),
        before,
        "the second apply changed objects:\n{second}"
    );
    api.shutdown().await;
}

/// What RBAC in deploy/swimlb.yaml grants the service account `swimlb-system/account`.
fn grants(objects: &[Value], account: &str) -> Grants {
    Grants::of(objects, "swimlb-system", account).unwrap_or_else(|e| panic!("{e:#}"))
}

fn allowed(grants: &Grants, a: &Attributes) -> bool {
    grants.allows(a)
}

#[test]
fn the_rbac_evaluation_matches_names_namespaces_and_the_create_of_an_apply() {
    let objects = install_objects();
    let controller = grants(&objects, "swimlb-controller");
    let request = |method: &str, path: &str, code: u16| swimlb_fake_api::RequestRecord {
        user: String::new(),
        method: method.into(),
        path: path.into(),
        watch: false,
        code,
    };
    let ok =
        |r: swimlb_fake_api::RequestRecord| attributes(&r).iter().all(|a| allowed(&controller, a));
    let lease = "/apis/coordination.k8s.io/v1/namespaces/swimlb-system/leases";
    assert!(ok(request(
        "GET",
        &format!("{lease}/swimlb-controller"),
        404
    )));
    assert!(!ok(request("GET", &format!("{lease}/other"), 404)));
    assert!(ok(request("POST", lease, 201)));
    assert!(!ok(request(
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases",
        201
    )));
    assert!(ok(request(
        "PATCH",
        "/api/v1/namespaces/web/services/a/status",
        200
    )));
    assert!(!ok(request(
        "PATCH",
        "/api/v1/namespaces/web/services/a",
        200
    )));
    // The speaker's server-side apply of a new record needs `create`; it has it in its namespace.
    let speaker = grants(&objects, "swimlb-speaker");
    let record = "/apis/swimlb.io/v1beta1/namespaces/swimlb-system/servicel2statuses/l2-1";
    let r = request("PATCH", record, 201);
    assert!(attributes(&r).iter().all(|a| allowed(&speaker, a)));
    let elsewhere = request("PATCH", &record.replace("swimlb-system", "default"), 201);
    assert!(!attributes(&elsewhere).iter().all(|a| allowed(&speaker, a)));
    assert!(!attributes(&r).iter().all(|a| allowed(&controller, a)));
}

#[test]
fn the_speakers_rbac_allows_the_requests_its_code_makes_and_no_more() {
    let speaker = grants(&install_objects(), "swimlb-speaker");
    let request = |method: &str, path: &str, watch: bool, code: u16| {
        attributes(&swimlb_fake_api::RequestRecord {
            user: String::new(),
            method: method.into(),
            path: path.into(),
            watch,
            code,
        })
    };
    let ns = "/apis/swimlb.io/v1beta1/namespaces/swimlb-system";
    let record = format!("{ns}/servicel2statuses/l2-0123456789abcdef0123");
    // speaker/src/kubernetes/run.rs (the reflectors: list, then watch) and records.rs.
    let mut made = Vec::new();
    for path in [
        "/api/v1/services",
        "/apis/discovery.k8s.io/v1/endpointslices",
        "/api/v1/nodes",
        &format!("{ns}/ipaddresspools"),
        &format!("{ns}/l2advertisements"),
        "/api/v1/namespaces/swimlb-system/pods",
        // The records' own watch (a record overwritten behind its owner's back is rewritten).
        &format!("{ns}/servicel2statuses"),
    ] {
        made.extend(request("GET", path, false, 200));
        made.extend(request("GET", path, true, 200));
    }
    made.extend(request("PATCH", &record, false, 201));
    made.extend(request("PATCH", &format!("{record}/status"), false, 200));
    made.extend(request("DELETE", &record, false, 200));
    // The nodeAssigned Event on a Service, in the Service's namespace.
    made.extend(request(
        "POST",
        "/apis/events.k8s.io/v1/namespaces/web/events",
        false,
        201,
    ));
    made.extend(request(
        "PATCH",
        "/apis/events.k8s.io/v1/namespaces/web/events/e.1",
        false,
        200,
    ));
    let refused: Vec<_> = made.iter().filter(|a| !allowed(&speaker, a)).collect();
    assert!(refused.is_empty(), "refused: {refused:#?}");

    // Nothing beyond: no Pod elsewhere, no write to Services, no record elsewhere.
    let elsewhere = "/apis/swimlb.io/v1beta1/namespaces/default/servicel2statuses";
    for (method, path, watch) in [
        ("GET", "/api/v1/namespaces/default/pods", true),
        ("PATCH", "/api/v1/namespaces/web/services/a/status", false),
        (
            "PATCH",
            "/apis/swimlb.io/v1beta1/namespaces/default/servicel2statuses/l2-0",
            false,
        ),
        ("PATCH", &format!("{ns}/ipaddresspools/lab/status"), false),
        ("GET", elsewhere, true),
    ] {
        let attributes = request(method, path, watch, 200);
        assert!(!attributes.is_empty(), "{path} is no resource");
        for a in attributes {
            assert!(!allowed(&speaker, &a), "allowed: {a:?}");
        }
    }
}

/// Waits until `check` holds, for at most 30 s.
async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_of_the_real_controller_is_allowed_by_its_rbac() {
    use serde_json::json;
    let api = swimlb_fake_api::FakeApi::start()
        .await
        .expect("the fake API server");
    let client = api.client().await.expect("a client");
    api.create(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "swimlb-system"}}),
    )
    .expect("the namespace");
    api.create(json!({
        "apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"name": "lab", "namespace": "swimlb-system"},
        "spec": {"addresses": ["192.0.2.8/29"]},
    }))
    .expect("a pool");
    api.create(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
    }))
    .expect("a Service");

    // As deployed: the Lease in swimlb-system, its requests under the service account's name.
    let kubeconfig = api
        .kubeconfig_for_user("swimlb-controller")
        .expect("a kubeconfig");
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let mut controller = tokio::process::Command::new(env!("CARGO_BIN_EXE_swimlb-lab"))
        .arg("controller")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--lease-namespace", "swimlb-system", "--identity", "c-0"])
        .arg(format!("--listen={listen}"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the controller starts");

    let assigned = |api: &swimlb_fake_api::FakeApi| {
        api.objects("services").unwrap_or_default().iter().any(|s| {
            s["metadata"]["name"] == "web" && s["status"]["loadBalancer"]["ingress"].is_array()
        })
    };
    wait_for("the Service's address", || assigned(&api)).await;
    // An invalid pool: a Warning Event on it, a Valid=False status.
    api.create(json!({
        "apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"name": "bad", "namespace": "swimlb-system"},
        "spec": {"addresses": ["nonsense"]},
    }))
    .expect("a bad pool");
    wait_for("the InvalidConfiguration Event", || {
        api.objects("events.events.k8s.io")
            .unwrap_or_default()
            .iter()
            .any(|e| e["reason"] == "InvalidConfiguration")
    })
    .await;
    // A deleted Service releases its address: the pool's status counts it.
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client, "default");
    services
        .delete("web", &Default::default())
        .await
        .expect("deleted");
    wait_for("the pool status to count nothing assigned", || {
        api.objects("ipaddresspools.swimlb.io")
            .unwrap_or_default()
            .iter()
            .any(|p| p["metadata"]["name"] == "lab" && p["status"]["assignedIPv4"] == 0)
    })
    .await;
    // SIGTERM: drain and release the Lease.
    let pid = controller.id().expect("running").to_string();
    let killed = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill runs");
    assert!(killed.success());
    let exit = tokio::time::timeout(std::time::Duration::from_secs(30), controller.wait())
        .await
        .expect("the controller exits")
        .expect("wait");
    assert_eq!(exit.code(), Some(0));

    let grants = grants(&install_objects(), "swimlb-controller");
    let mut used = BTreeSet::new();
    let mut denied = BTreeSet::new();
    for r in api
        .requests()
        .iter()
        .filter(|r| r.user == "swimlb-controller")
    {
        for a in attributes(r) {
            if allowed(&grants, &a) {
                used.insert((a.verb, a.group.clone(), a.resource.clone()));
            } else {
                denied.insert(a);
            }
        }
    }
    assert!(
        denied.is_empty(),
        "the controller's RBAC in deploy/swimlb.yaml refuses:\n{denied:#?}"
    );
    for (verb, group, resource) in &used {
        eprintln!("used: {verb} {group}/{resource}");
    }
    for needed in [
        ("watch", "", "services"),
        ("patch", "", "services/status"),
        ("patch", "swimlb.io", "ipaddresspools/status"),
        ("create", "events.k8s.io", "events"),
        ("create", "coordination.k8s.io", "leases"),
        ("patch", "coordination.k8s.io", "leases"),
    ] {
        assert!(
            used.contains(&(needed.0, needed.1.to_string(), needed.2.to_string())),
            "the run never did {needed:?}: {used:#?}"
        );
    }
    api.shutdown().await;
}
