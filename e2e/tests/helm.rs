//! The two other ways to install what `deploy/swimlb.yaml` installs, checked with the real tools:
//!
//! - the Helm chart `deploy/helm/swimlb`: `helm lint --strict` passes; its default rendering
//!   (`helm template swimlb deploy/helm/swimlb --namespace swimlb-system --include-crds`) is
//!   `deploy/swimlb.yaml` object for object; another image changes the image and nothing else;
//!   each value changes what it names and nothing else; its version and appVersion are the
//!   workspace's; `helm install` onto the real control plane (`swimlb_control_plane`, on the
//!   loopback) stores every object, `helm list` shows the release, `helm upgrade` changes a
//!   value, newer CRDs go in with `kubectl apply --server-side --force-conflicts` (and not
//!   without), `helm uninstall` removes every object but the CRDs and the namespace, which keep
//!   the users' pools, and a second install takes them back;
//! - the kustomization `deploy/kustomization.yaml`: `kubectl kustomize deploy/` builds
//!   `deploy/swimlb.yaml` object for object, and an overlay that renames the image changes the
//!   image and nothing else.
//!
//! helm is `$SWIMLB_HELM` (test.sh builds it with `e2e/k8s/helm/build.sh` and exports it), else
//! what that script builds; kubectl is the pinned one of `$SWIMLB_K8S_BIN`, else the one on
//! `PATH`. Not root. A missing tool fails the tests, saying which; none is skipped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use swimlb_control_plane::control_plane::{Options, READY_LIMIT};
use swimlb_control_plane::test_plane::TestPlane;
use swimlb_e2e::{kubectl, manifests};

/// The workspace's version: the chart's version and appVersion, the image's tag.
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The namespace deploy/swimlb.yaml installs into.
const NAMESPACE: &str = "swimlb-system";
/// The image repository of deploy/swimlb.yaml (the Containerfile's tag, without the version).
const IMAGE_REPOSITORY: &str = "localhost/swimlb/swimlb";
/// The containers that run swimlb's image: (kind, name, container).
const CONTAINERS: [(&str, &str, &str); 2] = [
    ("DaemonSet", "swimlb-speaker", "speaker"),
    ("Deployment", "swimlb-controller", "controller"),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository")
}

fn chart() -> PathBuf {
    repo().join(manifests::CHART)
}

/// A scratch folder of this test, made empty.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("helm-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// The helm binary: `$SWIMLB_HELM`, else the one `e2e/k8s/helm/build.sh` builds (once, then
/// from its cache). Panics with the reason when there is none.
fn helm_path() -> PathBuf {
    if let Some(path) = std::env::var_os("SWIMLB_HELM") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "$SWIMLB_HELM is {}, which is no file: run e2e/k8s/helm/build.sh",
            path.display()
        );
        return path;
    }
    let script = repo().join("e2e/k8s/helm/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed ({}): the chart's tests need helm (Go and the Go module proxy build it)",
        script.display(),
        out.status
    );
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("helm");
    assert!(
        path.is_file(),
        "{} printed no folder with helm",
        script.display()
    );
    path
}

/// helm with its configuration, cache and data in a scratch folder of `test`'s, so the tests
/// neither read nor write the user's.
fn helm(test: &str) -> Command {
    let home = scratch(&format!("{test}-home"));
    let mut command = Command::new(helm_path());
    command
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .env_remove("HELM_NAMESPACE")
        .env_remove("HELM_KUBECONTEXT");
    command
}

