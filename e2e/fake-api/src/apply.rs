//! Field ownership (`metadata.managedFields`) and server-side apply.
//!
//! Owns: which manager owns which field of an object, the apply merge, apply conflicts, and the
//! ownership transfer done by ordinary updates. Pure functions over JSON values; `now` is an
//! argument.
//!
//! Guarantees, as the real server: applying a field another manager owns with a different value is
//! a conflict unless forced (forcing takes the field over); two managers applying the same value
//! share the field; a field a manager stops applying is removed when nobody else owns it; an
//! update (PUT or non-apply patch) takes ownership of the fields it changes from every other
//! manager. Simplified: ownership is tracked per leaf, and every list is atomic (one leaf), where
//! the real server tracks keyed list elements (`k:{...}`) for lists with merge keys; `null` in an
//! applied object removes the field; managedFields sent by clients are ignored.

use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// A path of object keys from the root to a leaf.
pub type FieldPath = Vec<String>;

/// The operation that produced a managedFields entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Apply,
    Update,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Apply => "Apply",
            Self::Update => "Update",
        }
    }
}

/// Which part of an object a write may touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Everything but `status` (kinds with a status subresource, main resource).
    AllButStatus,
    /// Everything (kinds without a status subresource).
    All,
    /// Only `status` (the status subresource).
    StatusOnly,
}

impl Scope {
    fn subresource(self) -> &'static str {
        match self {
            Self::StatusOnly => "status",
            _ => "",
        }
    }
}

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedEntry {
    pub manager: String,
    pub operation: Operation,
    pub subresource: String,
    pub api_version: String,
    pub time: String,
    pub fields: BTreeSet<FieldPath>,
}

/// A field another manager owns and an apply would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub manager: String,
    pub path: String,
}

/// Metadata fields the server owns; they are never part of a manager's field set.
const SYSTEM_METADATA: [&str; 10] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// The part of `object` that `scope` covers, without identity and system fields.
pub fn scoped(object: &Value, scope: Scope) -> Value {
    let mut out = Map::new();
    if let Value::Object(m) = object {
        for (k, v) in m {
            let keep = match scope {
                Scope::StatusOnly => k == "status",
                Scope::AllButStatus => k != "status",
                Scope::All => true,
            };
            if !keep || k == "apiVersion" || k == "kind" {
                continue;
            }
            if k == "metadata" {
                let mut meta = v.as_object().cloned().unwrap_or_default();
                meta.retain(|mk, _| {
                    !SYSTEM_METADATA.contains(&mk.as_str()) && mk != "generateName"
                });
                if !meta.is_empty() {
                    out.insert(k.clone(), Value::Object(meta));
                }
            } else {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// Leaf paths of a value: non-objects and empty objects are leaves; lists are atomic.
pub fn leaf_paths(value: &Value) -> BTreeSet<FieldPath> {
    let mut out = BTreeSet::new();
    collect_leaves(value, &mut Vec::new(), &mut out);
    out
}

fn collect_leaves(value: &Value, path: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
    match value {
        Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                path.push(k.clone());
                collect_leaves(v, path, out);
                path.pop();
            }
        }
        _ if !path.is_empty() => {
            out.insert(path.clone());
        }
        _ => {}
    }
}

/// The value at `path`, if any.
pub fn get_path<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |cur, seg| cur.get(seg))
}

