//! swimlb lab: network namespaces, the membership simulation, the fake Kubernetes API server.