/// Runs `command`; its standard output, or a panic with its output and status.
fn run(command: &mut Command) -> String {
    let shown = format!("{command:?}");
    let out = command.output().unwrap_or_else(|e| panic!("{shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// The objects of a YAML stream by `Kind namespace/name` (documents split at `---` lines,
/// those without an object dropped). Panics on a name given twice.
fn objects(text: &str, origin: &str) -> BTreeMap<String, Value> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line == "---" {
            docs.push(String::new());
        } else if let Some(doc) = docs.last_mut() {
            doc.push_str(line);
            doc.push('\n');
        }
    }
    let mut out = BTreeMap::new();
    for doc in docs {
        if !doc
            .lines()
            .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        {
            continue;
        }
        let value: Value =
            serde_saphyr::from_str(&doc).unwrap_or_else(|e| panic!("parsing {origin}: {e}"));
        let key = format!(
            "{} {}/{}",
            value["kind"].as_str().unwrap_or_default(),
            value["metadata"]["namespace"].as_str().unwrap_or_default(),
            value["metadata"]["name"].as_str().unwrap_or_default()
        );
        if let Some(twice) = out.insert(key.clone(), value) {
            panic!("{origin}: {key} twice ({twice})");
        }
    }
    out
}

/// The objects of `deploy/swimlb.yaml`.
fn install() -> BTreeMap<String, Value> {
    objects(
        &manifests::read(&repo(), manifests::INSTALL).expect("deploy/swimlb.yaml"),
        manifests::INSTALL,
    )
}

/// What the chart renders with its default values: the objects of deploy/swimlb.yaml, unchanged
/// (its Namespace carries `helm.sh/resource-policy: keep`, so `helm uninstall` keeps it).
fn chart_install() -> BTreeMap<String, Value> {
    install()
}

/// `helm template swimlb deploy/helm/swimlb --include-crds` in `namespace` with `args`.
fn render(test: &str, namespace: &str, args: &[&str]) -> BTreeMap<String, Value> {
    let text = run(helm(test)
        .args(["template", "swimlb"])
        .arg(chart())
        .args(["--namespace", namespace, "--include-crds"])
        .args(args));
    objects(&text, "helm template")
}

/// The container `container` of the Pod template of `kind name`.
fn container<'a>(
    objects: &'a mut BTreeMap<String, Value>,
    kind: &str,
    name: &str,
    container: &str,
) -> &'a mut Value {
    let pod = pod_spec(objects, kind, name);
    pod["containers"]
        .as_array_mut()
        .and_then(|c| c.iter_mut().find(|c| c["name"] == container))
        .unwrap_or_else(|| panic!("no container {container} in {kind} {name}"))
}

/// The Pod template's spec of `kind name` in swimlb's namespace.
fn pod_spec<'a>(objects: &'a mut BTreeMap<String, Value>, kind: &str, name: &str) -> &'a mut Value {
    &mut objects
        .get_mut(&format!("{kind} {NAMESPACE}/{name}"))
        .unwrap_or_else(|| panic!("no {kind} {name}"))["spec"]["template"]["spec"]
}

/// Where `actual` and `expected` differ: one line per differing field, with its path.
fn differences(path: &str, actual: &Value, expected: &Value, out: &mut Vec<String>) {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => {
            for key in a.keys().chain(e.keys().filter(|k| !a.contains_key(*k))) {
                let (a, e) = (a.get(key), e.get(key));
                let (a, e) = (a.unwrap_or(&Value::Null), e.unwrap_or(&Value::Null));
                differences(&format!("{path}.{key}"), a, e, out);
            }
        }
        (Value::Array(a), Value::Array(e)) if a.len() == e.len() => {
            for (i, (a, e)) in a.iter().zip(e).enumerate() {
                differences(&format!("{path}[{i}]"), a, e, out);
            }
        }
        // 100 and 100.0 are one number to the API server (kustomize writes the former).
        (Value::Number(a), Value::Number(e)) if a.as_f64() == e.as_f64() => {}
        (a, e) if a != e => out.push(format!("{path}: {a} instead of {e}")),
        _ => {}
    }
}

/// Asserts `actual == expected` object by object, naming each field that differs.
fn assert_same(actual: &BTreeMap<String, Value>, expected: &BTreeMap<String, Value>, what: &str) {
    let names = |m: &BTreeMap<String, Value>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(actual), names(expected), "{what}: the objects");
    let mut found = Vec::new();
    for (key, value) in expected {
        differences(key, &actual[key], value, &mut found);
    }
    assert!(found.is_empty(), "{what} differs:\n{}", found.join("\n"));
}

#[test]
fn helm_lint_strict_passes() {
    let out = run(helm("lint").args(["lint", "--strict"]).arg(chart()));
    assert!(
        out.contains("1 chart(s) linted, 0 chart(s) failed"),
        "{out}"
    );
}

