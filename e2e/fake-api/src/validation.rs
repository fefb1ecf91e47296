//! Validation the real API server performs and that the fake mirrors: object names, labels,
//! annotations, finalizers, and the kind-specific rules for Services and `events.k8s.io` Events.
//!
//! Owns: the pure checks, each returning the list of field errors (empty = valid), in the
//! wording of the real server's `field.ErrorList`. Guarantees: what is rejected here is rejected
//! by a real server too; the converse is not complete (core kinds only get the checks listed in
//! the doc of each function; custom resources get their schema checks in [`super::schema`]).

use serde_json::Value;
use std::fmt;

use super::resources::{NameRule, ResourceKind};

/// The kind of a field error, as the real server names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    Required,
    Invalid,
    Forbidden,
    NotSupported,
    TooLong,
}

impl FieldErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Required => "FieldValueRequired",
            Self::Invalid => "FieldValueInvalid",
            Self::Forbidden => "FieldValueForbidden",
            Self::NotSupported => "FieldValueNotSupported",
            Self::TooLong => "FieldValueTooLong",
        }
    }

    fn prose(self) -> &'static str {
        match self {
            Self::Required => "Required value",
            Self::Invalid => "Invalid value",
            Self::Forbidden => "Forbidden",
            Self::NotSupported => "Unsupported value",
            Self::TooLong => "Too long",
        }
    }
}

/// One validation failure on one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub kind: FieldErrorKind,
    pub detail: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, kind: FieldErrorKind, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.field, self.kind.prose(), self.detail)
    }
}

fn is_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// DNS-1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn dns1123_label_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    let ok = !value.is_empty()
        && value.chars().all(|c| is_alnum(c) || c == '-')
        && value.chars().next().is_some_and(is_alnum)
        && value.chars().last().is_some_and(is_alnum);
    if !ok {
        errs.push(format!("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (value {value:?})"));
    }
    errs
}

/// DNS-1035 label: like DNS-1123 but must start with a letter.
pub fn dns1035_label_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    let ok = !value.is_empty()
        && value.chars().all(|c| is_alnum(c) || c == '-')
        && value.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && value.chars().last().is_some_and(is_alnum);
    if !ok {
        errs.push(format!("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (value {value:?})"));
    }
    errs
}

/// DNS-1123 subdomain: dot-separated DNS-1123 labels, at most 253 characters.
pub fn dns1123_subdomain_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    let ok = !value.is_empty()
        && value.split('.').all(|part| {
            !part.is_empty()
                && part.chars().all(|c| is_alnum(c) || c == '-')
                && part.chars().next().is_some_and(is_alnum)
                && part.chars().last().is_some_and(is_alnum)
        });
    if !ok {
        errs.push(format!("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (value {value:?})"));
    }
    errs
}

/// A name valid as a URL path segment (`.`/`..` and `/`, `%` are not).
pub fn path_segment_errors(value: &str) -> Vec<String> {
    if value == "." || value == ".." {
        return vec![format!("may not be {value:?}")];
    }
    if value.contains('/') || value.contains('%') {
        return vec![format!("may not contain '/' or '%' (value {value:?})")];
    }
    Vec::new()
}

/// Name errors under `rule`.
pub fn name_errors(rule: NameRule, name: &str) -> Vec<String> {
    match rule {
        NameRule::Subdomain => dns1123_subdomain_errors(name),
        NameRule::Label1035 => dns1035_label_errors(name),
        NameRule::Label1123 => dns1123_label_errors(name),
        NameRule::PathSegment => path_segment_errors(name),
    }
}

/// Qualified name (`prefix/name` where the prefix is a DNS subdomain and the name is 1..63 of
/// alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric): label and annotation keys.
pub fn qualified_name_errors(value: &str) -> Vec<String> {
    let (prefix, name) = match value.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, value),
    };
    let mut errs = Vec::new();
    if let Some(p) = prefix {
        if p.is_empty() {
            errs.push("prefix part must be non-empty".to_string());
        } else {
            errs.extend(
                dns1123_subdomain_errors(p)
                    .into_iter()
                    .map(|e| format!("prefix part {e}")),
            );
        }
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| alnum(c) || c == '-' || c == '_' || c == '.')
        && name.chars().next().is_some_and(alnum)
        && name.chars().last().is_some_and(alnum);
    if !ok {
        errs.push(format!("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, at most 63 characters (value {value:?})"));
    }
    errs
}

