//! Where what is served comes from.
//!
//! - [`standalone`]: VIP groups from a file, with [`checks`] and [`notify`] hooks, whose
//!   programs [`scripts`] vets and runs.
//! - [`kubernetes`]: Services, EndpointSlices, Nodes and MetalLB's CRDs from the API, and the
//!   records written back.
//! - [`config_report`]: what `check-config` prints about a standalone file.
//! - [`vrrp`]: what the standalone source tells the VRRP task ([`crate::vrrp`]).

pub mod checks;
pub mod config_report;
pub mod kubernetes;
pub mod notify;
pub mod scripts;
pub mod standalone;
pub mod vrrp;

use crate::gossip::Phase;

/// Readiness (`/readyz`, `/status` `ready`), both modes: the node has joined the mesh (gossip
/// phase `Active`: a member acknowledged it), or it has nobody to join (`alone`: a standalone
/// file with no peers, a cluster with no other speaker Pod). A node whose peers are all
/// unreachable stays `joining` (not ready) although it serves what it elects, alone: its view of
/// the cluster is unconfirmed. Draining is reported on its own.
pub fn ready(phase: Phase, alone: bool) -> bool {
    match phase {
        Phase::Active => true,
        Phase::Joining => alone,
        Phase::Left | Phase::Paused => false,
    }
}
