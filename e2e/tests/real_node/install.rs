//! The install page (docs/src/install/kubernetes.md) on real nodes, after `deploy/swimlb.yaml`
//! was applied, as a user runs it: its commands as written there (the rollouts, `get pods`, the
//! example pool with the lab segment's addresses, the example Service as it is, `get service`,
//! `describe service`'s Events, `servicel2statuses` with its columns, `kubectl exec` of
//! `swimlb-speaker status` in the owner's speaker, the real kubelet serving the exec), a
//! request to the Service's IP from the client answered through the owner's kube-proxy; then
//! what runs in the containers (user, capabilities, in-cluster configuration, the token bound to
//! the Pod), every Pod Ready without a restart, and the API server's audit log: every request
//! of the speakers and the controllers passed the RBAC the manifest applied.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest as _, Sha256};
use swimlb_e2e::control_plane::{self, KUBERNETES_SERVICE_IP};
use swimlb_e2e::realnode::{RealNode, image};
use swimlb_e2e::{kubelab, netns, probe, rbac};
use tokio::time::Instant;

use super::{Cluster, pod_ready, pods_of, repo};

/// Generous functional bound for each stage (nothing here is a timing assertion).
pub(crate) const STAGE: Duration = Duration::from_secs(120);
/// swimlb's namespace.
pub(crate) const NAMESPACE: &str = "swimlb-system";
/// The controller's replicas in `deploy/swimlb.yaml`.
const CONTROLLERS: usize = 2;
/// The ServiceAccounts of swimlb's Pods, as the API server names their users.
const ACCOUNTS: [&str; 2] = [
    "system:serviceaccount:swimlb-system:swimlb-speaker",
    "system:serviceaccount:swimlb-system:swimlb-controller",
];
/// The pool's range in `docs/examples/kubernetes/first-pool.yaml`.
const EXAMPLE_RANGE: &str = "192.0.2.100-192.0.2.119";

/// What the install page left running: the Service `web`'s IP and its owner.
#[derive(Debug)]
pub(crate) struct Served {
    /// The Service's LoadBalancer IP.
    pub ip: Ipv4Addr,
    /// The node every speaker elected to answer for it.
    pub owner: String,
    /// That node's MAC on the lab's segment.
    pub owner_mac: [u8; 6],
    /// Each speaker's Pod, with its node.
    pub speakers: Vec<(String, String)>,
}