#[test]
fn the_default_rendering_is_swimlb_yaml_object_for_object() {
    let rendered = render("default", NAMESPACE, &[]);
    assert_eq!(install().len(), 18, "the objects of deploy/swimlb.yaml");
    let expected = chart_install();
    assert_same(
        &rendered,
        &expected,
        "helm template with the default values",
    );
}

#[test]
fn another_image_changes_the_image_and_nothing_else() {
    let rendered = render(
        "image",
        NAMESPACE,
        &[
            "--set",
            "image.repository=registry.example.com/lb/swimlb,image.tag=0.2.0-rc.1",
        ],
    );
    let mut expected = chart_install();
    for (kind, name, c) in CONTAINERS {
        let spec = container(&mut expected, kind, name, c);
        assert_eq!(spec["image"], format!("{IMAGE_REPOSITORY}:{VERSION}"));
        spec["image"] = json!("registry.example.com/lb/swimlb:0.2.0-rc.1");
    }
    assert_same(&rendered, &expected, "helm template with another image");
}

#[test]
fn each_value_changes_what_it_names_and_nothing_else() {
    let dir = scratch("values");
    let values = dir.join("values.yaml");
    std::fs::write(
        &values,
        "image:\n  pullPolicy: Always\n\
         imagePullSecrets: [regcred, {name: mirror}]\n\
         namespace:\n  create: false\n\
         controller:\n  replicas: 3\n\
         \x20 resources: {requests: {cpu: 100m, memory: 128Mi}}\n\
         \x20 extraArgs: [--load-balancer-class=example.com/swimlb]\n\
         \x20 nodeSelector: {node-role.kubernetes.io/control-plane: \"\"}\n\
         \x20 tolerations: [{key: dedicated, operator: Exists}]\n\
         speaker:\n  resources: {limits: {memory: 512Mi}}\n\
         \x20 extraArgs: [--gossip-profile=lan, --load-balancer-class=example.com/swimlb]\n\
         \x20 nodeSelector: {swimlb.io/speaker: \"true\"}\n\
         \x20 tolerations: []\n",
    )
    .expect("a values file");
    let rendered = render(
        "values",
        NAMESPACE,
        &["--values", values.to_str().expect("UTF-8")],
    );

    let mut expected = install();
    expected
        .remove(&format!("Namespace /{NAMESPACE}"))
        .expect("the Namespace");
    let secrets = json!([{"name": "regcred"}, {"name": "mirror"}]);
    for (kind, name, c) in CONTAINERS {
        container(&mut expected, kind, name, c)["imagePullPolicy"] = json!("Always");
        pod_spec(&mut expected, kind, name)["imagePullSecrets"] = secrets.clone();
    }
    expected
        .get_mut(&format!("Deployment {NAMESPACE}/swimlb-controller"))
        .expect("the Deployment")["spec"]["replicas"] = json!(3);
    let controller = pod_spec(&mut expected, "Deployment", "swimlb-controller");
    controller["nodeSelector"] = json!({"node-role.kubernetes.io/control-plane": ""});
    controller["tolerations"] = json!([{"key": "dedicated", "operator": "Exists"}]);
    let controller = container(
        &mut expected,
        "Deployment",
        "swimlb-controller",
        "controller",
    );
    // Helm merges a map of values into the default one: the default limit stays.
    controller["resources"]["requests"] = json!({"cpu": "100m", "memory": "128Mi"});
    push_args(controller, &["--load-balancer-class=example.com/swimlb"]);
    let speaker = pod_spec(&mut expected, "DaemonSet", "swimlb-speaker");
    speaker["nodeSelector"] = json!({"swimlb.io/speaker": "true"});
    speaker
        .as_object_mut()
        .expect("a Pod spec")
        .remove("tolerations")
        .expect("the speaker's default tolerations");
    let speaker = container(&mut expected, "DaemonSet", "swimlb-speaker", "speaker");
    speaker["resources"]["limits"] = json!({"memory": "512Mi"});
    push_args(
        speaker,
        &[
            "--gossip-profile=lan",
            "--load-balancer-class=example.com/swimlb",
        ],
    );
    assert_same(&rendered, &expected, "helm template with every value set");
}

