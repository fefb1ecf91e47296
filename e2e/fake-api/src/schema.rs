//! Structural-schema checks of the swimlb custom resources, as a real API server applies them to
//! a custom resource on every write (create, replace, patch, apply, the status subresource).
//!
//! Owns: walking an object against the `openAPIV3Schema` of its CRD (generated from the
//! swimlb-config types, so the fake server and `deploy/crds.yaml` cannot drift): wrong types
//! and missing required fields become field errors in the real server's wording; unknown fields
//! are pruned and `null`s of non-nullable fields dropped, then defaults applied, as the real
//! server does. Then the object must also deserialize into its typed struct (a backstop for
//! anything the schema walk does not model). Guarantees: pure; `apiVersion`, `kind` and
//! `metadata` are left to the rest of the server.
//!
//! Not modelled: formats (`int32`, `date-time`), `enum`, `pattern`, numeric bounds and CEL rules
//! (the generated schemas use only the formats).

use std::sync::OnceLock;

use kube::CustomResourceExt;
use serde_json::{Map, Value};
use swimlb_config::crd::{IPAddressPool, L2Advertisement, ServiceL2Status};

use super::validation::{FieldError, FieldErrorKind};

/// The `openAPIV3Schema` of the first version of a CRD, as JSON.
fn schema_of(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Value {
    crd.spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or(Value::Null)
}

/// The schema of a swimlb kind (`None`: not a swimlb custom resource).
fn schema(kind: &str) -> Option<&'static Value> {
    static SCHEMAS: OnceLock<[(&'static str, Value); 3]> = OnceLock::new();
    let schemas = SCHEMAS.get_or_init(|| {
        [
            ("IPAddressPool", schema_of(&IPAddressPool::crd())),
            ("L2Advertisement", schema_of(&L2Advertisement::crd())),
            ("ServiceL2Status", schema_of(&ServiceL2Status::crd())),
        ]
    });
    schemas.iter().find(|(k, _)| *k == kind).map(|(_, s)| s)
}

/// The JSON type name the real server reports.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(wanted: &str, value: &Value) -> bool {
    match wanted {
        "number" => value.is_number(),
        other => json_type(value) == other,
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Checks `value` against `schema` at `path`, pruning and defaulting in place.
fn walk(schema: &Value, value: &mut Value, path: &str, errs: &mut Vec<FieldError>) {
    if let Some(wanted) = schema.get("type").and_then(Value::as_str)
        && !type_matches(wanted, value)
    {
        let have = json_type(value);
        errs.push(FieldError::new(
            path,
            FieldErrorKind::Invalid,
            format!("\"{have}\": {path} in body must be of type {wanted}: \"{have}\""),
        ));
        return;
    }
    match value {
        Value::Object(map) => walk_object(schema, map, path, errs),
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(item_schema, item, &format!("{path}[{i}]"), errs);
                }
            }
        }
        _ => {}
    }
}

fn walk_object(
    schema: &Value,
    map: &mut Map<String, Value>,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    let preserve = schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let root = path.is_empty();
    let keys: Vec<String> = map.keys().cloned().collect();
    for key in keys {
        if root && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        let field_schema = properties.and_then(|p| p.get(&key)).or(additional);
        let Some(field_schema) = field_schema else {
            if !preserve {
                // Unknown fields are pruned, as by a real server with a structural schema.
                map.remove(&key);
            }
            continue;
        };
        let nullable = field_schema
            .get("nullable")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if map.get(&key).is_some_and(Value::is_null) {
            if !nullable {
                // A real server drops nulls of non-nullable fields before defaulting.
                map.remove(&key);
            }
            continue;
        }
        if let Some(v) = map.get_mut(&key) {
            walk(field_schema, v, &join(path, &key), errs);
        }
    }
    if let Some(properties) = properties {
        for (key, field_schema) in properties {
            if !map.contains_key(key)
                && let Some(default) = field_schema.get("default")
            {
                map.insert(key.clone(), default.clone());
            }
        }
    }
    for required in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !map.contains_key(required) {
            errs.push(FieldError::new(
                join(path, required),
                FieldErrorKind::Required,
                "",
            ));
        }
    }
}