/// Polls `found` every 250 ms until it gives a value; panics naming `what` after `limit`.
pub(crate) fn wait_for<T>(what: &str, limit: Duration, mut found: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = found() {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `kubectl ARGS` from the client as the administrator; its output, or a panic with its error.
pub(crate) fn kubectl(cluster: &Cluster, args: &[&str]) -> String {
    cluster
        .plane
        .kubectl()
        .run(args, None)
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// The same, printed as the page shows it.
fn shown(cluster: &Cluster, args: &[&str]) -> String {
    let out = kubectl(cluster, args);
    eprintln!("$ kubectl {}\n{out}", args.join(" "));
    out
}

/// A line's columns.
fn columns(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// Runs the page (see the module's documentation) and returns what it left serving.
pub(crate) fn run_the_install_page(cluster: &Cluster) -> Served {
    rollouts_and_pods(cluster);
    let pool = first_pool(cluster);
    route_pods_between(cluster);
    backend(cluster);
    let ip = first_service(cluster, pool);
    let owner = which_node_answers(cluster, ip);
    let speakers: Vec<(String, String)> = pods_of(&cluster.plane, "speaker")
        .iter()
        .map(|p| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (s(&p["metadata"]["name"]), s(&p["spec"]["nodeName"]))
        })
        .collect();
    speaker_status(cluster, &speakers, ip, &owner);
    check_containers(cluster);
    all_ready_without_restart(cluster);
    check_rbac(cluster);
    let owner_mac = cluster
        .lab
        .nodes
        .iter()
        .find(|n| n.name == owner)
        .expect("the owner is a lab node")
        .mac;
    Served {
        ip,
        owner,
        owner_mac,
        speakers,
    }
}

/// "Install" and "Check the install": both rollouts complete; `get pods -o wide` shows one
/// speaker per node and both controllers, each `Running` and `1/1`.
fn rollouts_and_pods(cluster: &Cluster) {
    for workload in ["deployment/swimlb-controller", "daemonset/swimlb-speaker"] {
        shown(
            cluster,
            &[
                "-n",
                NAMESPACE,
                "rollout",
                "status",
                workload,
                "--timeout=180s",
            ],
        );
    }
    let out = shown(cluster, &["-n", NAMESPACE, "get", "pods", "-o", "wide"]);
    let mut lines = out.lines();
    let header = columns(lines.next().unwrap_or_default());
    assert_eq!(
        header[..7],
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"],
        "{out}"
    );
    let (mut speaker_nodes, mut controllers) = (Vec::new(), 0);
    for line in lines {
        let c = columns(line);
        assert_eq!((c[1], c[2]), ("1/1", "Running"), "{line}");
        if c[0].starts_with("swimlb-speaker-") {
            speaker_nodes.push(c[6].to_string());
        } else if c[0].starts_with("swimlb-controller-") {
            controllers += 1;
        }
    }
    speaker_nodes.sort();
    let mut nodes: Vec<String> = cluster.nodes.iter().map(|n| n.name.clone()).collect();
    nodes.sort();
    assert_eq!(speaker_nodes, nodes, "one speaker per node: {out}");
    assert_eq!(controllers, CONTROLLERS, "{out}");
}

/// "A first pool and advertisement": the example file with the lab segment's addresses in
/// place of its range (the page: pick addresses of the nodes' subnet), applied by the page's
/// commands; the pool `Valid`. Returns its first address.
fn first_pool(cluster: &Cluster) -> Ipv4Addr {
    let example = repo().join("docs/examples/kubernetes/first-pool.yaml");
    let text = std::fs::read_to_string(&example).expect("the example pool");
    assert_eq!(text.matches(EXAMPLE_RANGE).count(), 1, "{text}");
    let (first, last) = (netns::vip_v4(0), netns::vip_v4(19));
    let file: PathBuf = cluster.lab.work_dir().join("first-pool.yaml");
    std::fs::write(
        &file,
        text.replace(EXAMPLE_RANGE, &format!("{first}-{last}")),
    )
    .expect("writing the pool");
    let file = file.to_str().expect("a UTF-8 path");
    shown(
        cluster,
        &[
            "wait",
            "--for",
            "condition=established",
            "crd/ipaddresspools.swimlb.io",
            "crd/l2advertisements.swimlb.io",
        ],
    );
    shown(cluster, &["apply", "--server-side", "-f", file]);
    let pools = shown(cluster, &["-n", NAMESPACE, "get", "ipaddresspools"]);
    assert!(
        pools.lines().skip(1).any(|l| l.starts_with("lan ")),
        "{pools}"
    );
    let valid = wait_for("the pool lan Valid", STAGE, || {
        let yaml = kubectl(
            cluster,
            &["-n", NAMESPACE, "get", "ipaddresspool", "lan", "-o", "yaml"],
        );
        let pool: Value = serde_saphyr::from_str(&yaml).expect("the pool as YAML");
        let conditions = pool["status"]["conditions"].as_array().cloned();
        conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c["type"] == "Valid" && c["status"] == "True")
            .then_some(pool["status"].clone())
    });
    eprintln!("the pool's status: {valid}");
    first
}

/// Each node routes the other nodes' Pod subnets through them (the CNI bridge connects only a
/// node's own Pods): kube-proxy on the owner reaches a Pod on another node, as a cluster's Pod
/// network does.
fn route_pods_between(cluster: &Cluster) {
    for node in &cluster.nodes {
        for other in cluster.nodes.iter().filter(|o| o.name != node.name) {
            let via = other.ip.to_string();
            cluster
                .lab
                .run_in(
                    &node.netns,
                    "ip",
                    &["route", "replace", &other.pod_cidr, "via", &via],
                )
                .unwrap_or_else(|e| panic!("{}'s route to {}: {e:#}", node.name, other.name));
        }
    }
}

/// The user's application the example Service selects (`app: web`, port 8080): `swimlb-echo`,
/// one Pod per node, ready when its port answers.
fn backend(cluster: &Cluster) {
    let image = cluster.echo.as_deref().expect("the backend's image");
    let replicas = cluster.nodes.len();
    let deployment = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: default\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels:\n      app: web\n  template:\n    metadata:\n      labels:\n        app: web\n    spec:\n      topologySpreadConstraints:\n        - maxSkew: 1\n          topologyKey: kubernetes.io/hostname\n          whenUnsatisfiable: DoNotSchedule\n          labelSelector:\n            matchLabels:\n              app: web\n      containers:\n        - name: web\n          image: {image}\n          ports:\n            - containerPort: 8080\n          readinessProbe:\n            tcpSocket:\n              port: 8080\n            periodSeconds: 1\n"
    );
    cluster
        .plane
        .kubectl()
        .run(&["apply", "-f", "-"], Some(&deployment))
        .unwrap_or_else(|e| panic!("{e:#}"));
    shown(
        cluster,
        &["rollout", "status", "deployment/web", "--timeout=180s"],
    );
}

/// "A first Service": the example applied as it is; `get service web` shows the pool's first
/// address; `describe` lists `IPAllocated` from the controller.
fn first_service(cluster: &Cluster, pool_first: Ipv4Addr) -> Ipv4Addr {
    let example = repo().join("docs/examples/kubernetes/web-service.yaml");
    shown(
        cluster,
        &["apply", "-f", example.to_str().expect("a UTF-8 path")],
    );
    let ip = wait_for("an EXTERNAL-IP for web", STAGE, || {
        let out = kubectl(cluster, &["get", "service", "web"]);
        let header = columns(out.lines().next().unwrap_or_default());
        assert_eq!(header[3], "EXTERNAL-IP", "{out}");
        let ip = columns(out.lines().nth(1).unwrap_or_default())[3].to_string();
        ip.parse::<Ipv4Addr>().ok()
    });
    shown(cluster, &["get", "service", "web"]);
    assert_eq!(ip, pool_first, "the lowest free address of the pool");
    let allocated = format!("Assigned {ip} from pool lan");
    wait_for(&format!("the Event `{allocated}`"), STAGE, || {
        kubectl(cluster, &["describe", "service", "web"])
            .contains(&allocated)
            .then_some(())
    });
    ip
}

/// "Which node answers for an IP": every speaker names one owner; `kubectl get events` and
/// `describe` list its `nodeAssigned`; `servicel2statuses` names it under the page's columns, in the record the page
/// names; the client's request to the IP is answered by a `web` Pod, its ARP entry the owner's.
fn which_node_answers(cluster: &Cluster, ip: Ipv4Addr) -> String {
    let owner = kubelab::wait_for_owner(&cluster.lab, &ip.to_string(), STAGE, |o| o.is_some())
        .unwrap_or_else(|views| panic!("the speakers never agreed on an owner of {ip}: {views:?}"))
        .expect("an owner");
    // `kubectl describe` selects the Events by the Service's uid too: the speaker's Event must
    // name it.
    let assigned = format!("announcing from node \"{owner}\" with protocol \"layer2\"");
    let events = [
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=web",
    ];
    wait_for(&format!("the Event `{assigned}`"), STAGE, || {
        kubectl(cluster, &events).contains(&assigned).then_some(())
    });
    shown(cluster, &events);
    // The same Event, already stored: `describe` lists it at once.
    let described = shown(cluster, &["describe", "service", "web"]);
    assert!(
        described.contains("nodeAssigned") && described.contains(&assigned),
        "`kubectl describe service web` does not list the speaker's Event `{assigned}`: {described}"
    );
    let digest = Sha256::digest(b"default/web");
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let record = format!("l2-{}", &hex[..20]);
    let args = ["-n", NAMESPACE, "get", "servicel2statuses"];
    wait_for(&format!("{record} naming {owner}"), STAGE, || {
        let out = kubectl(cluster, &args);
        out.lines()
            .any(|l| {
                columns(l).get(..4)
                    == Some(&[record.as_str(), owner.as_str(), "web", "default"][..])
            })
            .then_some(())
    });
    let out = shown(cluster, &args);
    let page = std::fs::read_to_string(repo().join("docs/src/install/kubernetes.md"));
    let page = page.expect("the install page");
    let printed = page.lines().find(|l| l.contains("ALLOCATED NODE"));
    assert_eq!(
        columns(out.lines().next().unwrap_or_default()),
        columns(printed.expect("the page prints the columns")),
        "the page's columns: {out}"
    );
    let addr = SocketAddr::from((ip, 80));
    let body = wait_for(&format!("an answer to http://{ip}/"), STAGE, || {
        probe::in_netns(&cluster.lab.client_netns, move || {
            swimlb_e2e::lab::http_get(addr, "/")
        })
        .expect("the client's namespace")
    });
    eprintln!("$ curl http://{ip}/\n{body}");
    assert!(body.starts_with("web-"), "a web Pod answers: {body}");
    let mac = cluster.lab.nodes.iter().find(|n| n.name == owner);
    let mac = mac.expect("the owner is a lab node").mac;
    let mac: Vec<String> = mac.iter().map(|b| format!("{b:02x}")).collect();
    let neigh = cluster
        .lab
        .run_in(
            &cluster.lab.client_netns,
            "ip",
            &["neigh", "show", &ip.to_string()],
        )
        .expect("ip neigh");
    assert!(
        neigh.contains(&mac.join(":")),
        "the client reached {ip} at {owner}'s MAC: {neigh}"
    );
    owner
}

/// `swimlb-speaker status` in the speakers' Pods, by `kubectl exec` as the page writes it: in
/// the owner's Pod its verdict is `owner`; in the Pod `ds/swimlb-speaker` picks the same owner;
/// the speaker does not answer on its node's loopback.
fn speaker_status(cluster: &Cluster, speakers: &[(String, String)], ip: Ipv4Addr, owner: &str) {
    let owners_pod = &speakers
        .iter()
        .find(|(_, node)| node == owner)
        .expect("a speaker on the owner")
        .0;
    let row = |out: &str| -> Vec<String> {
        let line = out.lines().find(|l| l.starts_with(&format!("{ip} ")));
        let line = line.unwrap_or_else(|| panic!("no row for {ip}:\n{out}"));
        columns(line).iter().map(|c| c.to_string()).collect()
    };
    let exec = ["-n", NAMESPACE, "exec", owners_pod, "--", "swimlb-speaker"];
    let out = shown(cluster, &[&exec[..], &["status"]].concat());
    let r = row(&out);
    assert_eq!((r[2].as_str(), r[4].as_str()), (owner, "owner"), "{out}");
    let out = shown(
        cluster,
        &[
            "-n",
            NAMESPACE,
            "exec",
            "ds/swimlb-speaker",
            "--",
            "swimlb-speaker",
            "status",
        ],
    );
    assert_eq!(
        row(&out)[2],
        owner,
        "every speaker names the same owner: {out}"
    );
    let loopback = cluster
        .plane
        .kubectl()
        .run(&[&exec[..], &["status", "127.0.0.1:7572"]].concat(), None);
    assert!(
        loopback.is_err_and(|e| format!("{e:#}").contains("cannot reach")),
        "the speaker answers on its node's loopback"
    );
}

/// The process id of the running container `name` on `node`, if one runs there.
fn running_pid(node: &RealNode, name: &str) -> Option<u32> {
    let mut ps = node.crictl();
    ps.args(["ps", "--name", name, "--state", "running", "-q"]);
    let id = image::run(&mut ps).expect("crictl ps");
    let id = id.lines().next()?.trim().to_string();
    let inspect = image::run(node.crictl().args(["inspect", &id])).expect("crictl inspect");
    let inspect: Value = serde_json::from_str(&inspect).expect("crictl inspect's JSON");
    inspect["info"]["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
}

/// The claims of a ServiceAccount token (a JWT), decoded.
fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("a JWT has three parts");
    let mut standard = payload.replace('-', "+").replace('_', "/");
    while !standard.len().is_multiple_of(4) {
        standard.push('=');
    }
    let bytes: k8s_openapi::ByteString =
        serde_json::from_value(Value::String(standard)).expect("base64");
    serde_json::from_slice(&bytes.0).expect("JSON claims")
}

/// Each container as runc started it from the manifest: the speaker as root with `NET_RAW`
/// alone, the controller as 65532 with none; the in-cluster configuration (the kubelet's
/// `KUBERNETES_SERVICE_HOST`, no `KUBECONFIG`, the namespace, the CA and a token bound to the
/// container's own Pod).
fn check_containers(cluster: &Cluster) {
    for node in &cluster.nodes {
        for component in ["speaker", "controller"] {
            let Some(pid) = running_pid(node, component) else {
                continue;
            };
            let proc = PathBuf::from(format!("/proc/{pid}"));
            let status = std::fs::read_to_string(proc.join("status")).expect("its status");
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.split_whitespace().next())
                    .unwrap_or_default()
                    .to_string()
            };
            let (uid, caps) = (field("Uid:"), field("CapEff:"));
            eprintln!(
                "{component} on {}: uid {uid}, effective capabilities {caps}",
                node.name
            );
            let expected = match component {
                "speaker" => ("0", "0000000000002000"),
                _ => ("65532", "0000000000000000"),
            };
            assert_eq!((uid.as_str(), caps.as_str()), expected);
            let environ = std::fs::read(proc.join("environ")).expect("its environment");
            let env: Vec<String> = environ
                .split(|b| *b == 0)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .collect();
            assert!(!env.iter().any(|v| v.starts_with("KUBECONFIG=")), "{env:?}");
            let host = format!("KUBERNETES_SERVICE_HOST={KUBERNETES_SERVICE_IP}");
            assert!(env.contains(&host), "{component}: {env:?}");
            let sa = proc.join("root/var/run/secrets/kubernetes.io/serviceaccount");
            let read = |f: &str| {
                std::fs::read_to_string(sa.join(f))
                    .unwrap_or_else(|e| panic!("{component}: {f}: {e}"))
            };
            assert_eq!(read("namespace"), NAMESPACE);
            assert!(read("ca.crt").contains("BEGIN CERTIFICATE"));
            let claims = claims(&read("token"));
            let pod = claims["kubernetes.io"]["pod"]["name"]
                .as_str()
                .unwrap_or("");
            let pods = pods_of(&cluster.plane, component);
            assert!(
                pods.iter()
                    .any(|p| p["metadata"]["name"] == pod
                        && p["spec"]["nodeName"] == node.name.as_str()),
                "{component} on {}: the token is bound to its Pod: {claims}",
                node.name
            );
        }
    }
}