fn push_args(container: &mut Value, args: &[&str]) {
    let list = container["args"].as_array_mut().expect("args");
    list.extend(args.iter().map(|a| json!(a)));
}

#[test]
fn the_release_namespace_is_every_objects_namespace() {
    let rendered = render("namespace", "lb", &[]);
    let mut expected = BTreeMap::new();
    for (_, mut object) in chart_install() {
        let meta = &mut object["metadata"];
        if meta["namespace"] == NAMESPACE {
            meta["namespace"] = json!("lb");
        }
        if object["kind"] == "Namespace" {
            object["metadata"]["name"] = json!("lb");
        }
        if let Some(subjects) = object.get_mut("subjects").and_then(Value::as_array_mut) {
            for s in subjects {
                s["namespace"] = json!("lb");
            }
        }
        let key = format!(
            "{} {}/{}",
            object["kind"].as_str().unwrap_or_default(),
            object["metadata"]["namespace"].as_str().unwrap_or_default(),
            object["metadata"]["name"].as_str().unwrap_or_default()
        );
        expected.insert(key, object);
    }
    assert_same(&rendered, &expected, "helm template --namespace lb");
}

#[test]
fn the_chart_the_kustomization_and_the_manifest_name_the_workspaces_version() {
    let repo = repo();
    let chart: Value = serde_saphyr::from_str(
        &manifests::read(&repo, &format!("{}/Chart.yaml", manifests::CHART)).unwrap(),
    )
    .expect("Chart.yaml");
    assert_eq!(chart["version"], VERSION, "the chart's version");
    assert_eq!(chart["appVersion"], VERSION, "the chart's appVersion");
    let values: Value = serde_saphyr::from_str(
        &manifests::read(&repo, &format!("{}/values.yaml", manifests::CHART)).unwrap(),
    )
    .expect("values.yaml");
    assert_eq!(values["image"]["repository"], IMAGE_REPOSITORY);
    assert_eq!(values["image"]["tag"], "", "the tag follows appVersion");

    let kustomization: Value =
        serde_saphyr::from_str(&manifests::read(&repo, manifests::KUSTOMIZATION).unwrap())
            .expect("kustomization.yaml");
    assert_eq!(kustomization["resources"], json!(["swimlb.yaml"]));
    assert_eq!(
        kustomization["images"],
        json!([{"name": IMAGE_REPOSITORY, "newName": IMAGE_REPOSITORY, "newTag": VERSION}])
    );

    let mut install = install();
    for (kind, name, c) in CONTAINERS {
        assert_eq!(
            container(&mut install, kind, name, c)["image"],
            format!("{IMAGE_REPOSITORY}:{VERSION}"),
            "{kind} {name}"
        );
    }
}

/// `kubectl kustomize DIR` with the pinned kubectl (or the one on PATH).
fn kustomize(dir: &Path) -> BTreeMap<String, Value> {
    let kubectl = kubectl::path().unwrap_or_else(|e| panic!("{e:#}"));
    let text = run(Command::new(&kubectl).arg("kustomize").arg(dir));
    objects(&text, &format!("{} kustomize", kubectl.display()))
}

#[test]
fn kubectl_kustomize_builds_swimlb_yaml_object_for_object() {
    let built = kustomize(&repo().join("deploy"));
    assert_same(&built, &install(), "kubectl kustomize deploy/");
}

#[test]
fn an_overlay_that_renames_the_image_changes_the_image_and_nothing_else() {
    // An overlay of the user's own, as docs/src/install/image.md shows it, next to the
    // repository (kustomize loads a base by a relative path).
    let overlay = scratch("overlay");
    let base = pathdiff(&repo().join("deploy"), &overlay);
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n  - {base}\n\
             images:\n  - name: {IMAGE_REPOSITORY}\n    newName: registry.example.com/lb/swimlb\n\
             \x20   newTag: 0.2.0-rc.1\n"
        ),
    )
    .expect("an overlay");
    let built = kustomize(&overlay);
    let mut expected = install();
    for (kind, name, c) in CONTAINERS {
        container(&mut expected, kind, name, c)["image"] =
            json!("registry.example.com/lb/swimlb:0.2.0-rc.1");
    }
    assert_same(&built, &expected, "kubectl kustomize of an overlay");
}

