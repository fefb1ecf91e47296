//! The Kubernetes source of the speaker: what the reflector caches (Services, EndpointSlices,
//! Nodes, `IPAddressPool`s, `L2Advertisement`s) say should be served, with MetalLB's layer-2
//! semantics.
//!
//! - [`snapshot`]: the caches to a [`Snapshot`](crate::snapshot::Snapshot), pure, with every
//!   object left out named in a typed [`Dropped`](snapshot::Dropped).

pub mod snapshot;
