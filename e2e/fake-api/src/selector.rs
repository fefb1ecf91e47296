//! Label and field selectors, parsed from their query-string syntax and matched against JSON
//! objects.
//!
//! Owns: the grammar the real server accepts for `labelSelector` (`a=b`, `a==b`, `a!=b`,
//! `a in (x,y)`, `a notin (x,y)`, `a`, `!a`, `a>1`, `a<1`) and `fieldSelector` (`path=v`,
//! `path==v`, `path!=v`). Guarantees: a malformed selector is an error (400 at the HTTP layer),
//! never a selector that silently matches everything.

use serde_json::Value;
use std::collections::BTreeSet;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectorError {
    #[error("unable to parse requirement {requirement:?}: {reason}")]
    Malformed {
        requirement: String,
        reason: &'static str,
    },
    #[error("field label not supported: {field}")]
    UnsupportedField { field: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelOp {
    Equals(String),
    NotEquals(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Exists,
    DoesNotExist,
    GreaterThan(i64),
    LessThan(i64),
}

/// A parsed label selector: all requirements must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<(String, LabelOp)>,
}

/// Splits on commas that are not inside parentheses.
fn split_requirements(input: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&input[start..]);
    out
}

fn valid_label_key(key: &str) -> bool {
    crate::validation::qualified_name_errors(key).is_empty()
}

fn valid_label_value(value: &str) -> bool {
    crate::validation::label_value_errors(value).is_empty()
}

fn malformed(requirement: &str, reason: &'static str) -> SelectorError {
    SelectorError::Malformed {
        requirement: requirement.to_string(),
        reason,
    }
}

impl LabelSelector {
    /// Parses the query-string form. The empty string selects everything.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if input.trim().is_empty() {
            return Ok(Self { requirements });
        }
        for raw in split_requirements(input) {
            let req = raw.trim();
            if req.is_empty() {
                return Err(malformed(raw, "empty requirement"));
            }
            let (key, op) = parse_label_requirement(req)?;
            if !valid_label_key(&key) {
                return Err(malformed(req, "invalid label key"));
            }
            requirements.push((key, op));
        }
        Ok(Self { requirements })
    }

    /// Whether the labels of `object` (`metadata.labels`) satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.requirements.iter().all(|(key, op)| match op {
            LabelOp::Equals(v) => get(key) == Some(v.as_str()),
            LabelOp::NotEquals(v) => get(key) != Some(v.as_str()),
            LabelOp::In(set) => get(key).is_some_and(|v| set.contains(v)),
            LabelOp::NotIn(set) => !get(key).is_some_and(|v| set.contains(v)),
            LabelOp::Exists => get(key).is_some(),
            LabelOp::DoesNotExist => get(key).is_none(),
            LabelOp::GreaterThan(n) => get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            LabelOp::LessThan(n) => get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        })
    }
}

fn parse_set(req: &str, rest: &str) -> Result<BTreeSet<String>, SelectorError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| malformed(req, "set must be in parentheses"))?;
    let mut set = BTreeSet::new();
    for v in inner.split(',') {
        let v = v.trim();
        if !valid_label_value(v) {
            return Err(malformed(req, "invalid label value in set"));
        }
        set.insert(v.to_string());
    }
    Ok(set)
}

