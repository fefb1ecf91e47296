//! What the allocator answers: a [`Verdict`] per Service, or why it refused ([`AllocationError`]).

use std::net::IpAddr;

use swimlb_config::pools::Family;
use swimlb_config::service::ServiceKey;

/// Why a Service is not served by this allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotOurs {
    /// `spec.type` is not LoadBalancer.
    NotLoadBalancer,
    /// The `loadBalancerClass` differs from the one served.
    OtherClass,
}

impl NotOurs {
    /// The log word and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            NotOurs::NotLoadBalancer => "not_load_balancer",
            NotOurs::OtherClass => "other_class",
        }
    }
}

/// Why a Service got no addresses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    /// An address that does not parse, or an annotation with too many addresses.
    #[error("{field}: {value:?} is not a valid address list (one IP, or one per family)")]
    InvalidIp {
        /// The field or annotation.
        field: String,
        /// Its value.
        value: String,
    },
    /// Two fields or spellings of an annotation that disagree.
    #[error("{first} and {second} disagree")]
    ConflictingAnnotations {
        /// One field.
        first: String,
        /// The other field.
        second: String,
    },
    /// The named pool does not exist (or is invalid).
    #[error("unknown address pool {0:?}")]
    UnknownPool(String),
    /// The pool's `serviceAllocation` does not admit the Service.
    #[error("address pool {0:?} does not admit this service (serviceAllocation)")]
    PoolNotAllowed(String),
    /// A requested address is in no pool (or not in the named one, or a skipped buggy one).
    #[error("{0} is not in any usable address pool")]
    IpNotInPool(IpAddr),
    /// A requested address is held by a Service that may not share it.
    #[error("{ip} is in use by {holder} and cannot be shared")]
    IpInUse {
        /// The address.
        ip: IpAddr,
        /// A holder.
        holder: ServiceKey,
    },
    /// A requested address is of a family the Service does not have.
    #[error("{0} is of a family the service does not have (ipFamilies, ipFamilyPolicy)")]
    IpFamilyMismatch(IpAddr),
    /// Every usable pool is full.
    #[error("no free {} address in pool {pool:?}", family.as_str())]
    PoolExhausted {
        /// The last pool tried.
        pool: String,
        /// The family that ran out.
        family: Family,
    },
    /// No usable pool has the family.
    #[error("no usable address pool has {} addresses", .0.as_str())]
    FamilyUnavailable(Family),
    /// No pool is usable by this Service.
    #[error("no address pool is available to this service")]
    NoAvailablePool,
}

impl AllocationError {
    /// Its reason, the metric label.
    pub fn reason(&self) -> ErrorReason {
        match self {
            AllocationError::InvalidIp { .. } => ErrorReason::InvalidIp,
            AllocationError::ConflictingAnnotations { .. } => ErrorReason::ConflictingAnnotations,
            AllocationError::UnknownPool(_) => ErrorReason::UnknownPool,
            AllocationError::PoolNotAllowed(_) => ErrorReason::PoolNotAllowed,
            AllocationError::IpNotInPool(_) => ErrorReason::IpNotInPool,
            AllocationError::IpInUse { .. } => ErrorReason::IpInUse,
            AllocationError::IpFamilyMismatch(_) => ErrorReason::IpFamilyMismatch,
            AllocationError::PoolExhausted { .. } => ErrorReason::PoolExhausted,
            AllocationError::FamilyUnavailable(_) => ErrorReason::FamilyUnavailable,
            AllocationError::NoAvailablePool => ErrorReason::NoAvailablePool,
        }
    }

    /// The metric label (`swimlb_allocation_errors_total{reason}`).
    pub fn as_str(&self) -> &'static str {
        self.reason().as_str()
    }
}

/// The kind of an [`AllocationError`], without its details: the `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorReason {
    /// `invalid_ip`.
    InvalidIp,
    /// `conflicting_annotations`.
    ConflictingAnnotations,
    /// `unknown_pool`.
    UnknownPool,
    /// `pool_not_allowed`.
    PoolNotAllowed,
    /// `ip_not_in_pool`.
    IpNotInPool,
    /// `ip_in_use`.
    IpInUse,
    /// `ip_family_mismatch`.
    IpFamilyMismatch,
    /// `pool_exhausted`.
    PoolExhausted,
    /// `family_unavailable`.
    FamilyUnavailable,
    /// `no_available_pool`.
    NoAvailablePool,
}

impl ErrorReason {
    /// The label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorReason::InvalidIp => "invalid_ip",
            ErrorReason::ConflictingAnnotations => "conflicting_annotations",
            ErrorReason::UnknownPool => "unknown_pool",
            ErrorReason::PoolNotAllowed => "pool_not_allowed",
            ErrorReason::IpNotInPool => "ip_not_in_pool",
            ErrorReason::IpInUse => "ip_in_use",
            ErrorReason::IpFamilyMismatch => "ip_family_mismatch",
            ErrorReason::PoolExhausted => "pool_exhausted",
            ErrorReason::FamilyUnavailable => "family_unavailable",
            ErrorReason::NoAvailablePool => "no_available_pool",
        }
    }
}

/// The allocator's decision for one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The Service holds these addresses (in family order of the request), which differ from
    /// its status: write them.
    Assigned {
        /// The addresses.
        ips: Vec<IpAddr>,
        /// The pool they come from.
        pool: String,
    },
    /// The Service holds exactly the addresses its status shows.
    Unchanged,
    /// Not served by this allocator; anything it held is released (clear a status we wrote).
    NotOurs(NotOurs),
    /// Existing assignments are not loaded yet ([`Allocator::load_existing`]): nothing changed,
    /// try again later.
    NotLoaded,
    /// No addresses; anything it held is released.
    Error(AllocationError),
    /// The Service keeps these addresses although no pool in force has them (their pool is
    /// invalid or gone): write them if the status differs, and warn.
    Kept {
        /// The addresses.
        ips: Vec<IpAddr>,
    },
}

impl Verdict {
    /// The log word and metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Assigned { .. } => "assigned",
            Verdict::Unchanged => "unchanged",
            Verdict::NotOurs(_) => "not_ours",
            Verdict::NotLoaded => "not_loaded",
            Verdict::Error(_) => "error",
            Verdict::Kept { .. } => "kept",
        }
    }
}
