//! swimlb lab: network namespaces, the membership simulation, the fake Kubernetes API server.
//!
//! - [`netns`]: the lab's network of namespaces, bridge and veths, torn down on every exit.

pub mod netns;