fn parse_label_requirement(req: &str) -> Result<(String, LabelOp), SelectorError> {
    if let Some(key) = req.strip_prefix('!') {
        return Ok((key.trim().to_string(), LabelOp::DoesNotExist));
    }
    for (sym, kind) in [("!=", 0), ("==", 1), ("=", 1), (">", 2), ("<", 3)] {
        if let Some((k, v)) = req.split_once(sym) {
            let (k, v) = (k.trim(), v.trim());
            let op = match kind {
                0 | 1 => {
                    if !valid_label_value(v) {
                        return Err(malformed(req, "invalid label value"));
                    }
                    if kind == 0 {
                        LabelOp::NotEquals(v.to_string())
                    } else {
                        LabelOp::Equals(v.to_string())
                    }
                }
                _ => {
                    let n = v
                        .parse::<i64>()
                        .map_err(|_| malformed(req, "gt/lt needs an integer"))?;
                    if kind == 2 {
                        LabelOp::GreaterThan(n)
                    } else {
                        LabelOp::LessThan(n)
                    }
                }
            };
            return Ok((k.to_string(), op));
        }
    }
    let mut words = req.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or_default().trim();
    let rest = words.next().unwrap_or_default().trim();
    if rest.is_empty() {
        return Ok((key.to_string(), LabelOp::Exists));
    }
    if let Some(set) = rest.strip_prefix("notin") {
        return Ok((key.to_string(), LabelOp::NotIn(parse_set(req, set)?)));
    }
    if let Some(set) = rest.strip_prefix("in") {
        return Ok((key.to_string(), LabelOp::In(parse_set(req, set)?)));
    }
    Err(malformed(req, "unknown operator"))
}

/// A parsed field selector: all terms must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses `path=v,path!=v`; `supported` lists the paths allowed besides `metadata.name` and
    /// `metadata.namespace` (the real server rejects others).
    pub fn parse(input: &str, supported: &[&str]) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        if input.trim().is_empty() {
            return Ok(Self { terms });
        }
        for raw in input.split(',') {
            let req = raw.trim();
            let (field, equal, value) = if let Some((f, v)) = req.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = req.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = req.split_once('=') {
                (f, true, v)
            } else {
                return Err(malformed(req, "field selector needs = or !="));
            };
            let field = field.trim();
            if field != "metadata.name"
                && field != "metadata.namespace"
                && !supported.contains(&field)
            {
                return Err(SelectorError::UnsupportedField {
                    field: field.to_string(),
                });
            }
            terms.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(Self { terms })
    }

    /// Whether every term holds; a missing field compares as the empty string.
    pub fn matches(&self, object: &Value) -> bool {
        self.terms.iter().all(|(field, equal, want)| {
            let mut cur = Some(object);
            for seg in field.split('.') {
                cur = cur.and_then(|c| c.get(seg));
            }
            let have = match cur {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                _ => String::new(),
            };
            (have == *want) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "labels": labels}})
    }

    #[test]
    fn every_label_operator_selects_what_the_real_server_selects() {
        let o = obj(json!({"app": "web", "tier": "front", "n": "5"}));
        let yes = [
            "app=web",
            "app==web",
            "app!=db",
            "tier in (front,back)",
            "tier notin (back)",
            "app",
            "!missing",
            "n>3",
            "n<9",
            "app=web,tier=front",
        ];
        for s in yes {
            assert!(
                LabelSelector::parse(s).unwrap().matches(&o),
                "{s} should match"
            );
        }
        let no = [
            "app=db",
            "app!=web",
            "tier in (back)",
            "tier notin (front)",
            "missing",
            "!app",
            "n>5",
            "app=web,tier=back",
            "missing in (x)",
        ];
        for s in no {
            assert!(
                !LabelSelector::parse(s).unwrap().matches(&o),
                "{s} should not match"
            );
        }
        assert!(
            LabelSelector::parse("missing notin (x)")
                .unwrap()
                .matches(&o)
        );
    }

    #[test]
    fn malformed_label_selectors_are_rejected() {
        for s in [
            "app in x",
            "app=web,",
            "bad key!=x",
            "app=a b",
            "n>x",
            "app foo (x)",
        ] {
            assert!(LabelSelector::parse(s).is_err(), "{s} should be rejected");
        }
    }

    #[test]
    fn field_selectors_match_paths_and_reject_unsupported_fields() {
        let o = json!({"metadata": {"name": "a", "namespace": "ns"}, "spec": {"nodeName": "n1"}});
        let sel =
            FieldSelector::parse("metadata.name=a,spec.nodeName!=n2", &["spec.nodeName"]).unwrap();
        assert!(sel.matches(&o));
        let sel = FieldSelector::parse("metadata.namespace=other", &[]).unwrap();
        assert!(!sel.matches(&o));
        assert!(FieldSelector::parse("spec.nodeName=n1", &[]).is_err());
    }
}
