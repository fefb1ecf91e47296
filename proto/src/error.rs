//! The one error type of `swimlb-proto`.
//!
//! Every parser and the envelope return [`Error`]. It is `Copy`, carries no heap data, and has a
//! stable [`Error::as_str`] used as a metric label (`swimlb_gossip_rejected_total{reason}`,
//! frame drop counters), so a caller can count a rejection without formatting anything.

/// Why bytes were rejected or could not be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The buffer is shorter than the structure it should hold.
    #[error("truncated")]
    Truncated,
    /// The output buffer is too small for what is being emitted.
    #[error("output buffer too small")]
    BufferTooSmall,
    /// The input is larger than the format allows; nothing else was examined.
    #[error("too large")]
    TooLarge,
    /// The envelope does not start with the swimlb magic bytes.
    #[error("wrong magic")]
    WrongMagic,
    /// The envelope carries a version this build does not speak.
    #[error("unsupported version {0}")]
    UnsupportedVersion(u8),
    /// The envelope was sealed with a key that is not in the key ring.
    #[error("unknown key id {0:02x?}")]
    UnknownKey([u8; 4]),
    /// AES-GCM authentication failed: wrong key, wrong cluster name, or tampered bytes.
    #[error("authentication failed")]
    AuthenticationFailed,
    /// A key ring was built without keys, with a duplicate key, or with a bad cluster name.
    #[error("invalid key ring: {0}")]
    InvalidKeyRing(&'static str),
}

impl Error {
    /// A short, stable, lowercase name for logs and metric labels.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Error::Truncated => "truncated",
            Error::BufferTooSmall => "buffer_too_small",
            Error::TooLarge => "too_large",
            Error::WrongMagic => "wrong_magic",
            Error::UnsupportedVersion(_) => "unsupported_version",
            Error::UnknownKey(_) => "unknown_key",
            Error::AuthenticationFailed => "authentication_failed",
            Error::InvalidKeyRing(_) => "invalid_key_ring",
        }
    }
}

/// The result type of `swimlb-proto`.
pub type Result<T> = core::result::Result<T, Error>;
