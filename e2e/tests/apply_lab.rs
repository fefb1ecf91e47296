//! Issue 14's target "from `kubectl apply` to a serving VIP in the Kubernetes lab without any
//! other command", in the lab's network namespaces, on the real control plane (issue 24):
//!
//! 1. three nodes, etcd, kube-apiserver, kube-controller-manager and kube-scheduler in the
//!    client's namespace (the API server on the lab bridge, 198.51.100.2:6443), the Nodes
//!    registered by their kubelets, kube-proxy's DNAT on every node, and nothing of swimlb;
//!    each node's kubelet (`swimlb_e2e::kubelet`) runs what the control plane binds to it;
//! 2. real `kubectl apply --server-side -f deploy/swimlb.yaml`, the only install command;
//! 3. the real DaemonSet controller makes a speaker Pod per node, the real Deployment and
//!    ReplicaSet controllers the controller's two Pods, which the real scheduler binds; the
//!    kubelets run each container's `command` and `args` with its environment, user,
//!    capabilities, volumes (the gossip key's Secret, the ServiceAccount token bound to the Pod)
//!    and probes, in a mount namespace of its own: the speakers and the controllers read their
//!    in-cluster configuration;
//! 4. the operator applies an `IPAddressPool` and an `L2Advertisement`, a user a Service of
//!    type LoadBalancer and its backends (a DaemonSet of host-network Pods standing for the
//!    lab's probe responders), all with kubectl; the real EndpointSlice controller writes the
//!    Service's EndpointSlice; then the controller assigns an IP, the speakers elect its owner,
//!    the client's probes are answered by that owner, the `ServiceL2Status` record names it,
//!    and every Pod is ready without a restart.
//!
//! Then the install page's checks run (docs/src/install/kubernetes.md) (`kubectl get pods` and `servicel2statuses`, with the columns
//! the API server prints, `swimlb-speaker status` on the owner), and the audit log shows that
//! every request the speakers and the controllers made under their ServiceAccounts passed the
//! RBAC kubectl applied (`swimlb_e2e::rbac::audited`). A second test rotates the gossip key by
//! the upgrade page's procedure through the Secret (kubectl patch; the kubelets rewrite the mounted
//! file): the owner answers every probe meanwhile and no speaker refuses a datagram.
//!
//! The time from the start of `kubectl apply` to the first answered probe is printed, never
//! asserted. Needs root (network namespaces) and the control plane's programs:
//! `#[ignore = "needs root: ..."]`, run with `--include-ignored` as `sudo ./test.sh` does, one
//! lab at a time as the other lab tests.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use swimlb_e2e::kubectl::{Kubectl, Source};
use swimlb_e2e::kubelab::{self, APPS, BareCluster, NAMESPACE};
use swimlb_e2e::kubelet::{self, Kubelet};
use swimlb_e2e::netns::{self, Lab};
use swimlb_e2e::probe::{self, PROBE_PORT, Prober, Worker};
use swimlb_e2e::{control_plane, failover, manifests, rbac};
use tokio::time::Instant;

static LAB: Mutex<()> = Mutex::new(());

/// Generous functional bound for each stage (nothing here is a timing assertion).
const STAGE: Duration = Duration::from_secs(90);
/// The controller's replicas in `deploy/swimlb.yaml`.
const CONTROLLERS: usize = 2;
/// The ServiceAccounts of swimlb's Pods, as the API server names their users.
const ACCOUNTS: [&str; 2] = [
    "system:serviceaccount:swimlb-system:swimlb-speaker",
    "system:serviceaccount:swimlb-system:swimlb-controller",
];

fn one_lab(test: &str) -> MutexGuard<'static, ()> {
    netns::require_root(test);
    LAB.lock().unwrap_or_else(|e| e.into_inner())
}

fn program() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_swimlb-lab"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository")
}

/// A cluster with nothing of swimlb, its kubelets running. Fields drop in order: the kubelets
/// (every container stopped with its grace period), the responders, the cluster (the control
/// plane), then the lab (processes and namespaces).
struct Bare {
    kubelet: Kubelet,
    _responders: Vec<Worker>,
    cluster: BareCluster,
    lab: Lab,
}

