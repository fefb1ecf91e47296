//! The manifests of `deploy/` (issue 14), checked with the tools operators and CI pipelines use:
//!
//! - `deploy/swimlb.yaml` is its sources put together, `prometheusrule.yaml` is `rules.yaml`
//!   wrapped in a `PrometheusRule`, and the Helm chart's `crds/crds.yaml` is `deploy/crds.yaml`
//!   (`SWIMLB_REGENERATE=1` rewrites all three; the chart's templates and the kustomization are
//!   checked in `e2e/tests/helm.rs`);
//! - every manifest passes `kubernetes-validate --strict` for the Kubernetes version k8s-openapi
//!   targets (custom resources are skipped by API group, with the reason);
//! - `checkov` fails no check, every skip written next to a manifest gives a reason, and every
//!   skip is needed (without the skips, exactly the skipped checks fail);
//! - the manifests agree with the binaries: the speaker Pods' labels match the speaker's default
//!   peer selector, the ports are the binaries' defaults, the grace periods outlast the drain
//!   deadlines, the key file is where the Secret is mounted;
//! - the pinned `kubectl apply --server-side -f deploy/swimlb.yaml` against the real control
//!   plane (`swimlb_control_plane`, on the loopback) stores every object, and a second apply
//!   changes nothing (no generation moves);
//! - the RBAC it applied, asked by SubjectAccessReview (the API server's own authorizer),
//!   allows the requests the speaker's code makes (listed by hand from speaker/src/kubernetes/)
//!   and refuses what neither component needs;
//! - `kubectl auth can-i --list` for each ServiceAccount, on the real API server, is the list
//!   committed in `deploy/rbac/` (`SWIMLB_REGENERATE=1` rewrites them), so a new grant is a
//!   visible change;
//! - the real controller, run with its ServiceAccount's token through a scenario (assign,
//!   invalid pool, release, SIGTERM), is refused nothing: no 403 in the audit log. The real node
//!   test (`e2e/tests/real_node/`) audits every request of the real speakers there.
//!
//! Needs kubernetes-validate, checkov, kubectl (test.sh installs them) and the pinned control
//! plane (`e2e/k8s/build.sh`), not root. A missing tool fails.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use swimlb_control_plane::control_plane::Options;
use swimlb_control_plane::kubectl::Source;
use swimlb_control_plane::test_plane::TestPlane;
use swimlb_e2e::manifest_tools::{self, Finding};
use swimlb_e2e::manifests;

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
    (
        "kustomize.config.k8s.io",
        "kustomize's own file, not an object of the API (e2e/tests/helm.rs checks that \
         `kubectl kustomize deploy/` builds deploy/swimlb.yaml)",
    ),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository")
}

/// Every `.yaml` file under `dir`, sorted, but those of the Helm chart: its templates are YAML
/// only once rendered, and their rendering is `deploy/swimlb.yaml`, checked here
/// (`e2e/tests/helm.rs` compares them object by object).
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let chart = repo().join(manifests::CHART);
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path == chart {
                continue;
            }
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
fn the_charts_crds_are_generated_from_deploy_crds() {
    let repo = repo();
    let crds = manifests::chart_crds_from(&repo).unwrap_or_else(|e| panic!("{e:#}"));
    manifests::check_generated(&repo, manifests::CHART_CRDS, &crds)
        .unwrap_or_else(|e| panic!("{e:#}"));
    // The same objects, read by a YAML parser.
    let parsed = |text: &str, origin: &str| -> Vec<Value> {
        documents(text)
            .iter()
            .map(|d| parse(d, Path::new(origin)))
            .collect()
    };
    let source = parsed(
        &manifests::read(&repo, manifests::CRDS).unwrap(),
        manifests::CRDS,
    );
    assert!(!source.is_empty());
    assert_eq!(parsed(&crds, manifests::CHART_CRDS), source);
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
    let command = <swimlb_speaker::sources::kubernetes::cli::Args as clap::Args>::augment_args(
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
        u64::from(swimlb_speaker::sources::kubernetes::cli::GOSSIP_PORT)
    );
    assert_eq!(speaker_pod["hostNetwork"], true);

    // Grace periods outlast the drains.
    let grace = |spec: &Value| spec["terminationGracePeriodSeconds"].as_u64().expect("set");
    assert!(grace(speaker_pod) > swimlb_speaker::model::engine::DRAIN_DEADLINE.as_secs());
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

    // Listen addresses: each process's own address from the downward API (the node's for the
    // host-network speaker), given whole to --listen (an IPv6 address takes the default port).
    for (c, var, field) in [
        (speaker, "SWIMLB_LISTEN", "status.hostIP"),
        (controller, "POD_IP", "status.podIP"),
    ] {
        let from = c["env"]
            .as_array()
            .and_then(|e| e.iter().find(|e| e["name"] == var))
            .map(|e| &e["valueFrom"]["fieldRef"]["fieldPath"]);
        assert_eq!(from, Some(&Value::from(field)), "{var}");
        let args = c["args"].as_array().expect("args");
        assert!(
            args.contains(&Value::from(format!("--listen=$({var})"))),
            "--listen=$({var}) in {args:?}"
        );
    }
}

