//! swimlb configuration: the standalone file, the CRD types, and their validation.
//!
//! The types users write are read into validated models by pure conversions that report every
//! error at once, each with where it is.
//!
//! - [`standalone`]: the standalone speaker's file (`swimlb-speaker check-config FILE`).
//! - [`keyfile`]: the gossip key file.
//! - [`duration`]: `900ms`, `1s`, `1m30s`.

pub mod duration;
pub mod keyfile;
pub mod standalone;
