//! The Kubernetes source of the speaker: what the cluster's objects say should be served, and
//! what the speaker writes back.
//!
//! - [`records`]: the `ServiceL2Status` records of the Services this node announces.

pub mod records;
