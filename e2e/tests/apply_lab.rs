//! Issue 14's target "from `kubectl apply` to a serving VIP in the Kubernetes lab without any
//! other command", in the lab's network namespaces:
//!
//! 1. three nodes, the fake API server on the lab bridge (198.51.100.2:6443), the Nodes
//!    registered (the lab is their kubelet), kube-proxy's DNAT on every node, and nothing of
//!    swimlb;
//! 2. real `kubectl apply --server-side -f deploy/swimlb.yaml`, the only install command;
//! 3. the lab plays the DaemonSet and Deployment controllers and the kubelets from what was
//!    applied (`swimlb_e2e::kubelet`): the speaker Pods, one per node on the host network, and one
//!    controller Pod, each running its container's `command` and `args` with its environment,
//!    user, capabilities, Secret volume and probes, as the lab binary;
//! 4. the operator applies an `IPAddressPool` and an `L2Advertisement` and a user a Service of
//!    type LoadBalancer (both with kubectl), the endpoint controller writes its EndpointSlice;
//!    then the controller assigns an IP, the speakers elect its owner, the client's probes are
//!    answered by that owner, the `ServiceL2Status` record names it, and every Pod is ready
//!    without a restart.
//!
//! Then the README's checks run (`kubectl get pods` and `servicel2statuses` with the columns a
//! real server would print, `swimlb-speaker status` on the owner), and every request the
//! speakers and the controller made under their service accounts is audited against the RBAC
//! kubectl applied (`swimlb_e2e::rbac`). A second test rotates the gossip key by the README's
//! procedure through the Secret (kubectl patch; the lab's kubelet rewrites the mounted file):
//! the owner answers every probe meanwhile and no speaker refuses a datagram.
//!
//! The time from the start of `kubectl apply` to the first answered probe is printed, never
//! asserted. Needs root (network namespaces) and kubectl: `#[ignore = "needs root: ..."]`, run
//! with `--include-ignored` as `sudo ./test.sh` does, one lab at a time as the other lab tests.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use swimlb_e2e::kubectl::{Kubectl, Source};
use swimlb_e2e::kubelab::{self, APPS, FakeCluster, NAMESPACE};
use swimlb_e2e::kubelet::{self, Kubelet};
use swimlb_e2e::netns::{self, Lab};
use swimlb_e2e::probe::{self, PROBE_PORT, Prober, Worker};
use swimlb_e2e::{failover, manifests, rbac};
use tokio::time::Instant;

static LAB: Mutex<()> = Mutex::new(());

/// Generous functional bound for each stage (nothing here is a timing assertion).
const STAGE: Duration = Duration::from_secs(60);

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

/// A lab with the API server and nothing of swimlb. Fields drop in order: the kubelet (every
/// container stopped with its grace period), the responders, the cluster (the API server),
/// then the lab (processes and namespaces).
struct Bare {
    kubelet: Option<Kubelet>,
    _responders: Vec<Worker>,
    cluster: FakeCluster,
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
        let cluster = FakeCluster::start_empty(&lab).expect("the API server");
        kubelet::register_nodes(cluster.api(), &lab.nodes).expect("the Nodes");
        Bare {
            kubelet: None,
            _responders: responders,
            cluster,
            lab,
        }
    }

    /// kubectl as the operator runs it: from the client, with the API server's kubeconfig.
    fn kubectl(&self) -> Kubectl {
        let cache = self.lab.work_dir().join("kubectl-cache");
        Kubectl::new(
            Some(&self.lab.client_netns),
            self.cluster.kubeconfig(),
            &cache,
        )
    }

    fn logs(&self) -> String {
        self.kubelet.as_ref().map(Kubelet::logs).unwrap_or_default()
    }
}

/// What the operator applies after the install (README, "Deploy"): addresses to announce.
fn pool_manifest() -> String {
    format!(
        "apiVersion: swimlb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: lab\n  namespace: {NAMESPACE}\nspec:\n  addresses:\n    - {}\n---\napiVersion: swimlb.io/v1beta1\nkind: L2Advertisement\nmetadata:\n  name: lab\n  namespace: {NAMESPACE}\n",
        kubelab::POOL
    )
}

/// What a user applies: a Service of type LoadBalancer, no address asked for.
fn service_manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {APPS}\nspec:\n  type: LoadBalancer\n  selector:\n    app: {name}\n  ports:\n    - name: probe\n      port: {PROBE_PORT}\n      protocol: UDP\n"
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

