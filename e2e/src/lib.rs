//! swimlb lab: network namespaces, the membership simulation, the fake Kubernetes API server.
//!
//! - [`netns`]: the lab's network of namespaces, bridge and veths, torn down on every exit.
//! - [`probe`]: UDP responders on the nodes and the client's prober; failover time from their records.

pub mod netns;
pub mod probe;
