//! swimlb controller: assigns LoadBalancer Service IPs from address pools.

pub mod allocator;
pub mod cli;
pub mod gossip_key;
pub mod http;
pub mod metrics;
pub mod reconcile;
pub mod run;
pub mod stray_pools;
