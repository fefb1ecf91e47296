//! The real control plane the Kubernetes tests run on (`swimlb_e2e::control_plane`), started on
//! the loopback interface (no root needed): it is the pinned release, it authorizes with RBAC
//! and the Node authorizer, its controllers run, and its audit log records who did what.
//!
//! The programs come from `e2e/k8s/build.sh` (`test.sh` builds them first and exports
//! `SWIMLB_K8S_BIN`); without Go and the module proxy these tests fail, they never skip.

use std::time::Duration;

use serde_json::json;
use swimlb_control_plane::test_plane::TestPlane;
use swimlb_e2e::control_plane::Options;
use swimlb_e2e::kube_client::{Kube, is_status};
use swimlb_e2e::kubectl::{Kubectl, Source};

fn start(test: &str, nodes: &[&str]) -> TestPlane {
    let options = Options {
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        ..Options::default()
    };
    TestPlane::start(test, &options).unwrap_or_else(|e| panic!("starting the control plane: {e:#}"))
}

#[test]
fn the_pinned_release_serves_and_its_controllers_make_endpoint_slices() {
    let plane = start("serves", &[]);
    assert_eq!(plane.server_version().unwrap(), "v1.37.2");
    let admin = plane.admin();
    admin
        .create(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"ports": [{"port": 80}], "selector": {"app": "web"}}}))
        .unwrap();
    let service = admin
        .get("v1", "Service", Some("default"), "web")
        .unwrap()
        .expect("the Service");
    let cluster_ip = service["spec"]["clusterIP"].as_str().unwrap().to_string();
    assert!(
        cluster_ip.starts_with("192.0.2."),
        "cluster IP {cluster_ip} from the documentation range"
    );
    // The EndpointSlice controller of the real kube-controller-manager.
    plane
        .wait_for(
            Duration::from_secs(30),
            "the Service's EndpointSlice",
            |kube| {
                Ok(kube
                    .list("discovery.k8s.io/v1", "EndpointSlice", Some("default"))?
                    .iter()
                    .any(|s| s["metadata"]["labels"]["kubernetes.io/service-name"] == "web"))
            },
        )
        .unwrap();
}

#[test]
fn a_kubelet_may_write_only_its_own_node_and_the_audit_log_says_who_asked() {
    let plane = start("authz", &["node1", "node2"]);
    let node1 = Kube::from_kubeconfig(&plane.kubelet_kubeconfig("node1")).unwrap();
    let node = |name: &str| json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
    node1
        .create(node("node1"))
        .expect("a kubelet registers its own Node");
    let err = node1
        .create(node("node2"))
        .expect_err("NodeRestriction refuses another node's Node");
    assert!(is_status(&err, 403), "forbidden, not {err:#}");
    let err = node1
        .list("v1", "Secret", None)
        .expect_err("the Node authorizer refuses listing every Secret");
    assert!(is_status(&err, 403), "forbidden, not {err:#}");
    let audit = plane.audit().unwrap();
    assert!(
        audit.iter().any(|r| r.user == "system:node:node1"
            && r.verb == "create"
            && r.resource == "nodes"
            && r.code == 201),
        "the audit log holds node1's create"
    );
    assert!(
        audit
            .iter()
            .any(|r| r.user == "system:node:node1" && r.resource == "secrets" && r.code == 403),
        "the audit log holds node1's refused list"
    );
}

#[test]
fn the_api_server_stops_and_comes_back_with_its_objects() {
    let mut plane = start("restart", &[]);
    plane
        .admin()
        .create(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "kept"}}))
        .unwrap();
    plane.stop_apiserver().unwrap();
    assert!(
        plane.admin().raw_text("/readyz").is_err(),
        "nothing answers while the API server is stopped"
    );
    plane.start_apiserver().unwrap();
    assert!(
        plane
            .admin()
            .get("v1", "Namespace", None, "kept")
            .unwrap()
            .is_some(),
        "etcd kept the Namespace"
    );
}

