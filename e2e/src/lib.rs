//! swimlb lab: network namespaces, the membership simulation, the fake Kubernetes API server.
pub mod fake_api;
