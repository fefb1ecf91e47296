//! swimlb configuration: the standalone file, the CRD types, and their validation.

#[cfg(feature = "kube")]
pub mod crd;
#[cfg(feature = "kube")]
pub mod pools;
#[cfg(feature = "kube")]
pub mod selector;
