//! Running a speaker, whatever its source.
//!
//! - [`daemon`]: the drivers around the engine: the gossip handle, the responders, the owner
//!   watch's events, the status board.
//! - `driver`: the one loop both sources run.
//! - [`hold`]: when a starting or paused node may answer (pure).
//! - [`net_watch`]: the links and routes, dumped after every kernel notification.
//! - `successors`: whom the owner watch's plan sends heartbeats to.
//! - [`takeovers`]: the failover latency histogram.

pub mod daemon;
pub(crate) mod driver;
pub mod hold;
pub mod net_watch;
pub(crate) mod successors;
pub mod takeovers;