impl Bare {
    fn start(n: u32) -> Bare {
        let id = format!("{}x{n}", std::process::id());
        let lab = Lab::create_with_id(3, &id).expect("building the lab");
        std::fs::create_dir_all(lab.work_dir()).expect("the lab's directory");
        let mut responders = Vec::new();
        for node in &lab.nodes {
            responders.extend(probe::spawn_responder(&node.netns, &node.name).expect("responder"));
        }
        let cluster = BareCluster::start(&lab, &lab.work_dir()).unwrap_or_else(|e| panic!("{e:#}"));
        let kubelet = Kubelet::start(&lab, cluster.control_plane(), &program(), &lab.work_dir())
            .unwrap_or_else(|e| panic!("the kubelets: {e:#}"));
        Bare {
            kubelet,
            _responders: responders,
            cluster,
            lab,
        }
    }

    /// kubectl as the operator runs it: the pinned kubectl, from the client, as the
    /// administrator.
    fn kubectl(&self) -> Kubectl {
        self.cluster.control_plane().kubectl()
    }

    fn logs(&self) -> String {
        self.kubelet.logs()
    }
}

/// What the operator applies after the install (docs/src/install/kubernetes.md): addresses to announce.
fn pool_manifest() -> String {
    format!(
        "apiVersion: swimlb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: lab\n  namespace: {NAMESPACE}\nspec:\n  addresses:\n    - {}\n---\napiVersion: swimlb.io/v1beta1\nkind: L2Advertisement\nmetadata:\n  name: lab\n  namespace: {NAMESPACE}\n",
        kubelab::POOL
    )
}

/// What a user applies: a Service of type LoadBalancer, no address asked for, and its
/// backends, one per node on the host network (the lab's probe responders).
fn service_manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {APPS}\nspec:\n  type: LoadBalancer\n  selector:\n    app: {name}\n  ports:\n    - name: probe\n      port: {PROBE_PORT}\n      protocol: UDP\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: {name}\n  namespace: {APPS}\nspec:\n  selector:\n    matchLabels:\n      app: {name}\n  template:\n    metadata:\n      labels:\n        app: {name}\n    spec:\n      hostNetwork: true\n      containers:\n        - name: responder\n          image: {}\n          ports:\n            - name: probe\n              containerPort: {PROBE_PORT}\n              protocol: UDP\n",
        kubelet::LAB_RESPONDER_IMAGE
    )
}

fn since(t0: Instant, t: Option<Instant>) -> String {
    t.map(|t| format!("{:>6} ms", t.duration_since(t0).as_millis()))
        .unwrap_or_else(|| "     never".into())
}

/// A lab installed by `kubectl apply` alone whose Service `web` is served: the moments on the
/// way, the address, the owner, the prober that saw it answered.
struct Serving {
    prober: Prober,
    run: Bare,
    kubectl: Kubectl,
    ip: IpAddr,
    owner: String,
    t0: Instant,
    t_applied: Instant,
    t_assigned: Instant,
    first: (String, Instant),
}

