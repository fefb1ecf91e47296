//! The entry points of the fuzz targets in `speaker/fuzz/`: arbitrary bytes through what a user
//! or the API server hands the speaker, checking on the way what must hold for every input.
//! `speaker/tests/fuzz_seeds.rs` replays every seed through the same functions in a stable
//! `cargo test`.
//!
//! Each returns a summary of what it found (for the replay test to assert on) and panics only
//! when a property below fails, which is what the fuzzer looks for (besides panics in the code
//! under test).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use serde::de::DeserializeOwned;
use serde_json::Value;
use swimlb_config::crd::{IPAddressPool, L2Advertisement};
use swimlb_config::standalone::Standalone;

use crate::sources::kubernetes::snapshot::{Built, Caches, Keeper, Options, build, trim_node};
use crate::sources::kubernetes::views::{ServiceView, SliceView, trim_service, trim_slice};

/// What `swimlb-speaker check-config` decides on a file's bytes, but for the key file (a path
/// the fuzzer picks is not read): `Ok` with the report, or every error. Properties: an invalid
/// file has at least one error; a valid one serves each of its addresses once.
pub fn standalone_file(bytes: &[u8]) -> Result<String, Vec<String>> {
    let text = std::str::from_utf8(bytes).map_err(|e| vec![format!("(file): {e}")])?;
    let config = match Standalone::parse(text) {
        Ok(config) => config,
        Err(errors) => {
            assert!(!errors.0.is_empty(), "an invalid file without an error");
            return Err(errors.0.iter().map(ToString::to_string).collect());
        }
    };
    let served = crate::sources::standalone::snapshot(&config);
    let addresses: BTreeSet<_> = config.addresses().map(|(_, ip)| ip).collect();
    assert_eq!(
        served.iter().count(),
        config.addresses().count(),
        "a valid file lists an address twice"
    );
    assert_eq!(served.iter().count(), addresses.len());
    match crate::sources::config_report::start_refusals(&config) {
        (problems, Some(timing)) if problems.is_empty() => {
            Ok(crate::sources::config_report::report(&config, &timing))
        }
        (problems, _) => {
            assert!(!problems.is_empty(), "timings refused without a reason");
            Err(problems)
        }
    }
}

/// The Kubernetes objects of one JSON document, as the speaker's watches would hand them over:
/// `{"services": [...], "endpointSlices": [...], "nodes": [...], "ipAddressPools": [...],
/// "l2Advertisements": [...]}` (every key optional). An element that does not deserialize is
/// left out, as a watch drops it.
#[derive(Debug, Default, Clone)]
pub struct Objects {
    /// Services.
    pub services: Vec<ServiceView>,
    /// EndpointSlices.
    pub endpoint_slices: Vec<SliceView>,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// IPAddressPools.
    pub pools: Vec<IPAddressPool>,
    /// L2Advertisements.
    pub advertisements: Vec<L2Advertisement>,
    /// Elements left out because they do not deserialize.
    pub undecodable: usize,
}

impl Objects {
    /// Reads the document; `None` when it is not a JSON object.
    pub fn parse(bytes: &[u8]) -> Option<Objects> {
        let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(bytes) else {
            return None;
        };
        let mut objects = Objects::default();
        let mut undecodable = 0;
        let mut list = |key: &str| -> Vec<Value> {
            match doc.get(key) {
                Some(Value::Array(items)) => items.clone(),
                Some(_) => {
                    undecodable += 1;
                    Vec::new()
                }
                None => Vec::new(),
            }
        };
        let (services, slices, nodes, pools, ads) = (
            list("services"),
            list("endpointSlices"),
            list("nodes"),
            list("ipAddressPools"),
            list("l2Advertisements"),
        );
        objects.services = decode_all(services, &mut undecodable);
        objects.endpoint_slices = decode_all(slices, &mut undecodable);
        objects.nodes = decode_all(nodes, &mut undecodable);
        objects.pools = decode_all(pools, &mut undecodable);
        objects.advertisements = decode_all(ads, &mut undecodable);
        objects.undecodable = undecodable;
        Some(objects)
    }

    /// The objects trimmed as the reflector stores keep them.
    pub fn trimmed(&self) -> Objects {
        let mut t = self.clone();
        t.services.iter_mut().for_each(trim_service);
        t.endpoint_slices.iter_mut().for_each(trim_slice);
        t.nodes.iter_mut().for_each(trim_node);
        t
    }

    /// `f` over caches that hold these objects.
    fn with_caches<R>(&self, f: impl FnOnce(Caches<'_>) -> R) -> R {
        let services: Vec<&ServiceView> = self.services.iter().collect();
        let slices: Vec<&SliceView> = self.endpoint_slices.iter().collect();
        let nodes: Vec<&Node> = self.nodes.iter().collect();
        let pools: Vec<&IPAddressPool> = self.pools.iter().collect();
        let ads: Vec<&L2Advertisement> = self.advertisements.iter().collect();
        f(Caches {
            services: &services,
            endpoint_slices: &slices,
            nodes: &nodes,
            pools: &pools,
            advertisements: &ads,
        })
    }

    /// [`build`] over these objects.
    pub fn build(&self, options: &Options) -> Built {
        self.with_caches(|caches| build(caches, options))
    }

    /// The running speaker's [`Keeper`] after a re-list of these objects.
    pub fn keep(&self, options: &Options) -> Built {
        self.with_caches(|caches| {
            let mut keeper = Keeper::new(options.clone());
            keeper.resync(caches);
            keeper.built()
        })
    }
}

fn decode_all<T: DeserializeOwned>(items: Vec<Value>, undecodable: &mut usize) -> Vec<T> {
    items
        .into_iter()
        .filter_map(|item| {
            serde_json::from_value(item)
                .map_err(|_| *undecodable += 1)
                .ok()
        })
        .collect()
}

/// The speaker's snapshot of the objects in `bytes` ([`Objects`]), or `None` when the bytes are
/// not a JSON object. Properties: trimming the objects as the caches do changes nothing, and
/// the running speaker's [`Keeper`] agrees with [`build`].
pub fn kubernetes_views(bytes: &[u8]) -> Option<Built> {
    let objects = Objects::parse(bytes)?;
    let options = Options::default();
    let built = objects.build(&options);
    assert_eq!(
        objects.trimmed().build(&options),
        built,
        "trimming the cached objects changed the snapshot"
    );
    assert_eq!(
        objects.keep(&options),
        built,
        "the keeper and build disagree"
    );
    Some(built)
}
