//! swimlb controller: assigns LoadBalancer Service IPs from address pools.

pub mod allocator;
pub mod metrics;
pub mod reconcile;