/// Removes the value at `path` and prunes the objects left empty by it (below the top level).
pub fn remove_path(value: &mut Value, path: &[String]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let mut cur = &mut *value;
    for seg in parent {
        match cur.get_mut(seg) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Value::Object(m) = cur {
        m.remove(last);
    }
    if parent.len() > 1
        && get_path(value, parent).is_some_and(|v| v.as_object().is_some_and(Map::is_empty))
    {
        remove_path(value, parent);
    }
}

/// Deep-merges `applied` into `target`: objects merge, everything else replaces, `null` removes.
pub fn merge_applied(target: &mut Value, applied: &Value) {
    let Value::Object(a) = applied else {
        *target = applied.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in a {
            match v {
                Value::Null => {
                    t.remove(k);
                }
                Value::Object(_) => {
                    merge_applied(t.entry(k.clone()).or_insert(Value::Null), v);
                }
                _ => {
                    t.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

fn related(a: &[String], b: &[String]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

pub fn dotted(path: &[String]) -> String {
    format!(".{}", path.join("."))
}

fn fields_to_json(fields: &BTreeSet<FieldPath>) -> Value {
    let mut root = Map::new();
    for path in fields {
        let mut cur = &mut root;
        for seg in path {
            let entry = cur
                .entry(format!("f:{seg}"))
                .or_insert_with(|| Value::Object(Map::new()));
            if !entry.is_object() {
                *entry = Value::Object(Map::new());
            }
            match entry {
                Value::Object(m) => cur = m,
                _ => break,
            }
        }
    }
    Value::Object(root)
}

fn fields_from_json(value: &Value, path: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
    let Value::Object(m) = value else {
        return;
    };
    if m.is_empty() && !path.is_empty() {
        out.insert(path.clone());
        return;
    }
    for (k, v) in m {
        if let Some(seg) = k.strip_prefix("f:") {
            path.push(seg.to_string());
            fields_from_json(v, path, out);
            path.pop();
        } else if !path.is_empty() {
            // "." or keyed list elements: treat the current path as owned as a whole.
            out.insert(path.clone());
        }
    }
}

/// Reads the entries of `metadata.managedFields` (malformed entries are skipped).
pub fn read_managed(object: &Value) -> Vec<ManagedEntry> {
    let Some(list) = object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|e| {
            let operation = match e.get("operation").and_then(Value::as_str)? {
                "Apply" => Operation::Apply,
                "Update" => Operation::Update,
                _ => return None,
            };
            let mut fields = BTreeSet::new();
            if let Some(f) = e.get("fieldsV1") {
                fields_from_json(f, &mut Vec::new(), &mut fields);
            }
            Some(ManagedEntry {
                manager: e.get("manager").and_then(Value::as_str)?.to_string(),
                operation,
                subresource: e
                    .get("subresource")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                api_version: e
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                time: e
                    .get("time")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                fields,
            })
        })
        .collect()
}

/// Writes `entries` (the empty ones dropped) as `metadata.managedFields`.
pub fn write_managed(object: &mut Value, entries: &[ManagedEntry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut m = Map::new();
            m.insert("manager".into(), Value::String(e.manager.clone()));
            m.insert(
                "operation".into(),
                Value::String(e.operation.as_str().into()),
            );
            m.insert("apiVersion".into(), Value::String(e.api_version.clone()));
            m.insert("time".into(), Value::String(e.time.clone()));
            m.insert("fieldsType".into(), Value::String("FieldsV1".into()));
            m.insert("fieldsV1".into(), fields_to_json(&e.fields));
            if !e.subresource.is_empty() {
                m.insert("subresource".into(), Value::String(e.subresource.clone()));
            }
            Value::Object(m)
        })
        .collect();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// What an apply needs to know besides the objects.
#[derive(Debug, Clone, Copy)]
pub struct ApplyRequest<'a> {
    pub manager: &'a str,
    pub force: bool,
    pub scope: Scope,
    pub api_version: &'a str,
    pub now: &'a str,
}

fn upsert_entry<'a>(
    entries: &'a mut Vec<ManagedEntry>,
    manager: &str,
    operation: Operation,
    scope: Scope,
    api_version: &str,
) -> &'a mut ManagedEntry {
    let sub = scope.subresource();
    let pos = entries
        .iter()
        .position(|e| e.manager == manager && e.operation == operation && e.subresource == sub);
    let i = match pos {
        Some(i) => i,
        None => {
            entries.push(ManagedEntry {
                manager: manager.to_string(),
                operation,
                subresource: sub.to_string(),
                api_version: api_version.to_string(),
                time: String::new(),
                fields: BTreeSet::new(),
            });
            entries.len() - 1
        }
    };
    &mut entries[i]
}

/// Server-side apply of `applied` (already checked for kind and name) onto `live` (`None` when
/// the object does not exist yet; then the result starts from `applied`'s identity).
/// Returns the new object with managedFields updated, or the conflicts.
///
/// `normalize` applies the server's defaulting to a candidate result, so that a value that only
/// differs from the live one before defaulting (a port without its default protocol) is neither a
/// conflict nor a change, as in the real server, which compares defaulted objects.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    req: ApplyRequest<'_>,
    normalize: &dyn Fn(&mut Value),
) -> Result<Value, Vec<Conflict>> {
    let applied_scoped = scoped(applied, req.scope);
    let new_fields = leaf_paths(&applied_scoped);
    let base = live.cloned().unwrap_or_else(|| {
        let mut skeleton = Map::new();
        for k in ["apiVersion", "kind"] {
            if let Some(v) = applied.get(k) {
                skeleton.insert(k.into(), v.clone());
            }
        }
        let mut meta = Map::new();
        for k in ["name", "namespace", "generateName"] {
            if let Some(v) = applied.pointer(&format!("/metadata/{k}")) {
                meta.insert(k.into(), v.clone());
            }
        }
        skeleton.insert("metadata".into(), Value::Object(meta));
        Value::Object(skeleton)
    });
    let mut entries = read_managed(&base);
    let sub = req.scope.subresource();
    let mine = |e: &ManagedEntry| {
        e.manager == req.manager && e.operation == Operation::Apply && e.subresource == sub
    };
    let previous: BTreeSet<FieldPath> = entries
        .iter()
        .filter(|e| mine(e))
        .flat_map(|e| e.fields.clone())
        .collect();

    let mut result = base.clone();
    for gone in previous.difference(&new_fields) {
        let owned_elsewhere = entries
            .iter()
            .filter(|e| !mine(e))
            .any(|e| e.fields.iter().any(|q| related(q, gone)));
        if !owned_elsewhere {
            remove_path(&mut result, gone);
        }
    }
    merge_applied(&mut result, &applied_scoped);
    let mut normalized = result.clone();
    normalize(&mut normalized);

    let mut conflicts = Vec::new();
    for e in entries.iter().filter(|e| e.manager != req.manager) {
        for q in &e.fields {
            if new_fields.iter().any(|p| related(p, q))
                && get_path(&base, q) != get_path(&normalized, q)
            {
                conflicts.push(Conflict {
                    manager: e.manager.clone(),
                    path: dotted(q),
                });
            }
        }
    }
    if !conflicts.is_empty() {
        if !req.force {
            return Err(conflicts);
        }
        for e in entries.iter_mut().filter(|e| e.manager != req.manager) {
            e.fields.retain(|q| {
                !(new_fields.iter().any(|p| related(p, q))
                    && get_path(&base, q) != get_path(&normalized, q))
            });
        }
    }
    let unchanged = live.is_some_and(|l| scoped(l, Scope::All) == scoped(&normalized, Scope::All))
        && previous == new_fields;
    let entry = upsert_entry(
        &mut entries,
        req.manager,
        Operation::Apply,
        req.scope,
        req.api_version,
    );
    entry.fields = new_fields;
    if !unchanged || entry.time.is_empty() {
        entry.time = req.now.to_string();
    }
    entry.api_version = req.api_version.to_string();
    entries.retain(|e| !e.fields.is_empty());
    write_managed(&mut result, &entries);
    Ok(result)
}

/// Records an update (PUT, non-apply patch, create) by `manager`: it takes ownership of every
/// field it changed; fields it removed are owned by nobody.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    scope: Scope,
    api_version: &str,
    now: &str,
) {
    let mut entries = old.map(read_managed).unwrap_or_default();
    let old_scoped = old
        .map(|o| scoped(o, scope))
        .unwrap_or(Value::Object(Map::new()));
    let new_scoped = scoped(new, scope);
    let old_leaves = leaf_paths(&old_scoped);
    let new_leaves = leaf_paths(&new_scoped);
    let changed: BTreeSet<FieldPath> = old_leaves
        .union(&new_leaves)
        .filter(|p| get_path(&old_scoped, p) != get_path(&new_scoped, p))
        .cloned()
        .collect();
    if !changed.is_empty() {
        for e in entries.iter_mut() {
            e.fields.retain(|q| !changed.iter().any(|p| related(p, q)));
        }
        let entry = upsert_entry(&mut entries, manager, Operation::Update, scope, api_version);
        entry
            .fields
            .extend(changed.into_iter().filter(|p| new_leaves.contains(p)));
        entry.time = now.to_string();
        entry.api_version = api_version.to_string();
    }
    entries.retain(|e| !e.fields.is_empty());
    write_managed(new, &entries);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(manager: &str, force: bool) -> ApplyRequest<'_> {
        ApplyRequest {
            manager,
            force,
            scope: Scope::All,
            api_version: "v1",
            now: "2026-01-01T00:00:00Z",
        }
    }

    fn cm(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data})
    }

    #[test]
    fn two_managers_applying_the_same_value_share_the_field() {
        let a = apply(None, &cm(json!({"x": "1"})), req("a", false), &|_| {}).unwrap();
        let b = apply(Some(&a), &cm(json!({"x": "1"})), req("b", false), &|_| {}).unwrap();
        assert_eq!(read_managed(&b).len(), 2);
    }

    #[test]
    fn changing_a_field_owned_by_another_manager_conflicts_unless_forced() {
        let a = apply(None, &cm(json!({"x": "1"})), req("a", false), &|_| {}).unwrap();
        let err = apply(Some(&a), &cm(json!({"x": "2"})), req("b", false), &|_| {}).unwrap_err();
        assert_eq!(
            err,
            vec![Conflict {
                manager: "a".into(),
                path: ".data.x".into()
            }]
        );
        let b = apply(Some(&a), &cm(json!({"x": "2"})), req("b", true), &|_| {}).unwrap();
        assert_eq!(b["data"]["x"], "2");
        let owners: Vec<String> = read_managed(&b).into_iter().map(|e| e.manager).collect();
        assert_eq!(owners, vec!["b".to_string()]);
    }

    #[test]
    fn fields_a_manager_stops_applying_are_removed_unless_someone_else_owns_them() {
        let a = apply(
            None,
            &cm(json!({"x": "1", "y": "1"})),
            req("a", false),
            &|_| {},
        )
        .unwrap();
        let b = apply(Some(&a), &cm(json!({"y": "1"})), req("b", false), &|_| {}).unwrap();
        let a2 = apply(Some(&b), &cm(json!({})), req("a", false), &|_| {}).unwrap();
        assert_eq!(a2["data"], json!({"y": "1"}));
    }

    #[test]
    fn an_update_takes_ownership_of_the_fields_it_changes() {
        let a = apply(None, &cm(json!({"x": "1"})), req("a", false), &|_| {}).unwrap();
        let mut updated = a.clone();
        updated["data"]["x"] = json!("2");
        record_update(Some(&a), &mut updated, "kubectl", Scope::All, "v1", "t");
        let entries = read_managed(&updated);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].manager, "kubectl");
        let err = apply(
            Some(&updated),
            &cm(json!({"x": "3"})),
            req("a", false),
            &|_| {},
        )
        .unwrap_err();
        assert_eq!(err[0].manager, "kubectl");
    }

    #[test]
    fn managed_fields_round_trip_through_fields_v1() {
        let a = apply(None, &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"a": "b"}}, "data": {"x": "1"}}), req("a", false), &|_| {}).unwrap();
        let fields = &read_managed(&a)[0].fields;
        assert!(fields.contains(&vec![
            "metadata".to_string(),
            "labels".to_string(),
            "a".to_string()
        ]));
        assert_eq!(
            a["metadata"]["managedFields"][0]["fieldsV1"],
            json!({"f:data": {"f:x": {}}, "f:metadata": {"f:labels": {"f:a": {}}}})
        );
    }
}
