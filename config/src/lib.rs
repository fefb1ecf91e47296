//! swimlb configuration: the standalone file, the CRD types, and their validation.
//!
//! The types users write are read into validated models by pure conversions that report every
//! error at once, each with where it is.
//!
//! - [`standalone`]: the standalone speaker's file (`swimlb-speaker check-config FILE`).
//! - [`keepalived`]: a keepalived.conf converted into the standalone file.
//! - [`keyfile`]: the gossip key file.
//! - [`duration`]: `900ms`, `1s`, `1m30s`.
//! - [`events`]: the reasons of the Kubernetes Events both daemons write.
//! - `crd` (feature `kube`): the `swimlb.io/v1beta1` custom resources.
//! - `metallb` (feature `kube`): MetalLB's layer-2 objects converted into swimlb's.
//! - `pools` (feature `kube`): address pools and advertisements, validated.
//! - `selector` (feature `kube`): Kubernetes label selectors.
//! - `service` (feature `kube`): what swimlb reads of a Service (`ServiceView`, `view_of`) and
//!   its trimming before it is cached.
//! - `reflect` (feature `kube`): caches of Kubernetes objects (trimmed reflector stores).
//! - `client` (feature `kube`): the Kubernetes API client both daemons use.
//! - `api_errors` (feature `kube`): the counters of failed Kubernetes API calls, by resource.
//! - `cli` (feature `cli`): the exit status of a refused command line, and the parse both
//!   daemons start with.

#[cfg(feature = "kube")]
pub mod api_errors;
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "kube")]
pub mod client;
#[cfg(feature = "kube")]
pub mod crd;
pub mod duration;
pub mod events;
pub mod keepalived;
pub mod keyfile;
#[cfg(feature = "kube")]
pub mod metallb;
#[cfg(feature = "kube")]
pub mod pools;
#[cfg(feature = "kube")]
pub mod reflect;
#[cfg(feature = "kube")]
pub mod selector;
#[cfg(feature = "kube")]
pub mod service;
pub mod standalone;
