//! What serves humans.
//!
//! - [`http`]: `/metrics`, `/healthz`, `/readyz`, `/status`.
//! - [`status`]: `/status` and the owner gauges, from the engine's deltas.
//! - [`status_table`]: `swimlb-speaker status`: a running speaker's `/status` as tables.
//! - [`process_metrics`]: `swimlb_build_info` and `swimlb_ready`.
//! - [`memory`]: fewer malloc arenas and free pages handed back (`unsafe`: libc calls).

pub mod http;
pub mod memory;
pub mod process_metrics;
pub mod status;
pub mod status_table;
