//! swimlb lab: network namespaces, the membership simulation, the fake Kubernetes API server.
//!
//! - [`sim`]: `swimlb-lab sim`, the deterministic membership simulation.

pub mod sim;
