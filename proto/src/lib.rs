//! swimlb's wire formats, with no I/O.
//!
//! Each module owns one format: a typed `Repr` with `parse`, `buffer_len` and `emit`, in the
//! manner of smoltcp's `wire` module. Parsing never panics and never allocates; every rejection
//! is an [`Error`] with a stable label for counting.
//!
//! - [`envelope`]: the AES-256-GCM gossip envelope and its [`KeyRing`].

pub mod envelope;
mod error;

pub use envelope::{KeyId, KeyRing};
pub use error::{Error, Result};