/// Label value: empty, or up to 63 of alphanumerics, `-`, `_`, `.`, starting and ending
/// alphanumeric.
pub fn label_value_errors(value: &str) -> Vec<String> {
    if value.is_empty() {
        return Vec::new();
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let ok = value.len() <= 63
        && value
            .chars()
            .all(|c| alnum(c) || c == '-' || c == '_' || c == '.')
        && value.chars().next().is_some_and(alnum)
        && value.chars().last().is_some_and(alnum);
    if ok {
        Vec::new()
    } else {
        vec![format!(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, at most 63 characters (value {value:?})"
        )]
    }
}

/// Validation of `metadata` common to every kind (name, labels, annotations, finalizers).
pub fn metadata_errors(kind: &ResourceKind, object: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let meta = object.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    if name.is_empty() {
        errs.push(FieldError::new(
            "metadata.name",
            FieldErrorKind::Required,
            "name or generateName is required",
        ));
    } else {
        for e in name_errors(kind.name_rule, name) {
            errs.push(FieldError::new(
                "metadata.name",
                FieldErrorKind::Invalid,
                format!("{name:?}: {e}"),
            ));
        }
    }
    match meta.and_then(|m| m.get("labels")) {
        None | Some(Value::Null) => {}
        Some(Value::Object(labels)) => {
            for (k, v) in labels {
                for e in qualified_name_errors(k) {
                    errs.push(FieldError::new(
                        "metadata.labels",
                        FieldErrorKind::Invalid,
                        format!("{k:?}: {e}"),
                    ));
                }
                match v.as_str() {
                    Some(s) => {
                        for e in label_value_errors(s) {
                            errs.push(FieldError::new(
                                format!("metadata.labels.{k}"),
                                FieldErrorKind::Invalid,
                                e,
                            ));
                        }
                    }
                    None => errs.push(FieldError::new(
                        format!("metadata.labels.{k}"),
                        FieldErrorKind::Invalid,
                        "label values must be strings",
                    )),
                }
            }
        }
        Some(_) => errs.push(FieldError::new(
            "metadata.labels",
            FieldErrorKind::Invalid,
            "must be a map of strings",
        )),
    }
    match meta.and_then(|m| m.get("annotations")) {
        None | Some(Value::Null) => {}
        Some(Value::Object(annotations)) => {
            for (k, v) in annotations {
                for e in qualified_name_errors(&k.to_ascii_lowercase()) {
                    errs.push(FieldError::new(
                        "metadata.annotations",
                        FieldErrorKind::Invalid,
                        format!("{k:?}: {e}"),
                    ));
                }
                if !v.is_string() {
                    errs.push(FieldError::new(
                        format!("metadata.annotations.{k}"),
                        FieldErrorKind::Invalid,
                        "annotation values must be strings",
                    ));
                }
            }
        }
        Some(_) => errs.push(FieldError::new(
            "metadata.annotations",
            FieldErrorKind::Invalid,
            "must be a map of strings",
        )),
    }
    match meta.and_then(|m| m.get("finalizers")) {
        None | Some(Value::Null) => {}
        Some(Value::Array(fins)) => {
            for (i, f) in fins.iter().enumerate() {
                match f.as_str() {
                    Some(s) if qualified_name_errors(s).is_empty() => {}
                    _ => errs.push(FieldError::new(
                        format!("metadata.finalizers[{i}]"),
                        FieldErrorKind::Invalid,
                        format!("{f}: must be a qualified name"),
                    )),
                }
            }
        }
        Some(_) => errs.push(FieldError::new(
            "metadata.finalizers",
            FieldErrorKind::Invalid,
            "must be a list of strings",
        )),
    }
    errs
}

const SERVICE_TYPES: [&str; 4] = ["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"];

/// Service checks: type, ports (1..65535, protocol, unique names when more than one, nodePort
/// range), `externalTrafficPolicy`, `loadBalancerIP`/`clusterIP` syntax.
pub fn service_errors(object: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let spec = object.get("spec").cloned().unwrap_or(Value::Null);
    let ty = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP");
    if !SERVICE_TYPES.contains(&ty) {
        errs.push(FieldError::new("spec.type", FieldErrorKind::NotSupported, format!("{ty:?}: supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\"")));
    }
    let ports = spec
        .get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if ports.is_empty() && ty != "ExternalName" {
        errs.push(FieldError::new("spec.ports", FieldErrorKind::Required, ""));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let at = |f: &str| format!("spec.ports[{i}].{f}");
        match p.get("port").and_then(Value::as_i64) {
            Some(n) if (1..=65535).contains(&n) => {}
            Some(n) => errs.push(FieldError::new(
                at("port"),
                FieldErrorKind::Invalid,
                format!("{n}: must be between 1 and 65535, inclusive"),
            )),
            None => errs.push(FieldError::new(at("port"), FieldErrorKind::Required, "")),
        }
        let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
        if !["TCP", "UDP", "SCTP"].contains(&proto) {
            errs.push(FieldError::new(
                at("protocol"),
                FieldErrorKind::NotSupported,
                format!("{proto:?}: supported values: \"SCTP\", \"TCP\", \"UDP\""),
            ));
        }
        let name = p.get("name").and_then(Value::as_str).unwrap_or_default();
        if ports.len() > 1 && name.is_empty() {
            errs.push(FieldError::new(at("name"), FieldErrorKind::Required, ""));
        }
        if !name.is_empty() {
            for e in dns1123_label_errors(name) {
                errs.push(FieldError::new(at("name"), FieldErrorKind::Invalid, e));
            }
            if !names.insert(name.to_string()) {
                errs.push(FieldError::new(
                    at("name"),
                    FieldErrorKind::Invalid,
                    format!("{name:?}: duplicate port name"),
                ));
            }
        }
        if let Some(np) = p.get("nodePort").and_then(Value::as_i64)
            && np != 0
        {
            if ty == "ClusterIP" {
                errs.push(FieldError::new(
                    at("nodePort"),
                    FieldErrorKind::Forbidden,
                    "may not be used when `type` is 'ClusterIP'",
                ));
            } else if !(30000..=32767).contains(&np) {
                errs.push(FieldError::new(at("nodePort"), FieldErrorKind::Invalid, format!("{np}: provided port is not in the valid range. The range of valid ports is 30000-32767")));
            }
        }
    }
    if let Some(policy) = spec.get("externalTrafficPolicy").and_then(Value::as_str)
        && !["Cluster", "Local"].contains(&policy)
    {
        errs.push(FieldError::new(
            "spec.externalTrafficPolicy",
            FieldErrorKind::NotSupported,
            format!("{policy:?}: supported values: \"Cluster\", \"Local\""),
        ));
    }
    if let Some(class) = spec.get("loadBalancerClass").and_then(Value::as_str) {
        if ty != "LoadBalancer" {
            errs.push(FieldError::new(
                "spec.loadBalancerClass",
                FieldErrorKind::Forbidden,
                "may only be used when `type` is 'LoadBalancer'",
            ));
        }
        for e in qualified_name_errors(class) {
            errs.push(FieldError::new(
                "spec.loadBalancerClass",
                FieldErrorKind::Invalid,
                e,
            ));
        }
    }
    let ingress = object
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (i, entry) in ingress.iter().enumerate() {
        let ip = entry.get("ip").and_then(Value::as_str).unwrap_or_default();
        if !ip.is_empty() && ip.parse::<std::net::IpAddr>().is_err() {
            errs.push(FieldError::new(
                format!("status.loadBalancer.ingress[{i}].ip"),
                FieldErrorKind::Invalid,
                format!("{ip:?}: must be a valid IP address"),
            ));
        }
        match entry.get("ipMode").and_then(Value::as_str) {
            None => {}
            Some(_) if ip.is_empty() => errs.push(FieldError::new(
                format!("status.loadBalancer.ingress[{i}].ipMode"),
                FieldErrorKind::Required,
                "must be specified when `ipMode` is set",
            )),
            Some("VIP" | "Proxy") => {}
            Some(other) => errs.push(FieldError::new(
                format!("status.loadBalancer.ingress[{i}].ipMode"),
                FieldErrorKind::NotSupported,
                format!("{other:?}: supported values: \"Proxy\", \"VIP\""),
            )),
        }
    }
    for field in ["clusterIP", "loadBalancerIP"] {
        if let Some(ip) = spec.get(field).and_then(Value::as_str)
            && !ip.is_empty()
            && ip != "None"
            && ip.parse::<std::net::IpAddr>().is_err()
        {
            errs.push(FieldError::new(
                format!("spec.{field}"),
                FieldErrorKind::Invalid,
                format!("{ip:?}: must be a valid IP address"),
            ));
        }
    }
    errs
}

/// `events.k8s.io/v1` Event checks the real server applies to new events.
pub fn events_v1_errors(object: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for field in [
        "eventTime",
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
    ] {
        if object
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            errs.push(FieldError::new(field, FieldErrorKind::Required, ""));
        }
    }
    let ty = object
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if ty != "Normal" && ty != "Warning" {
        errs.push(FieldError::new(
            "type",
            FieldErrorKind::Invalid,
            format!("{ty:?}: has invalid value, must be Normal or Warning"),
        ));
    }
    if let Some(n) = object
        .pointer("/regarding/namespace")
        .and_then(Value::as_str)
    {
        let ns = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !n.is_empty() && n != ns {
            errs.push(FieldError::new(
                "regarding.namespace",
                FieldErrorKind::Invalid,
                format!("{n:?}: does not match event.namespace"),
            ));
        }
    }
    errs
}

