//! A checked Kubernetes label selector and its matcher.
//!
//! [`Selector::parse`] turns a `LabelSelector` (matchLabels and matchExpressions with `In`,
//! `NotIn`, `Exists`, `DoesNotExist`) into requirements and rejects what the API server would
//! reject (an unknown operator, `In` without values, `Exists` with values). [`Selector::matches`]
//! is pure and follows Kubernetes semantics: every requirement must hold, and an empty selector
//! matches everything.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// One condition on a label set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// The key is present with one of the values (`matchLabels` gives one value).
    In(String, BTreeSet<String>),
    /// The key is absent, or present with none of the values.
    NotIn(String, BTreeSet<String>),
    /// The key is present.
    Exists(String),
    /// The key is absent.
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Requirement::Exists(key) => labels.contains_key(key),
            Requirement::DoesNotExist(key) => !labels.contains_key(key),
        }
    }
}

/// A parsed label selector: all requirements must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

/// Why a label selector is invalid. The field is relative to the selector.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The operator is not one of In, NotIn, Exists, DoesNotExist.
    #[error(
        "matchExpressions[{index}].operator: unknown operator {operator:?} (want In, NotIn, Exists or DoesNotExist)"
    )]
    UnknownOperator {
        /// Position in matchExpressions.
        index: usize,
        /// The operator as written.
        operator: String,
    },
    /// `In` or `NotIn` without values.
    #[error("matchExpressions[{index}].values: operator {operator} needs at least one value")]
    MissingValues {
        /// Position in matchExpressions.
        index: usize,
        /// The operator as written.
        operator: String,
    },
    /// `Exists` or `DoesNotExist` with values.
    #[error("matchExpressions[{index}].values: operator {operator} takes no values")]
    UnexpectedValues {
        /// Position in matchExpressions.
        index: usize,
        /// The operator as written.
        operator: String,
    },
    /// An empty key.
    #[error("{field}: empty label key")]
    EmptyKey {
        /// Where the key is.
        field: String,
    },
}

impl Selector {
    /// The selector that matches every label set.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Checks a `LabelSelector`; reports every problem in it.
    pub fn parse(selector: &LabelSelector) -> Result<Self, Vec<SelectorError>> {
        let mut requirements = Vec::new();
        let mut errors = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            if key.is_empty() {
                errors.push(SelectorError::EmptyKey {
                    field: "matchLabels".into(),
                });
                continue;
            }
            requirements.push(Requirement::In(
                key.clone(),
                BTreeSet::from([value.clone()]),
            ));
        }
        for (index, expr) in selector.match_expressions.iter().flatten().enumerate() {
            if expr.key.is_empty() {
                errors.push(SelectorError::EmptyKey {
                    field: format!("matchExpressions[{index}].key"),
                });
                continue;
            }
            let values: BTreeSet<String> = expr.values.iter().flatten().cloned().collect();
            let operator = expr.operator.clone();
            let requirement = match expr.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    errors.push(SelectorError::MissingValues { index, operator });
                    continue;
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    errors.push(SelectorError::UnexpectedValues { index, operator });
                    continue;
                }
                "In" => Requirement::In(expr.key.clone(), values),
                "NotIn" => Requirement::NotIn(expr.key.clone(), values),
                "Exists" => Requirement::Exists(expr.key.clone()),
                "DoesNotExist" => Requirement::DoesNotExist(expr.key.clone()),
                _ => {
                    errors.push(SelectorError::UnknownOperator { index, operator });
                    continue;
                }
            };
            requirements.push(requirement);
        }
        if errors.is_empty() {
            Ok(Self { requirements })
        } else {
            Err(errors)
        }
    }

    /// Whether every requirement holds for these labels.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// The requirements, in the order written (matchLabels first).
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: if values.is_empty() {
                None
            } else {
                Some(values.iter().map(|v| v.to_string()).collect())
            },
        }
    }

    #[test]
    fn an_empty_selector_matches_everything() {
        let s = Selector::parse(&LabelSelector::default()).expect("valid");
        assert!(s.matches(&labels(&[])));
        assert!(s.matches(&labels(&[("a", "b")])));
    }

    #[test]
    fn each_operator_matches_as_kubernetes_does() {
        type Case = (
            LabelSelectorRequirement,
            &'static [(&'static str, &'static str)],
            bool,
        );
        let cases: &[Case] = &[
            (expr("app", "In", &["a", "b"]), &[("app", "b")], true),
            (expr("app", "In", &["a", "b"]), &[("app", "c")], false),
            (expr("app", "In", &["a"]), &[], false),
            (expr("app", "NotIn", &["a"]), &[], true),
            (expr("app", "NotIn", &["a"]), &[("app", "a")], false),
            (expr("app", "NotIn", &["a"]), &[("app", "z")], true),
            (expr("app", "Exists", &[]), &[("app", "")], true),
            (expr("app", "Exists", &[]), &[], false),
            (expr("app", "DoesNotExist", &[]), &[], true),
            (expr("app", "DoesNotExist", &[]), &[("app", "x")], false),
        ];
        for (e, l, want) in cases {
            let sel = LabelSelector {
                match_expressions: Some(vec![e.clone()]),
                match_labels: None,
            };
            let s = Selector::parse(&sel).expect("valid");
            assert_eq!(s.matches(&labels(l)), *want, "{e:?} on {l:?}");
        }
    }

    #[test]
    fn match_labels_and_expressions_must_all_hold() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("tier", "web")])),
            match_expressions: Some(vec![expr("env", "NotIn", &["dev"])]),
        };
        let s = Selector::parse(&sel).expect("valid");
        assert!(s.matches(&labels(&[("tier", "web"), ("env", "prod")])));
        assert!(!s.matches(&labels(&[("tier", "web"), ("env", "dev")])));
        assert!(!s.matches(&labels(&[("env", "prod")])));
    }

    #[test]
    fn every_invalid_expression_is_reported() {
        let sel = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![
                expr("a", "Equals", &["x"]),
                expr("b", "In", &[]),
                expr("c", "Exists", &["x"]),
                expr("", "Exists", &[]),
            ]),
        };
        let errors = Selector::parse(&sel).expect_err("invalid");
        assert_eq!(errors.len(), 4);
        assert_eq!(
            errors[0].to_string(),
            "matchExpressions[0].operator: unknown operator \"Equals\" (want In, NotIn, Exists or DoesNotExist)"
        );
        assert!(matches!(
            errors[1],
            SelectorError::MissingValues { index: 1, .. }
        ));
        assert!(matches!(
            errors[2],
            SelectorError::UnexpectedValues { index: 2, .. }
        ));
        assert!(matches!(errors[3], SelectorError::EmptyKey { .. }));
    }
}