#[test]
fn deploy_swimlb_yaml_applies_with_real_kubectl_and_the_real_controllers_place_its_pods() {
    let nodes = ["node1", "node2", "node3"];
    let plane = start("apply", &nodes);
    for (i, node) in nodes.iter().enumerate() {
        plane
            .register_node(node, std::net::IpAddr::from([198, 51, 100, 11 + i as u8]))
            .unwrap_or_else(|e| panic!("registering {node}: {e:#}"));
    }
    let kubectl = Kubectl::new(
        None,
        &plane.admin_kubeconfig(),
        &plane.path().join("kubectl"),
    );
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/swimlb.yaml");
    kubectl
        .apply(Source::File(&manifest))
        .unwrap_or_else(|e| panic!("kubectl apply --server-side: {e:#}"));
    // The DaemonSet controller makes one speaker Pod per Node and the scheduler binds each;
    // the Deployment's ReplicaSet makes the controller's Pods, which the scheduler places.
    let bound = |kube: &Kube, component: &str| -> anyhow::Result<Vec<String>> {
        let mut nodes: Vec<String> = kube
            .list("v1", "Pod", Some("swimlb-system"))?
            .iter()
            .filter(|p| p["metadata"]["labels"]["app.kubernetes.io/component"] == component)
            .filter_map(|p| p["spec"]["nodeName"].as_str().map(str::to_string))
            .collect();
        nodes.sort();
        Ok(nodes)
    };
    plane
        .wait_for(
            Duration::from_secs(60),
            "a speaker Pod bound to every node",
            |kube| Ok(bound(kube, "speaker")? == nodes),
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    let deployment = plane
        .admin()
        .get(
            "apps/v1",
            "Deployment",
            Some("swimlb-system"),
            "swimlb-controller",
        )
        .unwrap()
        .expect("the controller's Deployment");
    let replicas = deployment["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
    plane
        .wait_for(
            Duration::from_secs(60),
            "every controller Pod bound",
            |kube| Ok(bound(kube, "controller")?.len() == replicas),
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
}

#[test]
fn invalid_pools_advertisements_and_records_are_refused_by_the_api_server_itself() {
    let plane = start("invalid", &[]);
    plane.install_crds().unwrap_or_else(|e| panic!("{e:#}"));
    plane
        .admin()
        .create(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "swimlb-system"}}))
        .unwrap();
    let kubectl = plane.kubectl();
    let object = |kind: &str, body: &str| {
        format!(
            "apiVersion: swimlb.io/v1beta1\nkind: {kind}\nmetadata:\n  name: bad\n  namespace: swimlb-system\n{body}"
        )
    };
    // (what is wrong, the manifest, the field the API server's answer names)
    let cases = [
        (
            "addresses as a string",
            object("IPAddressPool", "spec:\n  addresses: 192.0.2.0/24\n"),
            "spec.addresses",
        ),
        (
            "autoAssign not a boolean",
            object(
                "IPAddressPool",
                "spec:\n  addresses: [192.0.2.0/24]\n  autoAssign: sometimes\n",
            ),
            "spec.autoAssign",
        ),
        (
            "a misspelt field",
            object("IPAddressPool", "spec:\n  adresses: [192.0.2.0/24]\n"),
            "adresses",
        ),
        ("a pool without spec", object("IPAddressPool", ""), "spec"),
        (
            "interfaces as a string",
            object("L2Advertisement", "spec:\n  interfaces: eth0\n"),
            "spec.interfaces",
        ),
        (
            "a selector requirement without its key",
            object(
                "L2Advertisement",
                "spec:\n  nodeSelectors:\n    - matchExpressions:\n        - {operator: In, values: [a]}\n",
            ),
            "key",
        ),
        (
            "a record without spec",
            object("ServiceL2Status", ""),
            "spec: Required value",
        ),
    ];
    let mut accepted = Vec::new();
    for (what, manifest, field) in &cases {
        match kubectl.apply(Source::Text(manifest)) {
            Ok(out) => accepted.push(format!("{what}: accepted ({})", out.trim())),
            Err(e) => {
                let message = format!("{e:#}");
                assert!(
                    message.contains(field),
                    "{what}: the refusal names {field}: {message}"
                );
            }
        }
    }
    assert!(accepted.is_empty(), "accepted: {accepted:#?}");
}

#[test]
fn a_compacted_etcd_answers_an_old_resource_version_with_410_gone() {
    let mut plane = start("compaction", &[]);
    let old = plane
        .admin()
        .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "before", "namespace": "default"}}))
        .unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    for i in 0..5 {
        plane
            .admin()
            .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("after-{i}"), "namespace": "default"}}))
            .unwrap();
    }
    // With the API server down nothing is written: the second compaction finds the history
    // compacted to the current revision already, which is no error (chaos seed 3 met it).
    plane.kill_apiserver().unwrap();
    let revision = plane.compact_etcd().unwrap();
    assert!(revision > old.parse::<u64>().unwrap());
    assert_eq!(plane.compact_etcd().unwrap(), revision);
    // A restarted API server's watch cache starts at the current version: a list at the old
    // one must come from etcd's history, which is gone.
    plane.start_apiserver().unwrap();
    let err = plane
        .admin()
        .raw_text(&format!(
            "/api/v1/namespaces/default/configmaps?resourceVersion={old}&resourceVersionMatch=Exact"
        ))
        .expect_err("a list at a compacted resourceVersion");
    assert!(is_status(&err, 410), "410 Gone, not {err:#}");
}