/// core/v1 Event checks: the involved object's namespace must match the event's.
pub fn events_core_errors(object: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let ns = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match object
        .pointer("/involvedObject/namespace")
        .and_then(Value::as_str)
    {
        Some(n) if !n.is_empty() && n != ns => {
            errs.push(FieldError::new(
                "involvedObject.namespace",
                FieldErrorKind::Invalid,
                format!("{n:?}: does not match event.namespace"),
            ));
        }
        _ => {}
    }
    errs
}

/// `discovery.k8s.io/v1` EndpointSlice checks: `addressType` (IPv4, IPv6, FQDN; immutable),
/// 1..100 addresses per endpoint, valid for the address type, ports 1..65535 when set.
pub fn endpoint_slice_errors(object: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let ty = object
        .get("addressType")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if ty.is_empty() {
        errs.push(FieldError::new("addressType", FieldErrorKind::Required, ""));
    } else if !["IPv4", "IPv6", "FQDN"].contains(&ty) {
        errs.push(FieldError::new(
            "addressType",
            FieldErrorKind::NotSupported,
            format!("{ty:?}: supported values: \"FQDN\", \"IPv4\", \"IPv6\""),
        ));
    }
    if let Some(old_ty) = old
        .and_then(|o| o.get("addressType"))
        .and_then(Value::as_str)
        && old_ty != ty
    {
        errs.push(FieldError::new(
            "addressType",
            FieldErrorKind::Invalid,
            format!("{ty:?}: field is immutable"),
        ));
    }
    let endpoints = object
        .get("endpoints")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (i, ep) in endpoints.iter().enumerate() {
        let addresses = ep
            .get("addresses")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if addresses.is_empty() || addresses.len() > 100 {
            errs.push(FieldError::new(
                format!("endpoints[{i}].addresses"),
                FieldErrorKind::Invalid,
                "must contain at least 1 and at most 100 addresses",
            ));
        }
        for (j, a) in addresses.iter().enumerate() {
            let a = a.as_str().unwrap_or_default();
            let ok = match ty {
                "IPv4" => a.parse::<std::net::Ipv4Addr>().is_ok(),
                "IPv6" => a.parse::<std::net::Ipv6Addr>().is_ok(),
                _ => dns1123_subdomain_errors(a).is_empty(),
            };
            if !ok {
                errs.push(FieldError::new(
                    format!("endpoints[{i}].addresses[{j}]"),
                    FieldErrorKind::Invalid,
                    format!("{a:?}: must be a valid {ty} address"),
                ));
            }
        }
    }
    let ports = object
        .get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (i, p) in ports.iter().enumerate() {
        if let Some(n) = p.get("port").and_then(Value::as_i64)
            && !(1..=65535).contains(&n)
        {
            errs.push(FieldError::new(
                format!("ports[{i}].port"),
                FieldErrorKind::Invalid,
                format!("{n}: must be between 1 and 65535, inclusive"),
            ));
        }
    }
    errs
}