/// Checks a swimlb custom resource against its CRD schema, pruning unknown fields and applying
/// defaults in place; returns the field errors (empty: valid). Objects of other kinds are left
/// alone.
pub fn custom_resource_errors(kind: &str, object: &mut Value) -> Vec<FieldError> {
    let Some(schema) = schema(kind) else {
        return Vec::new();
    };
    let mut errs = Vec::new();
    walk(schema, object, "", &mut errs);
    if !errs.is_empty() {
        return errs;
    }
    // The typed structs are the contract the controller and speakers read with.
    let typed = match kind {
        "IPAddressPool" => serde_json::from_value::<IPAddressPool>(object.clone()).map(|_| ()),
        "L2Advertisement" => serde_json::from_value::<L2Advertisement>(object.clone()).map(|_| ()),
        "ServiceL2Status" => serde_json::from_value::<ServiceL2Status>(object.clone()).map(|_| ()),
        _ => Ok(()),
    };
    if let Err(e) = typed {
        errs.push(FieldError::new(
            "spec",
            FieldErrorKind::Invalid,
            format!("the object does not decode as {kind}: {e}"),
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pool(spec: Value) -> Value {
        json!({"apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
               "metadata": {"name": "p", "namespace": "n"}, "spec": spec})
    }

    #[test]
    fn a_wrong_type_is_a_field_error_in_the_real_servers_words() {
        let mut p = pool(json!({"addresses": 5}));
        let errs = custom_resource_errors("IPAddressPool", &mut p);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(
            errs[0].to_string(),
            "spec.addresses: Invalid value: \"integer\": spec.addresses in body must be of type array: \"integer\""
        );
        let mut p = pool(json!({"addresses": ["192.0.2.0/24", 7]}));
        let errs = custom_resource_errors("IPAddressPool", &mut p);
        assert_eq!(errs[0].field, "spec.addresses[1]");
    }

    #[test]
    fn unknown_fields_are_pruned_nulls_dropped_and_defaults_applied() {
        let mut p = pool(
            json!({"addresses": ["192.0.2.0/24"], "bogus": 1, "avoidBuggyIPs": null,
                                "serviceAllocation": {"priority": 3, "extra": "x"}}),
        );
        p["status"] = json!({"assignedIPv4": 1, "nope": true});
        p["topLevel"] = json!("x");
        assert!(custom_resource_errors("IPAddressPool", &mut p).is_empty());
        assert_eq!(p["spec"].get("bogus"), None);
        assert_eq!(p["spec"]["serviceAllocation"].get("extra"), None);
        assert_eq!(p["spec"]["autoAssign"], json!(true));
        assert_eq!(p["spec"]["avoidBuggyIPs"], json!(false));
        assert_eq!(p["status"].get("nope"), None);
        assert_eq!(p.get("topLevel"), None);
        assert_eq!(p["metadata"]["name"], json!("p"));
    }

    #[test]
    fn a_missing_spec_is_required() {
        let mut p = json!({"apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
                           "metadata": {"name": "a", "namespace": "n"}});
        let errs = custom_resource_errors("IPAddressPool", &mut p);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "spec");
        assert_eq!(errs[0].kind, FieldErrorKind::Required);
    }

    #[test]
    fn an_advertisement_without_spec_gets_an_empty_one_as_metallbs_does() {
        let mut a = json!({"apiVersion": "swimlb.io/v1beta1", "kind": "L2Advertisement",
                           "metadata": {"name": "a", "namespace": "n"}});
        let errs = custom_resource_errors("L2Advertisement", &mut a);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(a["spec"], json!({}));
    }

    #[test]
    fn other_kinds_are_left_alone() {
        let mut svc = json!({"apiVersion": "v1", "kind": "Service", "spec": {"bogus": 1}});
        assert!(custom_resource_errors("Service", &mut svc).is_empty());
        assert_eq!(svc["spec"]["bogus"], json!(1));
    }
}
