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