/// `coordination.k8s.io/v1` Lease checks: durations and transitions are not negative or zero.
pub fn lease_errors(object: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(d) = object
        .pointer("/spec/leaseDurationSeconds")
        .and_then(Value::as_i64)
        && d <= 0
    {
        errs.push(FieldError::new(
            "spec.leaseDurationSeconds",
            FieldErrorKind::Invalid,
            format!("{d}: must be greater than 0"),
        ));
    }
    if let Some(t) = object
        .pointer("/spec/leaseTransitions")
        .and_then(Value::as_i64)
        && t < 0
    {
        errs.push(FieldError::new(
            "spec.leaseTransitions",
            FieldErrorKind::Invalid,
            format!("{t}: must be greater than or equal to 0"),
        ));
    }
    errs
}

fn without_pod_mutable_fields(spec: &Value) -> Value {
    let mut spec = spec.clone();
    if let Some(m) = spec.as_object_mut() {
        m.remove("activeDeadlineSeconds");
        m.remove("tolerations");
        for list in ["containers", "initContainers"] {
            if let Some(Value::Array(cs)) = m.get_mut(list) {
                for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                    c.remove("image");
                }
            }
        }
    }
    spec
}

/// Pod checks: at least one container, each with a DNS-1123 label name and an image; on update,
/// the spec may only change container images, `activeDeadlineSeconds` and tolerations.
pub fn pod_errors(object: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let containers = object
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if containers.is_empty() {
        errs.push(FieldError::new(
            "spec.containers",
            FieldErrorKind::Required,
            "",
        ));
    }
    for (i, c) in containers.iter().enumerate() {
        let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
        if name.is_empty() {
            errs.push(FieldError::new(
                format!("spec.containers[{i}].name"),
                FieldErrorKind::Required,
                "",
            ));
        } else {
            for e in dns1123_label_errors(name) {
                errs.push(FieldError::new(
                    format!("spec.containers[{i}].name"),
                    FieldErrorKind::Invalid,
                    e,
                ));
            }
        }
        if c.get("image")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            errs.push(FieldError::new(
                format!("spec.containers[{i}].image"),
                FieldErrorKind::Required,
                "",
            ));
        }
    }
    if let Some(old_spec) = old.and_then(|o| o.get("spec")) {
        let new_spec = object.get("spec").cloned().unwrap_or(Value::Null);
        if without_pod_mutable_fields(old_spec) != without_pod_mutable_fields(&new_spec) {
            errs.push(FieldError::new("spec", FieldErrorKind::Forbidden, "pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds` or `spec.tolerations` (only additions to existing tolerations)"));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule_of_their_kind() {
        assert!(dns1123_subdomain_errors("node-1.example").is_empty());
        assert!(!dns1123_subdomain_errors("Node_1").is_empty());
        assert!(!dns1123_subdomain_errors("-a").is_empty());
        assert!(dns1035_label_errors("web").is_empty());
        assert!(!dns1035_label_errors("1web").is_empty());
        assert!(!dns1035_label_errors("web.svc").is_empty());
        assert!(!dns1123_label_errors(&"a".repeat(64)).is_empty());
    }

    #[test]
    fn label_keys_and_values_follow_qualified_name_rules() {
        assert!(qualified_name_errors("app.kubernetes.io/name").is_empty());
        assert!(!qualified_name_errors("/name").is_empty());
        assert!(!qualified_name_errors("a b").is_empty());
        assert!(label_value_errors("").is_empty());
        assert!(!label_value_errors("-x").is_empty());
    }

    #[test]
    fn services_with_bad_ports_or_types_are_invalid() {
        let svc = serde_json::json!({"spec": {"type": "Balanced", "ports": [{"port": 0}, {"port": 70000, "name": "b"}]}});
        let fields: Vec<String> = service_errors(&svc).into_iter().map(|e| e.field).collect();
        assert!(fields.contains(&"spec.type".to_string()));
        assert!(fields.contains(&"spec.ports[0].port".to_string()));
        assert!(fields.contains(&"spec.ports[1].port".to_string()));
        assert!(fields.contains(&"spec.ports[0].name".to_string()));
    }
}