/// A control plane with deploy/swimlb.yaml applied by the pinned kubectl (server-side), and
/// kubectl's output.
fn installed(test: &str) -> (TestPlane, String) {
    let plane = TestPlane::start(test, &Options::default())
        .unwrap_or_else(|e| panic!("starting the control plane: {e:#}"));
    let out = apply_install(&plane);
    (plane, out)
}

/// `kubectl apply --server-side -f deploy/swimlb.yaml` as the administrator; its output.
fn apply_install(plane: &TestPlane) -> String {
    plane
        .kubectl()
        .apply(Source::File(&repo().join(manifests::INSTALL)))
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// What the second apply may not change: the generation of an object that has one, else its
/// resourceVersion (a controller's status writes move the latter).
fn versions(plane: &TestPlane, objects: &[Value]) -> Vec<(String, Value)> {
    objects
        .iter()
        .map(|o| {
            let name = o["metadata"]["name"].as_str().expect("a name");
            let stored = plane
                .admin()
                .get(
                    o["apiVersion"].as_str().expect("an apiVersion"),
                    o["kind"].as_str().expect("a kind"),
                    o["metadata"]["namespace"].as_str(),
                    name,
                )
                .unwrap_or_else(|e| panic!("{e:#}"))
                .unwrap_or_else(|| panic!("{} {name} was not stored", o["kind"]));
            let meta = &stored["metadata"];
            let version = if meta["generation"].is_null() {
                meta["resourceVersion"].clone()
            } else {
                meta["generation"].clone()
            };
            (format!("{} {name}", o["kind"]), version)
        })
        .collect()
}

#[test]
fn kubectl_applies_swimlb_yaml_to_the_real_api_server_and_a_second_apply_changes_nothing() {
    let (plane, first) = installed("apply-twice");
    let objects = install_objects();
    assert_eq!(
        first
            .lines()
            .filter(|l| l.ends_with(" serverside-applied"))
            .count(),
        objects.len(),
        "one line per object:\n{first}"
    );
    let before = versions(&plane, &objects);
    let second = apply_install(&plane);
    assert_eq!(
        versions(&plane, &objects),
        before,
        "the second apply changed objects:\n{second}"
    );
    // Server-side apply: every object PATCHed twice, created (201) the first time.
    let patches = |code: u16| {
        plane
            .requests()
            .iter()
            .filter(|r| r.user == "admin" && r.verb == "patch" && r.code == code)
            .count()
    };
    assert_eq!((patches(201), patches(200)), (objects.len(), objects.len()));
}

/// One request as RBAC sees it: verb, API group, resource (with `/subresource`), namespace
/// (empty: cluster-scoped or every namespace) and name (empty: a collection).
type Request<'a> = (&'a str, &'a str, &'a str, &'a str, &'a str);

/// Whether the API server's authorizer lets ServiceAccount `swimlb-system/account` make
/// `request` (a SubjectAccessReview, evaluated by the real RBAC of what was applied).
fn allowed(plane: &TestPlane, account: &str, request: Request<'_>) -> bool {
    let (verb, group, resource, namespace, name) = request;
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    let review = serde_json::json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {
            "user": format!("system:serviceaccount:swimlb-system:{account}"),
            "groups": ["system:serviceaccounts", "system:serviceaccounts:swimlb-system",
                "system:authenticated"],
            "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                "subresource": subresource, "namespace": namespace, "name": name},
        },
    });
    let answer = plane
        .admin()
        .raw_post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            &review,
        )
        .unwrap_or_else(|e| panic!("SubjectAccessReview: {e:#}"));
    answer["status"]["allowed"] == true
}

