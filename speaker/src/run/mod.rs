//! Running a speaker, whatever its source.
//!
//! - [`daemon`]: the drivers around the engine: the gossip handle, the responders, the owner
//!   watch's events, the status board.
//! - `driver`: the one loop both sources run.
//! - [`hold`]: when a starting or paused node may answer (pure).

pub mod daemon;
pub(crate) mod driver;
pub mod hold;
