//! The real Kubernetes control plane under swimlb's Kubernetes tests, and the clients that talk
//! to it. A dev crate of its own, below both the speaker's tests and the lab (`swimlb-e2e`).
//!
//! - [`control_plane`]: etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built
//!   from the Go modules pinned in `e2e/k8s/` and run as processes, with their PKI.
//! - [`kube_client`]: a blocking `kube::Client` for any object as JSON, from any namespace.
//! - [`kubectl`]: the pinned `kubectl`, as an operator runs it.
//! - [`netns`]: entering a network namespace the lab made.
//! - [`test_plane`]: one test's control plane on the loopback, its folder removed when it passed.

pub mod control_plane;
pub mod kube_client;
pub mod kubectl;
pub mod netns;
pub mod test_plane;
