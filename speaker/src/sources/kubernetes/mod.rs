//! The Kubernetes source of the speaker: what the reflector caches (Services, EndpointSlices,
//! Nodes, `IPAddressPool`s, `L2Advertisement`s) say should be served, with MetalLB's layer-2
//! semantics, and what the speaker writes back.
//!
//! - [`cli`]: the flags of `swimlb-speaker kubernetes`, validated at once.
//! - [`run`]: the loop: reflectors in, the shared engine and drivers, records out.
//! - [`snapshot`]: the caches to a [`Snapshot`](crate::model::snapshot::Snapshot), pure, with every
//!   object left out named in a typed [`Dropped`](snapshot::Dropped).
//! - [`records`]: the `ServiceL2Status` records of the Services this node announces.
//! - [`watch`]: the reflector stores, trimmed, and a [`Change`](watch::Change) per event.
//! - [`compact`]: the Service and EndpointSlice caches, kept compact.
//! - [`metrics`]: watch and write errors, event handling time, drops.
//! - [`views`]: the cached Services and EndpointSlices, only the fields read.
//! - [`events`]: `nodeAssigned` and the warnings, written without kube's caching `Recorder`.
//! - [`hedge`]: a slow write sent again beside the first, on another connection.

pub mod cli;
pub mod compact;
pub mod events;
pub mod hedge;
pub mod metrics;
pub mod records;
mod records_task;
pub mod run;
pub mod snapshot;
pub mod views;
pub mod watch;
