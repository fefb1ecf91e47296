//! JSON merge patch (RFC 7386), JSON patch (RFC 6902) and a strategic merge patch for the kinds
//! the fake API server serves.
//!
//! Owns: applying a patch document to a JSON object, as pure functions. Guarantees: a patch that
//! cannot apply (a failed `test`, a missing path, a malformed operation) is an error and leaves
//! the input untouched (functions work on a copy).
//!
//! Strategic merge patch, simplified: it is a merge patch, except that lists named in
//! [`merge_key_for`] are merged element by element on their merge key (`ports` by `port` or
//! `containerPort`, `conditions` and node `addresses` by `type`, `containers`/`env`/`volumes` by
//! `name`, ...), `finalizers` are merged as a set (remove with `$deleteFromPrimitiveList/finalizers`),
//! the `$patch: delete` directive removes a keyed element, and `$setElementOrder/...` is accepted
//! but ignored (old elements keep their order, new ones are appended). Other directives
//! (`$retainKeys`, `$patch: replace`, ...) are rejected rather than mis-applied.

use serde_json::{Map, Value};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatchError {
    #[error("json patch operation {index}: {reason}")]
    BadOperation { index: usize, reason: String },
    #[error("json patch operation {index} ({op} {path}): {reason}")]
    CannotApply {
        index: usize,
        op: String,
        path: String,
        reason: String,
    },
    #[error("strategic merge patch: unsupported directive {directive:?} at {path}")]
    UnsupportedDirective { directive: String, path: String },
    #[error("patch document must be {expected}")]
    WrongShape { expected: &'static str },
}

/// RFC 7386 merge patch.
pub fn merge_patch(target: &Value, patch: &Value) -> Value {
    match patch {
        Value::Object(p) => {
            let mut out = match target {
                Value::Object(t) => t.clone(),
                _ => Map::new(),
            };
            for (k, v) in p {
                if v.is_null() {
                    out.remove(k);
                } else {
                    let merged = merge_patch(out.get(k).unwrap_or(&Value::Null), v);
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

fn unescape_pointer_token(t: &str) -> String {
    t.replace("~1", "/").replace("~0", "~")
}

fn split_pointer(path: &str) -> Option<Vec<String>> {
    if path.is_empty() {
        return Some(Vec::new());
    }
    let rest = path.strip_prefix('/')?;
    Some(rest.split('/').map(unescape_pointer_token).collect())
}

fn array_index(token: &str, len: usize, allow_end: bool) -> Option<usize> {
    if allow_end && token == "-" {
        return Some(len);
    }
    if token.len() > 1 && token.starts_with('0') {
        return None;
    }
    let i: usize = token.parse().ok()?;
    let limit = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    (i <= limit && (allow_end || len > 0)).then_some(i)
}

fn get_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    let mut cur = doc;
    for t in tokens {
        cur = match cur {
            Value::Object(m) => m.get_mut(t)?,
            Value::Array(a) => {
                let i = array_index(t, a.len(), false)?;
                a.get_mut(i)?
            }
            _ => return None,
        };
    }
    Some(cur)
}

fn add(doc: &mut Value, tokens: &[String], value: Value) -> Result<(), String> {
    let Some((last, parent)) = tokens.split_last() else {
        *doc = value;
        return Ok(());
    };
    match get_mut(doc, parent) {
        Some(Value::Object(m)) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Some(Value::Array(a)) => {
            let i = array_index(last, a.len(), true).ok_or("array index out of range")?;
            a.insert(i, value);
            Ok(())
        }
        Some(_) => Err("parent is not a container".into()),
        None => Err("parent path does not exist".into()),
    }
}

fn remove(doc: &mut Value, tokens: &[String]) -> Result<Value, String> {
    let Some((last, parent)) = tokens.split_last() else {
        return Err("cannot remove the whole document".into());
    };
    match get_mut(doc, parent) {
        Some(Value::Object(m)) => m.remove(last).ok_or_else(|| "path does not exist".into()),
        Some(Value::Array(a)) => {
            let i = array_index(last, a.len(), false).ok_or("array index out of range")?;
            Ok(a.remove(i))
        }
        _ => Err("path does not exist".into()),
    }
}

/// RFC 6902 JSON patch: `add`, `remove`, `replace`, `move`, `copy`, `test`.
pub fn json_patch(target: &Value, patch: &Value) -> Result<Value, PatchError> {
    let ops = patch.as_array().ok_or(PatchError::WrongShape {
        expected: "a JSON array of operations",
    })?;
    let mut doc = target.clone();
    for (index, op) in ops.iter().enumerate() {
        let bad = |reason: &str| PatchError::BadOperation {
            index,
            reason: reason.to_string(),
        };
        let name = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("missing \"op\""))?;
        let path_str = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("missing \"path\""))?;
        let path = split_pointer(path_str).ok_or_else(|| bad("path is not a JSON pointer"))?;
        let cannot = |reason: String| PatchError::CannotApply {
            index,
            op: name.to_string(),
            path: path_str.to_string(),
            reason,
        };
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| bad("missing \"value\""))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .and_then(split_pointer)
                .ok_or_else(|| bad("missing or malformed \"from\""))
        };
        match name {
            "add" => add(&mut doc, &path, value()?).map_err(cannot)?,
            "remove" => {
                remove(&mut doc, &path).map_err(cannot)?;
            }
            "replace" => {
                let v = value()?;
                let slot =
                    get_mut(&mut doc, &path).ok_or_else(|| cannot("path does not exist".into()))?;
                *slot = v;
            }
            "move" => {
                let from = from()?;
                if path.len() > from.len() && path[..from.len()] == from[..] {
                    return Err(cannot(
                        "cannot move a value into one of its children".into(),
                    ));
                }
                let v = remove(&mut doc, &from).map_err(cannot)?;
                add(&mut doc, &path, v).map_err(cannot)?;
            }
            "copy" => {
                let from = from()?;
                let v = get_mut(&mut doc, &from)
                    .map(|v| v.clone())
                    .ok_or_else(|| cannot("\"from\" does not exist".into()))?;
                add(&mut doc, &path, v).map_err(cannot)?;
            }
            "test" => {
                let want = value()?;
                let have =
                    get_mut(&mut doc, &path).ok_or_else(|| cannot("path does not exist".into()))?;
                if *have != want {
                    return Err(cannot(format!(
                        "testing value {have} failed, expected {want}"
                    )));
                }
            }
            other => return Err(bad(&format!("unknown op {other:?}"))),
        }
    }
    Ok(doc)
}

/// How a list field is merged by a strategic merge patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStrategy {
    /// Replaced as a whole (the default, as for a merge patch).
    Replace,
    /// Elements with the same value of this key are merged.
    MergeByKey(&'static str),
    /// A list of scalars merged as a set (`finalizers`).
    MergeScalars,
}

/// The list strategy the real server's Go types declare for a field of this name.
pub fn merge_key_for(field: &str, sample: Option<&Value>) -> ListStrategy {
    match field {
        "ports" => {
            if sample.is_some_and(|s| s.get("containerPort").is_some()) {
                ListStrategy::MergeByKey("containerPort")
            } else {
                ListStrategy::MergeByKey("port")
            }
        }
        "conditions" | "addresses" if sample.is_none_or(|s| s.get("type").is_some()) => {
            ListStrategy::MergeByKey("type")
        }
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets" => ListStrategy::MergeByKey("name"),
        "volumeMounts" => ListStrategy::MergeByKey("mountPath"),
        "ownerReferences" => ListStrategy::MergeByKey("uid"),
        "finalizers" => ListStrategy::MergeScalars,
        _ => ListStrategy::Replace,
    }
}

/// Strategic merge patch, simplified as described in the module doc.
pub fn strategic_merge_patch(target: &Value, patch: &Value) -> Result<Value, PatchError> {
    if !patch.is_object() {
        return Err(PatchError::WrongShape {
            expected: "a JSON object",
        });
    }
    strategic_object(target, patch, "")
}

fn strategic_object(target: &Value, patch: &Value, path: &str) -> Result<Value, PatchError> {
    let Value::Object(p) = patch else {
        return Ok(patch.clone());
    };
    let mut out = match target {
        Value::Object(t) => t.clone(),
        _ => Map::new(),
    };
    for (k, v) in p {
        let here = format!("{path}.{k}");
        if k.starts_with("$setElementOrder/") {
            // Ordering hints only; the merged order is old elements first, then new ones.
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let doomed = v.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(list)) = out.get_mut(field) {
                list.retain(|item| !doomed.contains(item));
            }
            continue;
        }
        if k.starts_with('$') {
            return Err(PatchError::UnsupportedDirective {
                directive: k.clone(),
                path: here,
            });
        }
        if v.is_null() {
            out.remove(k);
            continue;
        }
        let merged = match (out.get(k), v) {
            (Some(Value::Array(old)), Value::Array(new)) => {
                let sample = new.first().or(old.first());
                match merge_key_for(k, sample) {
                    ListStrategy::Replace => Value::Array(new.clone()),
                    ListStrategy::MergeScalars => {
                        let mut list = old.clone();
                        for item in new {
                            if !list.contains(item) {
                                list.push(item.clone());
                            }
                        }
                        Value::Array(list)
                    }
                    ListStrategy::MergeByKey(key) => merge_keyed_list(old, new, key, &here)?,
                }
            }
            (None, Value::Array(new)) => {
                let mut list = Vec::new();
                for item in new {
                    if item.get("$patch").is_some() {
                        continue;
                    }
                    list.push(strategic_object(&Value::Null, item, &here)?);
                }
                Value::Array(list)
            }
            (old, Value::Object(_)) => strategic_object(old.unwrap_or(&Value::Null), v, &here)?,
            (_, other) => other.clone(),
        };
        out.insert(k.clone(), merged);
    }
    Ok(Value::Object(out))
}