#[test]
fn the_rbac_of_swimlb_yaml_allows_what_the_code_does_and_no_more() {
    let (plane, _) = installed("rbac");
    let records = "servicel2statuses";
    let record = "l2-0123456789abcdef0123";
    // speaker/src/kubernetes/run.rs (the reflectors: list, then watch) and records.rs.
    let mut speaker: Vec<Request<'_>> = Vec::new();
    for (group, resource, namespace) in [
        ("", "services", ""),
        ("discovery.k8s.io", "endpointslices", ""),
        ("", "nodes", ""),
        ("swimlb.io", "ipaddresspools", "swimlb-system"),
        ("swimlb.io", "l2advertisements", "swimlb-system"),
        ("", "pods", "swimlb-system"),
        // The records' own watch (a record overwritten behind its owner's back is rewritten).
        ("swimlb.io", records, "swimlb-system"),
    ] {
        speaker.push(("list", group, resource, namespace, ""));
        speaker.push(("watch", group, resource, namespace, ""));
    }
    // A server-side apply that creates needs `create` as well as `patch`.
    let status = format!("{records}/status");
    for request in [
        ("create", "swimlb.io", records, "swimlb-system", record),
        ("patch", "swimlb.io", records, "swimlb-system", record),
        ("patch", "swimlb.io", &status, "swimlb-system", record),
        ("delete", "swimlb.io", records, "swimlb-system", record),
        // The nodeAssigned Event on a Service, in the Service's namespace (never a series).
        ("create", "events.k8s.io", "events", "web", ""),
    ] {
        speaker.push(request);
    }
    let refused: Vec<_> = speaker
        .iter()
        .filter(|r| !allowed(&plane, "swimlb-speaker", **r))
        .collect();
    assert!(refused.is_empty(), "the speaker is refused: {refused:#?}");
    // Nothing beyond: no Pod elsewhere, no write to Services, no record elsewhere.
    for request in [
        ("watch", "", "pods", "default", ""),
        ("patch", "", "services/status", "web", "a"),
        ("patch", "swimlb.io", records, "default", "l2-0"),
        (
            "patch",
            "swimlb.io",
            "ipaddresspools/status",
            "swimlb-system",
            "lab",
        ),
        ("watch", "swimlb.io", records, "default", ""),
        ("get", "", "secrets", "swimlb-system", "swimlb-memberlist"),
        ("patch", "events.k8s.io", "events", "web", "e.1"),
    ] {
        assert!(
            !allowed(&plane, "swimlb-speaker", request),
            "the speaker may {request:?}"
        );
    }
    // The controller (controller/src/run.rs, reconcile.rs, stray_pools.rs, gossip_key.rs): its
    // Lease by name, Services' status, not their spec, no records; the metadata of the pools of
    // every namespace (to report those outside swimlb-system), the advertisements and the pools'
    // status in swimlb-system only; the gossip key created, never read.
    for request in [
        (
            "get",
            "coordination.k8s.io",
            "leases",
            "swimlb-system",
            "swimlb-controller",
        ),
        ("list", "swimlb.io", "ipaddresspools", "", ""),
        ("watch", "swimlb.io", "ipaddresspools", "", ""),
        ("list", "swimlb.io", "ipaddresspools", "swimlb-system", ""),
        ("watch", "swimlb.io", "ipaddresspools", "swimlb-system", ""),
        ("list", "swimlb.io", "l2advertisements", "swimlb-system", ""),
        (
            "watch",
            "swimlb.io",
            "l2advertisements",
            "swimlb-system",
            "",
        ),
        (
            "patch",
            "swimlb.io",
            "ipaddresspools/status",
            "swimlb-system",
            "lab",
        ),
        ("create", "", "secrets", "swimlb-system", ""),
        // The IgnoredOutsideNamespace Event on a pool elsewhere, and a series (kube's Recorder).
        ("create", "events.k8s.io", "events", "team-a", ""),
        ("patch", "events.k8s.io", "events", "team-a", "e.1"),
    ] {
        assert!(
            allowed(&plane, "swimlb-controller", request),
            "the controller may not {request:?}"
        );
    }
    for request in [
        ("get", "", "secrets", "swimlb-system", "swimlb-gossip-key"),
        ("list", "", "secrets", "swimlb-system", ""),
        ("list", "swimlb.io", "l2advertisements", "", ""),
        ("watch", "swimlb.io", "l2advertisements", "team-a", ""),
        (
            "patch",
            "swimlb.io",
            "ipaddresspools/status",
            "team-a",
            "lab",
        ),
        (
            "get",
            "coordination.k8s.io",
            "leases",
            "swimlb-system",
            "other",
        ),
        ("create", "coordination.k8s.io", "leases", "default", ""),
        ("patch", "", "services", "web", "a"),
        ("patch", "swimlb.io", records, "swimlb-system", record),
    ] {
        assert!(
            !allowed(&plane, "swimlb-controller", request),
            "the controller may {request:?}"
        );
    }
    assert!(allowed(
        &plane,
        "swimlb-controller",
        ("patch", "", "services/status", "web", "a")
    ));
}

