//! MetalLB's layer-2 configuration turned into swimlb's (`swimlb-controller convert-metallb`).
//!
//! The input is what `kubectl get -o json` prints for MetalLB's `metallb.io/v1beta1`
//! `IPAddressPool`s and `L2Advertisement`s (a `List`, or one object); the output is a `v1` `List`
//! of the same objects in group `swimlb.io/v1beta1`, in swimlb's namespace, ready for
//! `kubectl apply`. The specs are read into swimlb's own types and validated as the controller
//! validates them, so what would be read differently is refused before anything moves: BGP
//! objects (swimlb is layer 2 only), fields swimlb does not know, two objects with one name,
//! and every error of [`crate::pools::validate`]. Objects the daemons write themselves
//! (`ServiceL2Status`, `ServiceBGPStatus`, `ConfigurationState`) are skipped and named.

use std::collections::BTreeSet;

use kube::api::ObjectMeta;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::crd::{IPAddressPool, IPAddressPoolSpec, L2Advertisement, L2AdvertisementSpec};
use crate::pools;

/// MetalLB's API group and the version of its layer-2 objects.
pub const METALLB_API_VERSION: &str = "metallb.io/v1beta1";

/// The annotation kubectl's client-side apply leaves; it describes the MetalLB object, not ours.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What [`convert`] made.
#[derive(Debug, Clone, PartialEq)]
pub struct Converted {
    /// A `v1` `List` of the swimlb objects.
    pub list: Value,
    /// The objects left out on purpose, each with why (`ServiceL2Status default/web: ...`).
    pub skipped: Vec<String>,
}

/// Converts `input` into swimlb's objects in `namespace`; every error at once otherwise.
pub fn convert(input: &Value, namespace: &str) -> Result<Converted, Vec<String>> {
    let items = match (input["kind"].as_str(), input["items"].as_array()) {
        (Some(kind), Some(items)) if kind.ends_with("List") => items.clone(),
        (Some(_), _) => vec![input.clone()],
        _ => {
            return Err(vec![
                "the input is neither a List nor a Kubernetes object".into(),
            ]);
        }
    };
    let mut errors = Vec::new();
    let mut skipped = Vec::new();
    let mut pools = Vec::new();
    let mut advertisements = Vec::new();
    let mut names = BTreeSet::new();
    for (i, item) in items.iter().enumerate() {
        let kind = item["kind"].as_str().unwrap_or("");
        let name = item["metadata"]["name"].as_str().unwrap_or("");
        let what = format!(
            "{kind} {}/{name}",
            item["metadata"]["namespace"].as_str().unwrap_or("")
        );
        if item["apiVersion"] != METALLB_API_VERSION {
            errors.push(format!(
                "item {i} ({what}): apiVersion {}, not MetalLB's {METALLB_API_VERSION}",
                item["apiVersion"]
            ));
            continue;
        }
        if name.is_empty() {
            errors.push(format!("item {i} ({kind}): no metadata.name"));
            continue;
        }
        if matches!(kind, "IPAddressPool" | "L2Advertisement") && !names.insert((kind, name)) {
            errors.push(format!(
                "{what}: a second {kind} named {name} (swimlb reads one namespace)"
            ));
            continue;
        }
        let metadata = metadata(item, namespace);
        match kind {
            "IPAddressPool" => match spec::<IPAddressPoolSpec>(item) {
                Ok(spec) => pools.push(IPAddressPool {
                    metadata,
                    spec,
                    status: None,
                }),
                Err(e) => errors.push(format!("{what}: {e}")),
            },
            "L2Advertisement" => match spec::<L2AdvertisementSpec>(item) {
                Ok(spec) => advertisements.push(L2Advertisement { metadata, spec }),
                Err(e) => errors.push(format!("{what}: {e}")),
            },
            "ServiceL2Status" | "ServiceBGPStatus" | "ConfigurationState" => skipped.push(format!(
                "{what}: written by MetalLB's daemons; swimlb's write their own"
            )),
            "BGPAdvertisement" | "BGPPeer" | "BFDProfile" | "Community" => {
                errors.push(format!("{what}: swimlb announces in layer 2 only (no BGP)"))
            }
            _ => errors.push(format!("{what}: not a kind swimlb converts")),
        }
    }
    errors.extend(
        pools::validate(&pools, &advertisements)
            .errors
            .iter()
            .map(|e| format!("as swimlb reads it: {e}")),
    );
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut out: Vec<Value> = pools.iter().map(|p| object(p, "IPAddressPool")).collect();
    out.extend(advertisements.iter().map(|a| object(a, "L2Advertisement")));
    Ok(Converted {
        list: json!({"apiVersion": "v1", "kind": "List", "items": out}),
        skipped,
    })
}