fn merge_keyed_list(
    old: &[Value],
    new: &[Value],
    key: &str,
    path: &str,
) -> Result<Value, PatchError> {
    let mut list: Vec<Value> = old.to_vec();
    for item in new {
        let id = item.get(key);
        let mut item = item.clone();
        let directive = item.as_object_mut().and_then(|m| m.remove("$patch"));
        let pos = id.and_then(|id| list.iter().position(|e| e.get(key) == Some(id)));
        match directive.as_ref().and_then(Value::as_str) {
            Some("delete") => {
                if let Some(i) = pos {
                    list.remove(i);
                }
            }
            Some(other) => {
                return Err(PatchError::UnsupportedDirective {
                    directive: format!("$patch: {other}"),
                    path: path.to_string(),
                });
            }
            None => match pos {
                Some(i) => list[i] = strategic_object(&list[i], &item, path)?,
                None => list.push(strategic_object(&Value::Null, &item, path)?),
            },
        }
    }
    Ok(Value::Array(list))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_the_rfc_7386_examples() {
        let target = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        let patch = json!({"a": "z", "c": {"f": null}});
        assert_eq!(
            merge_patch(&target, &patch),
            json!({"a": "z", "c": {"d": "e"}})
        );
        assert_eq!(
            merge_patch(&json!({"a": [1]}), &json!({"a": [2]})),
            json!({"a": [2]})
        );
    }

    #[test]
    fn json_patch_applies_every_operation() {
        let doc = json!({"a": {"b": [1, 2]}, "c": 1});
        let patch = json!([
            {"op": "add", "path": "/a/b/-", "value": 3},
            {"op": "remove", "path": "/a/b/0"},
            {"op": "replace", "path": "/c", "value": 5},
            {"op": "copy", "from": "/c", "path": "/d"},
            {"op": "move", "from": "/d", "path": "/e"},
            {"op": "test", "path": "/e", "value": 5},
            {"op": "add", "path": "/a/x~1y", "value": true},
        ]);
        assert_eq!(
            json_patch(&doc, &patch).unwrap(),
            json!({"a": {"b": [2, 3], "x/y": true}, "c": 5, "e": 5})
        );
    }

    #[test]
    fn a_failed_json_patch_test_or_missing_path_is_an_error() {
        let doc = json!({"a": 1});
        assert!(json_patch(&doc, &json!([{"op": "test", "path": "/a", "value": 2}])).is_err());
        assert!(json_patch(&doc, &json!([{"op": "remove", "path": "/b"}])).is_err());
        assert!(
            json_patch(
                &doc,
                &json!([{"op": "replace", "path": "/b/c", "value": 1}])
            )
            .is_err()
        );
        assert!(json_patch(&doc, &json!([{"op": "frobnicate", "path": "/a"}])).is_err());
        assert!(json_patch(&doc, &json!({"op": "add"})).is_err());
    }

    #[test]
    fn strategic_merge_merges_ports_by_port_and_conditions_by_type() {
        let doc = json!({"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}]},
                         "status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        let patch = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 443, "$patch": "delete"}]},
                           "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Other", "status": "True"}]}});
        let out = strategic_merge_patch(&doc, &patch).unwrap();
        assert_eq!(
            out["spec"]["ports"],
            json!([{"port": 80, "name": "http", "targetPort": 8080}])
        );
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "Other", "status": "True"}])
        );
    }

    #[test]
    fn strategic_merge_adds_finalizers_as_a_set_and_rejects_unknown_directives() {
        let doc = json!({"metadata": {"finalizers": ["a"]}});
        let out =
            strategic_merge_patch(&doc, &json!({"metadata": {"finalizers": ["a", "b"]}})).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b"]));
        let out = strategic_merge_patch(
            &out,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
        assert!(strategic_merge_patch(&doc, &json!({"metadata": {"$retainKeys": ["a"]}})).is_err());
    }
}
