//! swimlb lab: network namespaces, the membership simulation, the end-to-end tests. The real
//! Kubernetes control plane they run on is its own dev crate, `swimlb-control-plane`
//! (`e2e/control-plane/`), re-exported here as [`control_plane`], [`kube_client`] and
//! [`kubectl`].
//!
//! Modules import only from layers below their own, so no two files import each other.
//!
//! Pure (no I/O):
//! - [`scrape`]: figures read out of a `/metrics` answer: samples, counters, histogram quantiles.
//! - [`rbac`]: what the API server's RBAC made of a user's requests, from its audit log.
//! - [`dashboard`]: the Grafana dashboard's panels and queries, with variables substituted.
//! - [`manifests`]: `deploy/swimlb.yaml` and the `PrometheusRule` rendered from their sources.
//! - [`metrics_doc`]: the book's metrics reference against what a `/metrics` exposes.
//! - [`sim`]: `swimlb-lab sim`, the deterministic membership simulation (on `simnet`).
//!
//! Tools and the network, beside the control plane:
//! - [`manifest_tools`]: `kubernetes-validate --strict` and `checkov` on `deploy/`.
//! - [`promtool`]: `promtool check metrics`, `check rules`, `test rules`.
//! - [`netns`]: the lab's network of namespaces, bridge and veths, torn down on every exit.
//! - [`probe`]: UDP responders, the client's prober and ARP asker; failover time from records.
//! - [`rest`]: a daemon's threads over a run, from `/proc`: CPU, wake-ups, syscalls.
//! - [`realnode`]: real nodes: containerd, the kubelet and kube-proxy in a node's namespace;
//!   MetalLB from its own images on them.
//! - [`service_failover`]: failover as a client of a LoadBalancer Service sees it, on real nodes.
//!
//! The lab's shared layer (imports no scenario):
//! - [`lab`]: the speakers' ports and HTTP reads, the daemons' views, MetalLB's rule, the
//!   announcement watcher, `/proc` usage.
//! - [`keepalived`]: keepalived's configuration, instances and VRRP state reader.
//! - [`kubelab`]: the Kubernetes lab: control plane on the bridge, controller, kube-proxy DNAT.
//! - [`daemons`]: the `Daemons` trait and its swimlb and keepalived implementations.
//! - [`converge`]: whether the lab has converged (one owner, named, alone answering).
//! - [`trial`]: a lab with daemons, the settle before a fault, the failover poll, percentiles.
//! - [`flood`]: paced floods from the client: frames, ARP requests, forged gossip.
//! - [`prometheus_lab`]: a real Prometheus server scraping the lab.
//!
//! Scenarios (each imports the layers above, not another scenario, except as noted):
//! - [`failover`]: `swimlb-lab failover`, repeated trials and their JSON report.
//! - [`pause`]: the pause scenarios of `swimlb-lab failover` (uses its options).
//! - [`soak`]: `swimlb-lab soak`, no fault: false failovers and the speakers' cost at rest.
//! - [`demo`]: `swimlb-lab demo`, one failover with its timeline (standalone, or on real nodes
//!   with swimlb or MetalLB).
//! - [`migrate`]: `swimlb-lab migrate`, MetalLB replaced by swimlb by the book's commands.
//! - [`chaos`]: `swimlb-lab chaos`, seeded random faults with the invariants checked throughout.
//! - [`upgrade`]: a rolling upgrade across an envelope version, the speakers of the previous
//!   wire behaviour beside the current one, under the chaos checker (uses [`chaos`]).
//!
//! On top (each imports any module above):
//! - [`cli`]: `swimlb-lab`'s command line, and what each command runs.
//! - [`reference`]: the book's reference pages generated from the code (the command lines, the
//!   standalone file's keys, the CRD schemas), written by `swimlb-docgen`.
//!
//! From the control plane crate:
//! - [`control_plane`]: etcd, kube-apiserver, controller manager, scheduler, with their PKI.
//! - [`kube_client`]: a blocking `kube::Client` for any object as JSON.
//! - [`kubectl`]: the pinned `kubectl`, from a lab namespace or not.

pub use swimlb_control_plane::{control_plane, kube_client, kubectl};

pub mod chaos;
pub mod cli;
pub mod converge;
pub mod daemons;
pub mod dashboard;
pub mod demo;
pub mod failover;
pub mod flood;
pub mod handover;
pub mod keepalived;
pub mod kubelab;
pub mod lab;
pub mod manifest_tools;
pub mod manifests;
pub mod metrics_doc;
pub mod migrate;
pub mod netns;
pub mod pause;
pub mod probe;
pub mod prometheus_lab;
pub mod promtool;
pub mod rbac;
pub mod realnode;
pub mod reference;
pub mod rest;
pub mod scrape;
pub mod service_failover;
pub mod sim;
pub mod soak;
pub mod trial;
pub mod upgrade;