/// Every Pod of swimlb and of the application Ready, none restarted.
pub(crate) fn all_ready_without_restart(cluster: &Cluster) {
    for namespace in [NAMESPACE, "default"] {
        let pods = cluster
            .plane
            .admin()
            .list("v1", "Pod", Some(namespace))
            .expect("the Pods");
        for pod in &pods {
            let name = &pod["metadata"]["name"];
            assert!(pod_ready(pod), "{name} is not Ready: {pod}");
            let restarts = pod["status"]["containerStatuses"][0]["restartCount"].as_u64();
            assert_eq!(restarts, Some(0), "{name} restarted: {pod}");
        }
    }
}

/// What the real kubelets' own requests (`system:node:*`) got: printed, for the record.
fn report_kubelets(log: &[control_plane::AuditRecord]) {
    let mut codes = BTreeMap::<(u16, String), usize>::new();
    for r in log.iter().filter(|r| r.user.starts_with("system:node:")) {
        *codes
            .entry((r.code, format!("{} {}", r.verb, r.resource)))
            .or_default() += 1;
    }
    let summary: Vec<String> = codes
        .iter()
        .map(|((code, what), n)| format!("{n} x {what} {code}"))
        .collect();
    eprintln!("the kubelets' requests: {}", summary.join(", "));
}

/// Every request swimlb's ServiceAccounts made, from the API server's audit log: none refused
/// by the applied RBAC, every one answered, an expected 404 or 409, or a 429 (the server's
/// watch cache of a CRD created a moment before is not ready; the client retries).
fn check_rbac(cluster: &Cluster) {
    let log = cluster.plane.audit().expect("the audit log");
    report_kubelets(&log);
    for account in ACCOUNTS {
        let verdict = rbac::audited(&log, account);
        assert!(verdict.requests > 0, "no request came as {account}");
        assert!(
            verdict.refused.is_empty(),
            "the applied RBAC refuses requests of {account}:\n{:#?}",
            verdict.refused
        );
        assert!(
            verdict.failed.is_empty(),
            "requests of {account} failed:\n{:#?}",
            verdict.failed
        );
        eprintln!(
            "{account}: {} requests, none refused, {} retried at the server's request (429); \
             used: {}",
            verdict.requests,
            verdict.retried.len(),
            verdict.used.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
}