/// The object's name, labels and annotations (but kubectl's record of MetalLB's object; an
/// empty map left out), in `namespace`.
fn metadata(item: &Value, namespace: &str) -> ObjectMeta {
    let strings = |key: &str| {
        item["metadata"][key]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| k.as_str() != LAST_APPLIED)
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect::<std::collections::BTreeMap<_, _>>()
            })
            .filter(|m| !m.is_empty())
    };
    ObjectMeta {
        name: item["metadata"]["name"].as_str().map(str::to_string),
        namespace: Some(namespace.to_string()),
        labels: strings("labels"),
        annotations: strings("annotations"),
        ..ObjectMeta::default()
    }
}

/// `item`'s spec read as swimlb's `T`: an error when it does not parse, or when it names a
/// field `T` would drop.
fn spec<T: DeserializeOwned + Serialize>(item: &Value) -> Result<T, String> {
    let given = match &item["spec"] {
        Value::Null => Value::Object(Map::new()),
        spec => spec.clone(),
    };
    let spec: T = serde_json::from_value(given.clone()).map_err(|e| format!("spec: {e}"))?;
    let kept = serde_json::to_value(&spec).map_err(|e| format!("spec: {e}"))?;
    let mut dropped = Vec::new();
    dropped_fields(&given, &kept, "spec", &mut dropped);
    if dropped.is_empty() {
        Ok(spec)
    } else {
        Err(format!(
            "fields swimlb does not read: {}",
            dropped.join(", ")
        ))
    }
}

