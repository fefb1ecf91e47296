//! swimlb lab: network namespaces, the membership simulation, the end-to-end tests. The real
//! Kubernetes control plane they run on is its own dev crate, `swimlb-control-plane`
//! (`e2e/control-plane/`), re-exported here as [`control_plane`], [`kube_client`] and
//! [`kubectl`].
//!
//! - [`chaos`]: `swimlb-lab chaos`, seeded random faults, several at a time, with the invariants
//!   (one answerer per VIP, no long dark VIP, agreement, the rule's owner, no crash, no leak)
//!   checked the whole time.
//! - [`control_plane`]: the real Kubernetes control plane (etcd, kube-apiserver,
//!   kube-controller-manager, kube-scheduler) built from pinned Go modules, with its PKI.
//! - [`converge`]: whether the lab has converged (one owner, named by the daemons, alone
//!   answering for the VIP), so that a fault may be measured.
//! - [`dashboard`]: the Grafana dashboard's panels and queries, with variables substituted.
//! - [`demo`]: `swimlb-lab demo`, one failover with its timeline.
//! - [`failover`]: the failover trials (`swimlb-lab failover`) and their JSON report.
//! - [`flood`]: paced floods from the client: frames, ARP requests for the VIP, forged gossip.
//! - [`keepalived`]: keepalived as the comparison peer.
//! - [`kubelab`]: the Kubernetes lab: the real control plane on the lab bridge, the controller,
//!   speakers in Kubernetes mode, kube-proxy's DNAT; the apply lab's bare cluster.
//! - [`kube_client`]: a blocking `kube::Client` for any object as JSON.
//! - [`kubectl`]: the pinned `kubectl`, from a lab namespace or not.
//! - [`kubelet`]: the apply lab's kubelets: the Pods the real control plane binds to the lab's
//!   nodes, run from their specs in mount and network namespaces of their own.
//! - [`manifest_tools`]: `kubernetes-validate --strict` and `checkov` on `deploy/`, failing on
//!   any report.
//! - [`manifests`]: `deploy/swimlb.yaml` and the `PrometheusRule` rendered from their sources.
//! - [`metallb`]: MetalLB beside swimlb in the Kubernetes lab, from its own manifest, its Pods
//!   run by the lab's kubelets.
//! - [`metrics_doc`]: the README's metrics table against what a `/metrics` exposes.
//! - [`netns`]: the lab's network of namespaces, bridge and veths, torn down on every exit.
//! - [`pause`]: the pause scenarios of `swimlb-lab failover`: a speaker not scheduled for 2 s.
//! - [`probe`]: UDP responders on the nodes and the client's prober; failover time from their
//!   records.
//! - [`prometheus_lab`]: a real Prometheus server scraping the lab, for the dashboard's queries.
//! - [`promtool`]: `promtool check metrics`, `check rules`, `test rules`, failing on any report.
//! - [`rbac`]: what the API server's RBAC made of a user's requests, from its audit log.
//! - [`scrape`]: figures read out of a `/metrics` answer: samples, counters by label, a
//!   histogram's quantile from its buckets.
//! - [`sim`]: `swimlb-lab sim`, the deterministic membership simulation.
//! - [`soak`]: `swimlb-lab soak`, no fault: false failovers and the speakers' cost at rest.

pub use swimlb_control_plane::{control_plane, kube_client, kubectl};

pub mod chaos;
pub mod converge;
pub mod daemons;
pub mod dashboard;
pub mod demo;
pub mod failover;
pub mod flood;
pub mod keepalived;
pub mod kubelab;
pub mod kubelet;
pub mod lab;
pub mod manifest_tools;
pub mod manifests;
pub mod metallb;
pub mod metrics_doc;
pub mod netns;
pub mod pause;
pub mod probe;
pub mod prometheus_lab;
pub mod promtool;
pub mod rbac;
pub mod scrape;
pub mod sim;
pub mod soak;
pub mod trial;