impl Serving {
    /// Steps 1 to 4 of the module's list, each asserted.
    fn start(n: u32) -> Serving {
        let mut run = Bare::start(n);
        let kubectl = run.kubectl();
        let names: Vec<String> = run.lab.nodes.iter().map(|n| n.name.clone()).collect();

        // The install: one command.
        let t0 = Instant::now();
        let applied = kubectl
            .apply(Source::File(&repo().join(manifests::INSTALL)))
            .unwrap_or_else(|e| panic!("{e:#}"));
        let t_applied = Instant::now();
        eprint!("{applied}");

        // What the cluster runs for it.
        run.kubelet = Some(
            Kubelet::start(
                &run.lab,
                run.cluster.api_handle(),
                &program(),
                &run.lab.work_dir(),
            )
            .unwrap_or_else(|e| panic!("the applied workloads cannot run in the lab: {e:#}")),
        );
        let pods = run.kubelet.as_ref().expect("started").pods();
        let speakers = pods
            .iter()
            .filter(|(p, _, _)| p.starts_with("swimlb-speaker-"));
        assert_eq!(
            speakers.count(),
            names.len(),
            "one speaker Pod per node: {pods:?}"
        );

        // The operator's addresses, a user's Service, the endpoint controller's EndpointSlice.
        kubectl
            .apply(Source::Text(&pool_manifest()))
            .unwrap_or_else(|e| panic!("{e:#}"));
        kubectl
            .apply(Source::Text(&service_manifest("web")))
            .unwrap_or_else(|e| panic!("{e:#}"));
        let everywhere: Vec<&str> = names.iter().map(String::as_str).collect();
        run.cluster
            .api()
            .create(kubelab::endpoint_slice("web", 0, &everywhere))
            .expect("the EndpointSlice");

        // The controller assigns an address.
        let deadline = Instant::now() + STAGE;
        let ip: IpAddr = loop {
            if let Some(ip) = run.cluster.ingress(APPS, "web").first() {
                break ip.parse().expect("an IP");
            }
            assert!(
                Instant::now() < deadline,
                "the controller assigned no address within {STAGE:?}\n{}",
                run.logs()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let t_assigned = Instant::now();

        // The client's probes are answered.
        let prober = Prober::start(
            &run.lab.client_netns,
            SocketAddr::new(ip, PROBE_PORT),
            Duration::from_millis(10),
        )
        .expect("prober");
        let deadline = Instant::now() + STAGE;
        let first = loop {
            let first = prober
                .snapshot()
                .into_iter()
                .filter_map(|r| r.answer)
                .min_by_key(|(_, at)| *at);
            if let Some(first) = first {
                break first;
            }
            assert!(
                Instant::now() < deadline,
                "no probe to {ip} was answered within {STAGE:?}\n{}",
                run.logs()
            );
            std::thread::sleep(Duration::from_millis(5));
        };

        // One owner: every speaker, each seeing every node, names it; it answers; the record
        // names it. Agreement comes first: a speaker still waiting for the gossip key (the
        // controller makes it during the apply) leaves a half-formed mesh whose owner answers
        // steadily until the last node joins and the address moves.
        let agreed = kubelab::wait_for_owner(&run.lab, &ip.to_string(), STAGE, |o| o.is_some())
            .unwrap_or_else(|views| {
                panic!(
                    "the speakers never agreed on an owner of {ip}: {views:?}\n{}",
                    run.logs()
                )
            })
            .expect("an owner");
        let deadline = Instant::now() + STAGE;
        let owner = loop {
            let steady = failover::wait_for_steady_owner(&prober, 50, STAGE)
                .unwrap_or_else(|e| panic!("{e:#}\n{}", run.logs()));
            if steady == agreed {
                break steady;
            }
            assert!(
                Instant::now() < deadline,
                "{steady} answers {ip} steadily, but every speaker names {agreed}\n{}",
                run.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let (recorded, _) = run
            .cluster
            .wait_record(APPS, "web", STAGE, |n| n == owner)
            .unwrap_or_else(|| {
                panic!(
                    "no ServiceL2Status names {owner}: {:?}\n{}",
                    run.cluster.records(),
                    run.logs()
                )
            });
        assert_eq!(recorded, owner);

        // Every Pod ready, none restarted; the controller made the gossip key.
        let kubelet = run.kubelet.as_ref().expect("started");
        if let Err(pending) = kubelet.wait_ready(STAGE) {
            panic!("Pods not ready: {pending:#?}\n{}", run.logs());
        }
        for (pod, node, state) in kubelet.pods() {
            assert_eq!(
                state.restarts,
                0,
                "{pod} on {node} restarted ({:?})\n{}",
                state.last_stop,
                run.logs()
            );
        }
        assert!(
            run.cluster
                .api()
                .get("secrets", Some(NAMESPACE), "swimlb-gossip-key")
                .is_some(),
            "the controller made no gossip key Secret"
        );
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
    let pods = run.kubelet.as_ref().expect("started").pods();

    // The README's checks, with kubectl. The fake API server's tables have no printer
    // columns: the columns a real server would print come from the CRD (and, for Pods, the
    // usual ones), evaluated by kubectl.
    let crd = run
        .cluster
        .api()
        .get(
            "customresourcedefinitions.apiextensions.k8s.io",
            None,
            "servicel2statuses.swimlb.io",
        )
        .expect("the ServiceL2Status CRD");
    let mut record_columns = vec!["NAME:.metadata.name".to_string()];
    for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let header = c["name"]
            .as_str()
            .unwrap_or("?")
            .to_uppercase()
            .replace(' ', "_");
        record_columns.push(format!("{header}:{}", c["jsonPath"].as_str().unwrap_or("")));
    }
    let pod_columns = "NAME:.metadata.name,READY:.status.containerStatuses[0].ready,\
        STATUS:.status.phase,RESTARTS:.status.containerStatuses[0].restartCount,\
        IP:.status.podIP,NODE:.spec.nodeName";
    let records = format!("custom-columns={}", record_columns.join(","));
    let pods_columns = format!("custom-columns={pod_columns}");
    for args in [
        ["-n", NAMESPACE, "get", "pods", "-o", &pods_columns],
        ["-n", NAMESPACE, "get", "servicel2statuses", "-o", &records],
    ] {
        let out = kubectl.run(&args, None).unwrap_or_else(|e| panic!("{e:#}"));
        eprintln!("$ kubectl {}\n{out}", args.join(" "));
        if args[3] == "servicel2statuses" {
            let line = out.lines().nth(1).unwrap_or_default();
            assert!(line.contains(&owner) && line.contains("web"), "{out}");
        }
    }

    // `kubectl exec ds/swimlb-speaker -- swimlb-speaker status` (README): the speaker's own
    // command in the owner's namespace, its default address.
    let node = run
        .lab
        .nodes
        .iter()
        .find(|n| n.name == owner)
        .expect("the owner is a lab node");
    let status = run
        .lab
        .run_in(
            &node.netns,
            &program().to_string_lossy(),
            &["speaker", "status"],
        )
        .unwrap_or_else(|e| panic!("swimlb-speaker status on {owner}: {e:#}"));
    eprintln!("$ swimlb-speaker status   (on {owner})\n{status}");
    assert!(status.contains(&ip.to_string()), "{status}");

    // Each container runs with the user and capabilities its securityContext names: the
    // speaker as root with NET_RAW alone, the controller as 65532 with none.
    for (pod, _, state) in &pods {
        let pid = state.pid.unwrap_or_else(|| panic!("{pod} runs no process"));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
                .unwrap_or_default()
        };
        let (uid, caps) = (field("Uid:"), field("CapEff:"));
        eprintln!("{pod}: uid {uid}, effective capabilities {caps}");
        if pod.starts_with("swimlb-speaker-") {
            assert_eq!((uid.as_str(), caps.as_str()), ("0", "0000000000002000"));
        } else {
            assert_eq!((uid.as_str(), caps.as_str()), ("65532", "0000000000000000"));
        }
    }

    // Every request the Pods made under their service accounts is one the applied RBAC allows.
    let api = run.cluster.api();
    let mut rbac_objects = Vec::new();
    for resource in [
        "clusterroles",
        "clusterrolebindings",
        "roles",
        "rolebindings",
    ] {
        rbac_objects.extend(
            api.objects(&format!("{resource}.rbac.authorization.k8s.io"))
                .expect("RBAC objects"),
        );
    }
    let log = api.requests();
    let mut accounts: Vec<String> = pods
        .iter()
        .filter_map(|(pod, _, _)| api.get("pods", Some(NAMESPACE), pod))
        .filter_map(|p| p["spec"]["serviceAccountName"].as_str().map(str::to_string))
        .collect();
    accounts.sort();
    accounts.dedup();
    for account in &accounts {
        let grants =
            rbac::Grants::of(&rbac_objects, NAMESPACE, account).unwrap_or_else(|e| panic!("{e:#}"));
        let audit = rbac::audit(&grants, &log, account);
        assert!(audit.requests > 0, "no request came as {account}");
        assert!(
            audit.denied.is_empty(),
            "the applied RBAC refuses requests of {account}:\n{:#?}",
            audit.denied
        );
        eprintln!(
            "{account}: {} requests, all allowed; used: {}",
            audit.requests,
            audit.used.iter().cloned().collect::<Vec<_>>().join(", ")
        );
        for rule in &audit.unused {
            eprintln!("  granted, not needed in this run: {rule:?}");
        }
    }

    eprintln!("from the start of `kubectl apply` (first probe answered by {first_answerer}):");
    eprintln!(
        "  {}  kubectl apply --server-side -f deploy/swimlb.yaml returned",
        since(t0, Some(*t_applied))
    );
    for (pod, node, state) in &pods {
        eprintln!(
            "  {}  {pod} on {node} started; gossip key mounted {}; ready {}",
            since(t0, state.started),
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
        .get("secrets", Some(NAMESPACE), "swimlb-gossip-key")
        .expect("the gossip key Secret");
    let bytes: k8s_openapi::ByteString =
        serde_json::from_value(secret["data"]["keys"].clone()).expect("base64 data");
    String::from_utf8(bytes.0).expect("a key file is text")
}

/// How many times the log of `pod` says its keys were replaced.
fn replacements(run: &Bare, pod: &str) -> usize {
    let log = run
        .kubelet
        .as_ref()
        .and_then(|k| k.log_of(pod))
        .unwrap_or_default();
    log.matches("gossip keys replaced").count()
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
        .as_ref()
        .expect("started")
        .pods()
        .into_iter()
        .map(|(pod, _, _)| pod)
        .filter(|pod| pod.starts_with("swimlb-speaker-"))
        .collect();
    let start = Instant::now();
    // README, "Key rotation": the new key second, then first, then the old one dropped; each
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
    assert_eq!(gossip_keys(run).trim(), new);
}