/// The paths of `given`'s fields with a value that `kept` lacks.
fn dropped_fields(given: &Value, kept: &Value, path: &str, out: &mut Vec<String>) {
    match (given, kept) {
        (Value::Object(g), Value::Object(k)) => {
            for (key, value) in g {
                let here = format!("{path}.{key}");
                match k.get(key) {
                    Some(kept) => dropped_fields(value, kept, &here, out),
                    None if !is_empty(value) => out.push(here),
                    None => {}
                }
            }
        }
        (Value::Array(g), Value::Array(k)) if g.len() == k.len() => {
            for (i, (g, k)) in g.iter().zip(k).enumerate() {
                dropped_fields(g, k, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// A value that says nothing (MetalLB's defaults print as such).
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// `resource` as a swimlb object of `kind`, without empty metadata.
fn object<T: Serialize>(resource: &T, kind: &str) -> Value {
    let mut value = serde_json::to_value(resource).unwrap_or(Value::Null);
    value["apiVersion"] = json!(format!("{}/{}", crate::crd::GROUP, crate::crd::VERSION));
    value["kind"] = json!(kind);
    if let Some(map) = value.as_object_mut() {
        map.retain(|_, v| !v.is_null());
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metallb(kind: &str, name: &str, spec: Value) -> Value {
        json!({"apiVersion": METALLB_API_VERSION, "kind": kind,
            "metadata": {"name": name, "namespace": "metallb-system", "uid": "u",
                "resourceVersion": "7", "labels": {"zone": "a"},
                "annotations": {LAST_APPLIED: "{}", "team": "net"}},
            "spec": spec, "status": {"assignedIPv4": 1}})
    }

    fn list(items: Vec<Value>) -> Value {
        json!({"apiVersion": "v1", "kind": "List", "items": items})
    }

    #[test]
    fn pools_and_advertisements_keep_their_fields_in_swimlbs_group_and_namespace() {
        let input = list(vec![
            metallb(
                "IPAddressPool",
                "lab",
                json!({"addresses": ["198.51.100.100/30"], "autoAssign": false,
                    "avoidBuggyIPs": true, "serviceAllocation": {"priority": 2,
                        "namespaces": ["apps"]}}),
            ),
            metallb(
                "L2Advertisement",
                "lab",
                json!({"ipAddressPools": ["lab"], "interfaces": ["eth0"],
                    "nodeSelectors": [{"matchLabels": {"rack": "1"}}]}),
            ),
            metallb("L2Advertisement", "all", Value::Null),
        ]);
        let out = convert(&input, "swimlb-system").unwrap();
        assert!(out.skipped.is_empty());
        let items = out.list["items"].as_array().unwrap();
        assert_eq!(items.len(), 3);
        let pool = &items[0];
        assert_eq!(pool["apiVersion"], "swimlb.io/v1beta1");
        assert_eq!(pool["kind"], "IPAddressPool");
        assert_eq!(
            pool["metadata"],
            json!({"name": "lab", "namespace": "swimlb-system", "labels": {"zone": "a"},
                "annotations": {"team": "net"}})
        );
        assert_eq!(pool["spec"]["addresses"], json!(["198.51.100.100/30"]));
        assert_eq!(pool["spec"]["autoAssign"], false);
        assert_eq!(pool["spec"]["avoidBuggyIPs"], true);
        assert_eq!(pool["spec"]["serviceAllocation"]["priority"], 2);
        assert!(pool.get("status").is_none(), "{pool}");
        let names: Vec<&str> = items[1..]
            .iter()
            .map(|a| a["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["lab", "all"]);
        assert_eq!(items[1]["spec"]["interfaces"], json!(["eth0"]));
        assert_eq!(items[2]["spec"], json!({}));
    }

    #[test]
    fn one_object_converts_and_statuses_are_skipped_with_a_reason() {
        let pool = metallb("IPAddressPool", "p", json!({"addresses": ["192.0.2.0/28"]}));
        assert_eq!(
            convert(&pool, "x").unwrap().list["items"][0]["metadata"]["namespace"],
            "x"
        );
        let status = metallb("ServiceL2Status", "l2-abc", json!({}));
        let out = convert(&list(vec![pool, status]), "x").unwrap();
        assert_eq!(out.list["items"].as_array().unwrap().len(), 1);
        assert_eq!(out.skipped.len(), 1);
        assert!(out.skipped[0].starts_with("ServiceL2Status metallb-system/l2-abc"));
    }

    #[test]
    fn what_swimlb_would_read_differently_is_refused_with_every_reason() {
        let input = list(vec![
            metallb("BGPAdvertisement", "b", json!({})),
            metallb(
                "IPAddressPool",
                "p",
                json!({"addresses": ["192.0.2.0/28"], "future": 1}),
            ),
            metallb(
                "IPAddressPool",
                "p",
                json!({"addresses": ["192.0.2.16/28"]}),
            ),
            metallb(
                "IPAddressPool",
                "q",
                json!({"addresses": ["not an address"]}),
            ),
            metallb("IPAddressPool", "r", json!({"addresses": "192.0.2.0/28"})),
            json!({"apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
                "metadata": {"name": "s"}}),
            json!({"apiVersion": METALLB_API_VERSION, "kind": "IPAddressPool", "metadata": {}}),
            metallb("Widget", "w", json!({})),
        ]);
        let errors = convert(&input, "swimlb-system").unwrap_err();
        let expect = [
            "BGPAdvertisement metallb-system/b: swimlb announces in layer 2 only",
            "IPAddressPool metallb-system/p: fields swimlb does not read: spec.future",
            "a second IPAddressPool named p",
            "IPAddressPool metallb-system/r: spec: invalid type",
            "apiVersion \"swimlb.io/v1beta1\", not MetalLB's",
            "item 6 (IPAddressPool): no metadata.name",
            "Widget metallb-system/w: not a kind swimlb converts",
            "as swimlb reads it: IPAddressPool swimlb-system/q",
        ];
        for e in expect {
            assert!(errors.iter().any(|x| x.contains(e)), "{e}: {errors:#?}");
        }
        assert_eq!(errors.len(), expect.len(), "{errors:#?}");
        assert!(convert(&json!([1]), "x").is_err());
        assert!(
            convert(&json!({"kind": "List", "items": []}), "x")
                .unwrap()
                .list["items"]
                .as_array()
                .unwrap()
                .is_empty()
        );
    }
}