/// Polls `found` every 10 ms until it gives a value; panics with `what` and the Pods' logs
/// after [`STAGE`].
fn wait<T>(run: &Bare, what: &str, mut found: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + STAGE;
    loop {
        if let Some(value) = found() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {STAGE:?}\n{:#?}\n{}",
            run.kubelet.pods(),
            run.logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Serving {
    /// Steps 2 to 4 of the module's list, each asserted.
    fn start(n: u32) -> Serving {
        let run = Bare::start(n);
        let kubectl = run.kubectl();
        let nodes = run.lab.nodes.len();

        // The install: one command.
        let t0 = Instant::now();
        let applied = kubectl
            .apply(Source::File(&repo().join(manifests::INSTALL)))
            .unwrap_or_else(|e| panic!("{e:#}"));
        let t_applied = Instant::now();
        eprint!("{applied}");

        // What the cluster runs for it: a speaker per node, the controller's replicas.
        wait(&run, "the speaker and controller Pods", || {
            let pods = run.kubelet.pods();
            let count = |prefix: &str| {
                pods.iter()
                    .filter(|(p, _, _)| p.starts_with(prefix))
                    .count()
            };
            (count("swimlb-speaker-") == nodes && count("swimlb-controller-") == CONTROLLERS)
                .then_some(())
        });

        // The operator's addresses; a user's Service and its backends.
        kubectl
            .apply(Source::Text(&pool_manifest()))
            .unwrap_or_else(|e| panic!("{e:#}"));
        kubectl
            .apply(Source::Text(&service_manifest("web")))
            .unwrap_or_else(|e| panic!("{e:#}"));

        // The controller assigns an address.
        let ip: IpAddr = wait(&run, "an address assigned to web", || {
            run.cluster
                .ingress(APPS, "web")
                .first()
                .map(|ip| ip.parse().expect("an IP"))
        });
        let t_assigned = Instant::now();

        // The client's probes are answered.
        let prober = Prober::start(
            &run.lab.client_netns,
            SocketAddr::new(ip, PROBE_PORT),
            Duration::from_millis(10),
        )
        .expect("prober");
        let first = wait(&run, &format!("a probe to {ip} answered"), || {
            prober
                .snapshot()
                .into_iter()
                .filter_map(|r| r.answer)
                .min_by_key(|(_, at)| *at)
        });
        let owner = Self::one_owner(&run, &prober, ip);
        Self::all_ready(&run, nodes);
        Serving {
            prober,
            run,
            kubectl,
            ip,
            owner,
            t0,
            t_applied,
            t_assigned,
            first,
        }
    }

    /// One owner: every speaker, each seeing every node, names it; it answers; the record
    /// names it. Agreement comes first: a speaker still waiting for the gossip key (the
    /// controller makes it during the apply) leaves a half-formed mesh whose owner answers
    /// steadily until the last node joins and the address moves.
    fn one_owner(run: &Bare, prober: &Prober, ip: IpAddr) -> String {
        let agreed = kubelab::wait_for_owner(&run.lab, &ip.to_string(), STAGE, |o| o.is_some())
            .unwrap_or_else(|views| {
                panic!(
                    "the speakers never agreed on an owner of {ip}: {views:?}\n{}",
                    run.logs()
                )
            })
            .expect("an owner");
        let owner = wait(run, &format!("{agreed} answering {ip} steadily"), || {
            let steady = failover::wait_for_steady_owner(prober, 50, STAGE)
                .unwrap_or_else(|e| panic!("{e:#}\n{}", run.logs()));
            (steady == agreed).then_some(steady)
        });
        let recorded = wait(run, &format!("a ServiceL2Status naming {owner}"), || {
            run.cluster.record_node(APPS, "web").filter(|n| *n == owner)
        });
        assert_eq!(recorded, owner, "{:?}", run.cluster.records());
        owner
    }

    /// Every Pod ready, none restarted; the controller made the gossip key.
    fn all_ready(run: &Bare, nodes: usize) {
        let count = 2 * nodes + CONTROLLERS;
        if let Err(pending) = run.kubelet.wait_ready(count, STAGE) {
            panic!("Pods not ready: {pending:#?}\n{}", run.logs());
        }
        for (pod, node, state) in run.kubelet.pods() {
            assert_eq!(
                state.restarts,
                0,
                "{pod} on {node} restarted ({:?})\n{}",
                state.last_stop,
                run.logs()
            );
        }
        let key = run
            .cluster
            .api()
            .get("v1", "Secret", Some(NAMESPACE), "swimlb-gossip-key")
            .expect("reading the gossip key Secret");
        assert!(key.is_some(), "the controller made no gossip key Secret");
    }
}

/// The claims of a ServiceAccount token (a JWT), decoded.
fn claims(token: &str) -> serde_json::Value {
    let payload = token.split('.').nth(1).expect("a JWT has three parts");
    let mut standard = payload.replace('-', "+").replace('_', "/");
    while !standard.len().is_multiple_of(4) {
        standard.push('=');
    }
    let bytes: k8s_openapi::ByteString =
        serde_json::from_value(serde_json::Value::String(standard)).expect("base64");
    serde_json::from_slice(&bytes.0).expect("JSON claims")
}

/// Each container runs with the user and capabilities its securityContext names (the speaker
/// as root with NET_RAW alone, the controller as 65532 with none), at niceness 0, and the in-cluster
/// configuration a Pod has: the kubelet's variables, no KUBECONFIG, and in its own mount
/// namespace the token bound to its Pod, the CA and the namespace.
fn check_containers(run: &Bare) {
    let sa = "var/run/secrets/kubernetes.io/serviceaccount";
    assert!(
        !Path::new("/").join(sa).join("token").exists(),
        "the host sees no token: the Pods' mounts are their own"
    );
    for (pod, _, state) in run.kubelet.pods() {
        if !pod.starts_with("swimlb-") {
            continue;
        }
        let pid = state.pid.unwrap_or_else(|| panic!("{pod} runs no process"));
        let proc = PathBuf::from(format!("/proc/{pid}"));
        let status = std::fs::read_to_string(proc.join("status")).expect("its status");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
                .unwrap_or_default()
        };
        let (uid, caps) = (field("Uid:"), field("CapEff:"));
        let stat = std::fs::read_to_string(proc.join("stat")).expect("its stat");
        // Field 19 of stat, the 17th after the command's closing parenthesis.
        let nice = stat.rsplit(") ").next().and_then(|f| f.split(' ').nth(16));
        eprintln!("{pod}: uid {uid}, effective capabilities {caps}, nice {nice:?}");
        assert_eq!(
            nice,
            Some("0"),
            "{pod} runs at a container runtime's niceness"
        );
        if pod.starts_with("swimlb-speaker-") {
            assert_eq!((uid.as_str(), caps.as_str()), ("0", "0000000000002000"));
        } else {
            assert_eq!((uid.as_str(), caps.as_str()), ("65532", "0000000000000000"));
        }
        let environ = std::fs::read(proc.join("environ")).expect("its environment");
        let env: Vec<String> = environ
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        assert!(
            !env.iter().any(|v| v.starts_with("KUBECONFIG=")),
            "{pod}: {env:?}"
        );
        let host = format!(
            "KUBERNETES_SERVICE_HOST={}",
            control_plane::KUBERNETES_SERVICE_IP
        );
        assert!(env.contains(&host), "{pod}: {env:?}");
        // Through the process's root, as it sees its mounts (/var/run is a link to /run,
        // which would resolve in this process's root).
        let run_dir = Path::new("/var/run").canonicalize().expect("/var/run");
        let root = proc
            .join("root")
            .join(run_dir.strip_prefix("/").expect("absolute"))
            .join(sa.trim_start_matches("var/run/"));
        let read = |f: &str| {
            std::fs::read_to_string(root.join(f)).unwrap_or_else(|e| panic!("{pod}: {f}: {e}"))
        };
        assert_eq!(read("namespace"), NAMESPACE);
        assert!(read("ca.crt").contains("BEGIN CERTIFICATE"));
        let claims = claims(&read("token"));
        assert_eq!(
            claims["kubernetes.io"]["pod"]["name"], pod,
            "{pod}: the token is bound to its Pod: {claims}"
        );
    }
}

/// What the kubelets' own requests got (`system:node:*`): printed, for the record.
fn report_kubelets(log: &[control_plane::AuditRecord]) {
    let mut codes = std::collections::BTreeMap::<(u16, String), usize>::new();
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
fn check_rbac(run: &Bare) {
    let log = run.cluster.control_plane().audit().expect("the audit log");
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
        for r in &verdict.retried {
            eprintln!("  429: {} {}", r.verb, r.resource);
        }
    }
}

#[test]
#[ignore = "needs root: network namespaces"]
fn kubectl_apply_of_swimlb_yaml_alone_brings_a_load_balancer_ip_to_service() {
    let _one = one_lab("apply lab");
    let serving = Serving::start(1);
    let Serving {
        run,
        kubectl,
        ip,
        owner,
        t0,
        t_applied,
        t_assigned,
        ..
    } = &serving;
    let (first_answerer, t_first) = serving.first.clone();
    let (ip, owner, t0) = (*ip, owner.clone(), *t0);
    let pods = run.kubelet.pods();

    // The install page's checks, with kubectl: the columns the API server prints.
    for args in [
        ["-n", NAMESPACE, "get", "pods", "-o", "wide"],
        ["-n", NAMESPACE, "get", "servicel2statuses", "-o", "wide"],
    ] {
        let out = kubectl.run(&args, None).unwrap_or_else(|e| panic!("{e:#}"));
        eprintln!("$ kubectl {}\n{out}", args.join(" "));
        if args[3] == "servicel2statuses" {
            let line = out.lines().nth(1).unwrap_or_default();
            assert!(line.contains(&owner) && line.contains("web"), "{out}");
        }
    }

    // `kubectl exec ds/swimlb-speaker -- swimlb-speaker status` (the install page): the speaker's own
    // command in the owner's namespace, with the Pod's SWIMLB_LISTEN (its node's address, where
    // the speaker listens) as its default address, as `kubectl exec` gives it the Pod's env.
    let node = run
        .lab
        .nodes
        .iter()
        .find(|n| n.name == owner)
        .expect("the owner is a lab node");
    let out = Lab::command_in(&node.netns, &program().to_string_lossy())
        .args(["speaker", "status"])
        .env("SWIMLB_LISTEN", node.v4.to_string())
        .output()
        .expect("swimlb-speaker status runs");
    assert!(
        out.status.success(),
        "swimlb-speaker status on {owner}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = String::from_utf8_lossy(&out.stdout).into_owned();
    // The manifest's listen address is the node's own (status.hostIP), not every address of
    // the host: its loopback does not answer.
    let loopback = run.lab.run_in(
        &node.netns,
        &program().to_string_lossy(),
        &["speaker", "status", "127.0.0.1:7572"],
    );
    assert!(
        loopback.is_err_and(|e| format!("{e:#}").contains("cannot reach")),
        "the speaker answers on its host's loopback"
    );
    eprintln!("$ swimlb-speaker status   (on {owner})\n{status}");
    assert!(status.contains(&ip.to_string()), "{status}");

    check_containers(run);
    check_rbac(run);

    eprintln!("from the start of `kubectl apply` (first probe answered by {first_answerer}):");
    eprintln!(
        "  {}  kubectl apply --server-side -f deploy/swimlb.yaml returned",
        since(t0, Some(*t_applied))
    );
    for (pod, node, state) in &pods {
        eprintln!(
            "  {}  {pod} on {node} ({}) started; volumes filled {}; ready {}",
            since(t0, state.started),
            state.ip.map(|ip| ip.to_string()).unwrap_or_default(),
            since(t0, state.volumes_filled).trim(),
            since(t0, state.first_ready).trim(),
        );
    }
    eprintln!(
        "  {}  {ip} assigned to {APPS}/web",
        since(t0, Some(*t_assigned))
    );
    eprintln!(
        "  {}  first probe to {ip} answered (by {first_answerer}): apply -> serving",
        since(t0, Some(t_first))
    );
    eprintln!("  owner {owner}, named by every speaker and by its ServiceL2Status");
}

/// The speakers' gossip keys as the Secret holds them.
fn gossip_keys(run: &Bare) -> String {
    let secret = run
        .cluster
        .api()
        .get("v1", "Secret", Some(NAMESPACE), "swimlb-gossip-key")
        .expect("reading the gossip key Secret")
        .expect("the gossip key Secret");
    let bytes: k8s_openapi::ByteString =
        serde_json::from_value(secret["data"]["keys"].clone()).expect("base64 data");
    String::from_utf8(bytes.0).expect("a key file is text")
}

/// How many times the log of `pod` says its keys were replaced.
fn replacements(run: &Bare, pod: &str) -> usize {
    let log = run.kubelet.log_of(pod).unwrap_or_default();
    log.matches("gossip keys replaced").count()
}

/// No speaker refused a datagram (`swimlb_gossip_rejected_total`, every reason 0).
fn no_gossip_refused(run: &Bare) {
    for node in &run.lab.nodes {
        let addr = SocketAddr::from((node.v4, failover::HTTP_PORT));
        let metrics = probe::in_netns(&run.lab.client_netns, move || {
            swimlb_e2e::demo::http_get(addr, "/metrics")
        })
        .expect("the client's namespace")
        .unwrap_or_else(|| panic!("no /metrics from {}", node.name));
        let refused: Vec<&str> = metrics
            .lines()
            .filter(|l| l.starts_with("swimlb_gossip_rejected_total"))
            .filter(|l| !l.ends_with(" 0"))
            .collect();
        assert!(refused.is_empty(), "{}: {refused:?}", node.name);
    }
}

#[test]
#[ignore = "needs root: network namespaces"]
fn the_readme_key_rotation_through_the_secret_keeps_the_ip_with_its_owner() {
    let _one = one_lab("apply lab key rotation");
    let serving = Serving::start(2);
    let (run, owner) = (&serving.run, serving.owner.as_str());
    let old = gossip_keys(run);
    let old = old.trim();
    assert_eq!(
        old.lines().count(),
        1,
        "the controller makes one key: {old}"
    );
    let new = run
        .lab
        .run_in(
            &run.lab.client_netns,
            &program().to_string_lossy(),
            &["speaker", "keygen"],
        )
        .expect("swimlb-speaker keygen");
    let new = new.trim();
    let speakers: Vec<String> = run
        .kubelet
        .pods()
        .into_iter()
        .map(|(pod, _, _)| pod)
        .filter(|pod| pod.starts_with("swimlb-speaker-"))
        .collect();
    let start = Instant::now();
    // docs/src/install/upgrade.md, "Rotating the gossip key": the new key second, then first, then the old one dropped; each
    // step once every speaker logged `gossip keys replaced`.
    for (step, keys) in [
        (1, format!("{old}\n{new}\n")),
        (2, format!("{new}\n{old}\n")),
        (3, format!("{new}\n")),
    ] {
        let data =
            serde_json::to_value(k8s_openapi::ByteString(keys.into_bytes())).expect("base64");
        let patch = serde_json::json!({"data": {"keys": data}}).to_string();
        serving
            .kubectl
            .run(
                &[
                    "-n",
                    NAMESPACE,
                    "patch",
                    "secret",
                    "swimlb-gossip-key",
                    "--type",
                    "merge",
                    "-p",
                    &patch,
                ],
                None,
            )
            .unwrap_or_else(|e| panic!("{e:#}"));
        let deadline = Instant::now() + STAGE;
        while speakers.iter().any(|pod| replacements(run, pod) < step) {
            assert!(
                Instant::now() < deadline,
                "step {step}: not every speaker replaced its keys within {STAGE:?}\n{}",
                run.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "step {step}: every speaker replaced its keys {} ms after the rotation began",
            start.elapsed().as_millis()
        );
    }
    std::thread::sleep(Duration::from_secs(2));

    // The owner answered every probe meanwhile; no datagram was refused.
    let records = serving.prober.snapshot();
    let settled = records.len().saturating_sub(3);
    let during: Vec<_> = records[..settled]
        .iter()
        .filter(|r| r.sent >= start)
        .collect();
    let lost = during.iter().filter(|r| r.answer.is_none()).count();
    let others: Vec<&str> = during
        .iter()
        .filter_map(|r| r.answer.as_ref().map(|(n, _)| n.as_str()))
        .filter(|n| *n != owner)
        .collect();
    eprintln!(
        "{} probes during the rotation: {lost} lost, {} answered by another node than {owner}",
        during.len(),
        others.len()
    );
    assert!(
        others.is_empty(),
        "the IP moved during the rotation: {others:?}\n{}",
        run.logs()
    );
    assert_eq!(lost, 0, "probes lost during the rotation\n{}", run.logs());
    no_gossip_refused(run);
    assert_eq!(gossip_keys(run).trim(), new);
}