/// The ServiceAccounts of deploy/swimlb.yaml, each with a committed list of what it may do.
const ACCOUNTS: [&str; 2] = ["swimlb-controller", "swimlb-speaker"];

/// The namespaces a list is taken in: swimlb's own (its Roles and ClusterRoles) and another
/// (its ClusterRoles alone).
const CAN_I_NAMESPACES: [&str; 2] = ["swimlb-system", "default"];

/// The committed list of ServiceAccount `account`.
fn can_i_path(account: &str) -> String {
    format!("deploy/rbac/{account}.can-i.txt")
}

/// `kubectl auth can-i --list` normalised: the header first, then the rules sorted, each with
/// its whitespace collapsed to one space.
fn normalise_can_i(out: &str) -> Vec<String> {
    let mut lines: Vec<String> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect();
    let header = if lines.first().is_some_and(|l| l.starts_with("Resources ")) {
        Some(lines.remove(0))
    } else {
        None
    };
    lines.sort();
    header.into_iter().chain(lines).collect()
}

#[test]
fn kubectl_auth_can_i_list_of_each_service_account_is_the_committed_one() {
    let (plane, _) = installed("can-i");
    let kubectl = plane.kubectl();
    let regenerate = std::env::var_os(manifests::REGENERATE).is_some();
    let mut differ = Vec::new();
    for account in ACCOUNTS {
        let user = format!("system:serviceaccount:swimlb-system:{account}");
        let mut text = format!(
            "# What ServiceAccount swimlb-system/{account} may do once deploy/swimlb.yaml is \
             applied (its grants and the API server's defaults for every authenticated user),\n\
             # as the pinned kubectl prints it, sorted and with its whitespace collapsed.\n\
             # Checked on the real API server by e2e/tests/deploy.rs; a change of the grants \
             changes this file:\n\
             # SWIMLB_REGENERATE=1 cargo test -p swimlb-e2e --test deploy -- kubectl_auth_can_i\n"
        );
        for namespace in CAN_I_NAMESPACES {
            let args = ["auth", "can-i", "--list", "--as", &user, "-n", namespace];
            let out = kubectl.run(&args, None).unwrap_or_else(|e| panic!("{e:#}"));
            text.push_str(&format!("\n## kubectl {}\n", args.join(" ")));
            for line in normalise_can_i(&out) {
                text.push_str(&line);
                text.push('\n');
            }
        }
        let path = repo().join(can_i_path(account));
        if regenerate {
            std::fs::create_dir_all(path.parent().expect("a folder"))
                .and_then(|()| std::fs::write(&path, &text))
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != text {
            differ.push(format!(
                "{}, committed:\n{committed}\n{account} may now:\n{text}",
                can_i_path(account)
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "the RBAC of deploy/swimlb.yaml grants other than the committed lists (a new grant is a \
         visible change: review it, then rewrite the lists with \
         `SWIMLB_REGENERATE=1 cargo test -p swimlb-e2e --test deploy -- kubectl_auth_can_i`):\n\n{}",
        differ.join("\n\n")
    );
}

#[test]
fn the_can_i_list_is_sorted_under_its_header_with_whitespace_collapsed() {
    let out = "Resources    Non-Resource URLs   Resource Names   Verbs\n\
               services     []                  []               [list watch]\n\
               leases.coordination.k8s.io   []   [swimlb-controller]   [get patch]\n\n";
    assert_eq!(
        normalise_can_i(out),
        [
            "Resources Non-Resource URLs Resource Names Verbs",
            "leases.coordination.k8s.io [] [swimlb-controller] [get patch]",
            "services [] [] [list watch]",
        ]
    );
}

/// The real controller, as deployed: its ServiceAccount's token, so the API server's RBAC
/// judges every request (the lab has no kubelet to run its Pod).
fn start_controller(plane: &TestPlane) -> std::process::Child {
    let kubeconfig = plane.path().join("controller.kubeconfig");
    plane
        .service_account_kubeconfig("swimlb-system", "swimlb-controller", &kubeconfig)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    std::process::Command::new(env!("CARGO_BIN_EXE_swimlb-lab"))
        .arg("controller")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--lease-namespace", "swimlb-system", "--identity", "c-0"])
        .arg(format!("--listen={listen}"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the controller starts")
}

/// Waits until `check` holds, for at most 30 s.
fn wait_for(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn every_request_of_the_real_controller_is_allowed_by_its_rbac() {
    use serde_json::json;
    let (plane, _) = installed("controller-rbac");
    let admin = plane.admin();
    for object in [
        json!({"apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "lab", "namespace": "swimlb-system"},
            "spec": {"addresses": ["192.0.2.8/29"]}}),
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}}),
    ] {
        admin.create(object).unwrap_or_else(|e| panic!("{e:#}"));
    }
    let mut controller = start_controller(&plane);
    let get = |api_version: &str, kind: &str, namespace: &str, name: &str| {
        admin
            .get(api_version, kind, Some(namespace), name)
            .ok()
            .flatten()
            .unwrap_or_default()
    };
    wait_for("the Service's address", || {
        get("v1", "Service", "default", "web")["status"]["loadBalancer"]["ingress"].is_array()
    });
    // An invalid pool (the API server accepts it; the controller refuses it): a Warning Event.
    admin
        .create(
            json!({"apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "bad", "namespace": "swimlb-system"},
            "spec": {"addresses": ["192.0.2.9-192.0.2.8"]}}),
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    // A pool in another namespace: ignored, with a Warning Event on it there.
    admin
        .create(
            json!({"apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "elsewhere", "namespace": "default"},
            "spec": {"addresses": ["198.51.100.0/30"]}}),
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    wait_for("the IgnoredOutsideNamespace Event", || {
        admin
            .list("events.k8s.io/v1", "Event", Some("default"))
            .unwrap_or_default()
            .iter()
            .any(|e| e["reason"] == "IgnoredOutsideNamespace")
    });
    wait_for("the InvalidConfiguration Event", || {
        admin
            .list("events.k8s.io/v1", "Event", Some("swimlb-system"))
            .unwrap_or_default()
            .iter()
            .any(|e| e["reason"] == "InvalidConfiguration")
    });
    // A deleted Service releases its address: the pool's status counts it.
    admin
        .delete("v1", "Service", Some("default"), "web")
        .unwrap_or_else(|e| panic!("{e:#}"));
    wait_for("the pool status to count nothing assigned", || {
        get("swimlb.io/v1beta1", "IPAddressPool", "swimlb-system", "lab")["status"]["assignedIPv4"]
            == 0
    });
    // The watches are long-running requests the controller opens after its lists; the audit log
    // has them once their answers start. Wait for them before the SIGTERM, or a quick run ends
    // before the last one opened.
    let user = "system:serviceaccount:swimlb-system:swimlb-controller";
    wait_for("the controller's watches in the audit log", || {
        let watched: BTreeSet<String> = plane
            .requests()
            .into_iter()
            .filter(|r| r.user == user && r.verb == "watch" && r.code < 400)
            .map(|r| r.resource)
            .collect();
        ["services", "ipaddresspools", "l2advertisements"]
            .iter()
            .all(|r| watched.contains(*r))
    });
    // SIGTERM: drain and release the Lease.
    let pid = controller.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let exit = controller.wait().expect("the controller exits");
    assert_eq!(exit.code(), Some(0));

    let requests: Vec<_> = plane
        .requests()
        .into_iter()
        .filter(|r| r.user == user)
        .collect();
    let denied: Vec<_> = requests.iter().filter(|r| r.code == 403).collect();
    assert!(
        denied.is_empty(),
        "the controller's RBAC in deploy/swimlb.yaml refuses:\n{denied:#?}"
    );
    let used: BTreeSet<(String, String, String)> = requests
        .iter()
        .filter(|r| r.code < 400)
        .map(|r| (r.verb.clone(), r.group.clone(), r.resource.clone()))
        .collect();
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
        ("watch", "swimlb.io", "ipaddresspools"),
        ("watch", "swimlb.io", "l2advertisements"),
        ("create", "", "secrets"),
    ] {
        let needed = (needed.0.into(), needed.1.into(), needed.2.into());
        assert!(
            used.contains(&needed),
            "the run never did {needed:?}: {used:#?}"
        );
    }
    let read_secrets: Vec<_> = requests
        .iter()
        .filter(|r| r.resource == "secrets" && r.verb != "create")
        .collect();
    assert!(
        read_secrets.is_empty(),
        "the controller only creates the gossip key: {read_secrets:#?}"
    );
}

/// The README's Kubernetes quick start, command for command where no node is needed, on the real
/// control plane: the install it names, the example files it applies (every
/// `kubectl apply -f docs/examples/...` line of it), then the controller with its
/// ServiceAccount's token (the lab has no kubelet to run its Pod) gives the Service the address
/// the README says `kubectl get service web` shows, and creates the gossip key Secret it says the
/// controller creates. The speakers' part (who answers) is the real node
/// test's (`e2e/tests/real_node/`, root).
#[test]
fn the_readmes_kubernetes_quick_start_gives_the_service_the_address_it_names() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let install = "kubectl apply --server-side -f deploy/swimlb.yaml";
    assert!(
        readme.lines().any(|l| l.trim_start().starts_with(install)),
        "the README no longer installs with `{install}`: change this test with it"
    );
    let examples: Vec<&str> = readme
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("kubectl apply -f "))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    assert!(
        examples.iter().any(|e| e.ends_with("web-service.yaml")),
        "the README's quick start applies no web Service: {examples:?}"
    );
    let expected = readme
        .lines()
        .find(|l| l.trim_start().starts_with("kubectl get service web"))
        .and_then(|l| l.split("EXTERNAL-IP").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the README says which EXTERNAL-IP `kubectl get service web` shows");

    let (plane, _) = installed("quick-start");
    for example in &examples {
        plane
            .kubectl()
            .run(
                &["apply", "-f", &repo().join(example).to_string_lossy()],
                None,
            )
            .unwrap_or_else(|e| panic!("kubectl apply -f {example}: {e:#}"));
    }
    let mut controller = start_controller(&plane);
    let admin = plane.admin();
    let ingress = || {
        admin
            .get("v1", "Service", Some("default"), "web")
            .ok()
            .flatten()
            .and_then(|s| {
                s["status"]["loadBalancer"]["ingress"][0]["ip"]
                    .as_str()
                    .map(String::from)
            })
    };
    wait_for("the web Service's address", || ingress().is_some());
    let secret = || {
        admin
            .get("v1", "Secret", Some("swimlb-system"), "swimlb-gossip-key")
            .ok()
            .flatten()
    };
    wait_for("the gossip key Secret", || secret().is_some());
    let records = plane
        .kubectl()
        .run(&["get", "servicel2statuses", "-n", "swimlb-system"], None);
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &controller.id().to_string()])
        .status();
    let _ = controller.wait();
    assert_eq!(
        ingress().as_deref(),
        Some(expected),
        "the web Service's address"
    );
    assert!(
        secret().is_some_and(|s| s["data"]["keys"].is_string()),
        "the gossip key Secret holds no `keys`"
    );
    records.unwrap_or_else(|e| panic!("kubectl get servicel2statuses: {e:#}"));
}
