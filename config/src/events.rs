//! The reasons of the Kubernetes Events swimlb writes, one closed list for the controller and the
//! speaker, so a reason is never a string made up at the call site and the book's
//! troubleshooting page can be checked to explain every one of them.

/// Why an Event was written (its `reason` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// The controller gave a Service its addresses (Normal, on the Service).
    IpAllocated,
    /// The controller could not give a Service what it asks for (Warning, on the Service).
    AllocationFailed,
    /// A Service keeps addresses that no pool in force holds any more (Warning, on the Service).
    AddressOutsidePools,
    /// A pool outside the configuration namespace is ignored (Warning, on the pool).
    IgnoredOutsideNamespace,
    /// A pool or an advertisement is invalid (Warning, on the object).
    InvalidConfiguration,
    /// A speaker announces a Service from its node (Normal, on the Service).
    NodeAssigned,
    /// An advertisement names an interface a node does not have (Warning).
    UnknownInterface,
}

impl Reason {
    /// Every reason, in the order of the troubleshooting page.
    pub const ALL: [Reason; 7] = [
        Reason::AddressOutsidePools,
        Reason::AllocationFailed,
        Reason::IgnoredOutsideNamespace,
        Reason::InvalidConfiguration,
        Reason::IpAllocated,
        Reason::NodeAssigned,
        Reason::UnknownInterface,
    ];

    /// The Event's `reason` as written to the API (MetalLB's spelling where MetalLB has one).
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::IpAllocated => "IPAllocated",
            Reason::AllocationFailed => "AllocationFailed",
            Reason::AddressOutsidePools => "AddressOutsidePools",
            Reason::IgnoredOutsideNamespace => "IgnoredOutsideNamespace",
            Reason::InvalidConfiguration => "InvalidConfiguration",
            Reason::NodeAssigned => "nodeAssigned",
            Reason::UnknownInterface => "UnknownInterface",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_listed_once_with_its_own_spelling() {
        let mut spellings: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        spellings.sort_unstable();
        spellings.dedup();
        assert_eq!(spellings.len(), Reason::ALL.len());
    }
}