/// `to` relative to `from` (both absolute and canonical), with `/`.
fn pathdiff(to: &Path, from: &Path) -> String {
    let from = from.canonicalize().expect("a canonical path");
    let to: Vec<_> = to.components().collect();
    let from: Vec<_> = from.components().collect();
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".to_string(); from.len() - common];
    parts.extend(
        to[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

/// Whether CRD `name` is there and Established.
fn established(plane: &TestPlane, name: &str) -> anyhow::Result<bool> {
    let crd = plane.admin().get(
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        None,
        name,
    )?;
    Ok(crd.as_ref().is_some_and(|c| {
        c["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
        })
    }))
}

/// Whether the object of `object`'s kind and name is stored.
fn stored(plane: &TestPlane, object: &Value) -> bool {
    plane
        .admin()
        .get(
            object["apiVersion"].as_str().expect("an apiVersion"),
            object["kind"].as_str().expect("a kind"),
            object["metadata"]["namespace"].as_str(),
            object["metadata"]["name"].as_str().expect("a name"),
        )
        .unwrap_or_else(|e| panic!("{e:#}"))
        .is_some()
}

#[test]
fn helm_installs_lists_and_uninstalls_swimlb_on_the_real_api_server() {
    let plane = TestPlane::start("helm", &Options::default())
        .unwrap_or_else(|e| panic!("starting the control plane: {e:#}"));
    let kubeconfig = plane.admin_kubeconfig();
    let helm_run = |args: &[&str]| {
        run(helm("install")
            .args(args)
            .arg("--kubeconfig")
            .arg(&kubeconfig))
    };

    // As docs/src/install/helm.md says: the chart makes its namespace.
    let helm_install = || {
        helm_run(&[
            "install",
            "swimlb",
            chart().to_str().expect("UTF-8"),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
        ])
    };
    let out = helm_install();
    assert!(out.contains("STATUS: deployed"), "{out}");

    let list: Value =
        serde_json::from_str(&helm_run(&["list", "--namespace", NAMESPACE, "-o", "json"]))
            .expect("helm list's JSON");
    let releases = list.as_array().expect("a list");
    assert_eq!(releases.len(), 1, "{list}");
    assert_eq!(releases[0]["name"], "swimlb");
    assert_eq!(releases[0]["status"], "deployed");
    assert_eq!(releases[0]["chart"], format!("swimlb-{VERSION}"));
    assert_eq!(releases[0]["app_version"], VERSION);

    // Every object of deploy/swimlb.yaml is stored, the CRDs are served.
    let objects = install();
    for (key, object) in &objects {
        assert!(
            stored(&plane, object),
            "{key} was not stored by helm install"
        );
    }
    let crds: Vec<&str> = objects
        .values()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .map(|o| o["metadata"]["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(crds.len(), 3, "{crds:?}");
    plane
        .wait_for(READY_LIMIT, "the chart's CRDs established", |_| {
            crds.iter()
                .map(|name| established(&plane, name))
                .collect::<anyhow::Result<Vec<_>>>()
                .map(|all| all.into_iter().all(|e| e))
        })
        .unwrap_or_else(|e| panic!("{e:#}"));
    // helm marks what it manages.
    let daemonset = plane
        .admin()
        .get("apps/v1", "DaemonSet", Some(NAMESPACE), "swimlb-speaker")
        .unwrap_or_else(|e| panic!("{e:#}"))
        .expect("the DaemonSet");
    assert_eq!(
        daemonset["metadata"]["annotations"]["meta.helm.sh/release-name"],
        "swimlb"
    );

    // An upgrade with a value changed, as docs/src/install/helm.md gives it.
    let out = helm_run(&[
        "upgrade",
        "swimlb",
        chart().to_str().expect("UTF-8"),
        "--namespace",
        NAMESPACE,
        "--reset-then-reuse-values",
        "--set",
        "controller.replicas=3",
    ]);
    assert!(out.contains("STATUS: deployed"), "{out}");
    assert!(out.contains("REVISION: 2"), "{out}");
    let deployment = plane
        .admin()
        .get(
            "apps/v1",
            "Deployment",
            Some(NAMESPACE),
            "swimlb-controller",
        )
        .unwrap_or_else(|e| panic!("{e:#}"))
        .expect("the Deployment");
    assert_eq!(deployment["spec"]["replicas"], 3);

    // The CRDs of a newer release, applied as docs/src/install/helm.md says before `helm
    // upgrade`: helm owns their fields, so a server-side apply must force the conflicts.
    let newer = manifests::read(&repo(), manifests::CHART_CRDS)
        .expect("the chart's CRDs")
        .replace(
            "description: Auto-generated",
            "description: (newer) Auto-generated",
        );
    let newer_path = scratch("newer-crds").join("crds.yaml");
    std::fs::write(&newer_path, &newer).expect("a scratch file");
    let newer_path = newer_path.to_str().expect("UTF-8");
    let refused = plane
        .kubectl()
        .run(&["apply", "--server-side", "-f", newer_path], None)
        .expect_err("fields helm manages");
    assert!(format!("{refused:#}").contains("conflict"), "{refused:#}");
    plane
        .kubectl()
        .run(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                newer_path,
            ],
            None,
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    let crd = plane
        .admin()
        .get(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            None,
            "ipaddresspools.swimlb.io",
        )
        .unwrap_or_else(|e| panic!("{e:#}"))
        .expect("the CRD");
    assert!(
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("(newer)")),
        "the newer CRD is applied"
    );

    // Back to the chart's own CRDs, the same way (as an upgrade from this checkout would).
    plane
        .kubectl()
        .run(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                repo().join(manifests::CHART_CRDS).to_str().expect("UTF-8"),
            ],
            None,
        )
        .unwrap_or_else(|e| panic!("{e:#}"));

    // A pool of the user's, which the uninstall must not take away.
    plane
        .admin()
        .create(
            json!({"apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "lan", "namespace": NAMESPACE},
            "spec": {"addresses": ["192.0.2.0/30"]}}),
        )
        .unwrap_or_else(|e| panic!("{e:#}"));

    let out = helm_run(&["uninstall", "swimlb", "--namespace", NAMESPACE, "--wait"]);
    assert!(out.contains("uninstalled"), "{out}");
    // Every object is gone but the CRDs (helm never deletes a chart's CRDs) and the Namespace
    // (kept by its annotation): the user's pool is still there.
    let kept = |o: &Value| o["kind"] == "CustomResourceDefinition" || o["kind"] == "Namespace";
    plane
        .wait_for(
            Duration::from_secs(60),
            "the release's objects deleted",
            |_| {
                Ok(objects
                    .values()
                    .filter(|o| !kept(o))
                    .all(|o| !stored(&plane, o)))
            },
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    for name in &crds {
        assert!(
            established(&plane, name).unwrap_or_else(|e| panic!("{e:#}")),
            "CRD {name} is kept"
        );
    }
    let namespace = plane
        .admin()
        .get("v1", "Namespace", None, NAMESPACE)
        .unwrap_or_else(|e| panic!("{e:#}"))
        .expect("the Namespace is kept");
    assert_eq!(namespace["status"]["phase"], "Active", "{namespace}");
    assert!(
        plane
            .admin()
            .get("swimlb.io/v1beta1", "IPAddressPool", Some(NAMESPACE), "lan")
            .unwrap_or_else(|e| panic!("{e:#}"))
            .is_some(),
        "the user's pool is kept"
    );
    let list = helm_run(&["list", "--all-namespaces", "-o", "json"]);
    assert_eq!(list.trim(), "[]", "no release left");

    // The same install again takes the kept namespace back.
    let out = helm_install();
    assert!(out.contains("STATUS: deployed"), "{out}");
    for (key, object) in &objects {
        assert!(
            stored(&plane, object),
            "{key} was not stored by the second install"
        );
    }
}
