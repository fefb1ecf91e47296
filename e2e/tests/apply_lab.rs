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
//! The time from the start of `kubectl apply` to the first answered probe is printed, never
//! asserted. Needs root (network namespaces) and kubectl: `#[ignore = "needs root: ..."]`, run
//! with `--include-ignored` as `sudo ./test.sh` does, one lab at a time as the other lab tests.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use swimlb_e2e::kubectl::{Kubectl, Source};
use swimlb_e2e::kubelab::{self, APPS, Cluster, NAMESPACE};
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
    cluster: Cluster,
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
        let cluster =
            Cluster::start_empty(&lab, program(), lab.work_dir()).expect("the API server");
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

#[test]
#[ignore = "needs root: network namespaces"]
fn kubectl_apply_of_swimlb_yaml_alone_brings_a_load_balancer_ip_to_service() {
    let _one = one_lab("apply lab");
    let mut run = Bare::start(1);
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
    let (first_answerer, t_first) = loop {
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

    // One owner: it answers, every speaker names it, the record names it.
    let owner = failover::wait_for_steady_owner(&prober, 50, STAGE)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", run.logs()));
    let agreed = kubelab::wait_for_owner(&run.lab, &ip.to_string(), STAGE, |o| {
        o == Some(owner.as_str())
    })
    .unwrap_or_else(|views| {
        panic!(
            "the speakers do not all name {owner} for {ip}: {views:?}\n{}",
            run.logs()
        )
    });
    assert_eq!(agreed.as_deref(), Some(owner.as_str()));
    let (recorded, _) = run
        .cluster
        .wait_record(APPS, "web", STAGE, |n| n == owner)
        .unwrap_or_else(|| {
            panic!(
                "no ServiceL2Status names {owner}: {:?}\n{}",
                run.cluster.records().all(),
                run.logs()
            )
        });
    assert_eq!(recorded, owner);

    // Every Pod ready, none restarted; the controller made the gossip key.
    let kubelet = run.kubelet.as_ref().expect("started");
    if let Err(pending) = kubelet.wait_ready(STAGE) {
        panic!("Pods not ready: {pending:#?}\n{}", run.logs());
    }
    let pods = kubelet.pods();
    for (pod, node, state) in &pods {
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
        since(t0, Some(t_applied))
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
        since(t0, Some(t_assigned))
    );
    eprintln!(
        "  {}  first probe to {ip} answered (by {first_answerer}): apply -> serving",
        since(t0, Some(t_first))
    );
    eprintln!("  owner {owner}, named by every speaker and by its ServiceL2Status");
}
