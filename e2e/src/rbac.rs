//! Kubernetes RBAC evaluated over the fake API server's request log: what the Roles,
//! ClusterRoles and their bindings grant a service account ([`Grants`]), and the attributes a
//! real server authorizes a logged request by ([`attributes`]). The fake server enforces nothing;
//! this says what a real one would have refused.
//!
//! Covered: rules by API group, resource (with subresource), verb and `resourceNames`;
//! ClusterRoleBindings (everywhere) and RoleBindings (their namespace, to a Role or a
//! ClusterRole). Not covered: aggregated ClusterRoles, groups as subjects, non-resource URLs
//! (discovery is allowed to every authenticated user by default anyway).
//!
//! On the real API server RBAC is enforced, and what it refused is in its audit log:
//! [`audited`] sorts a user's requests by their answer (`tests/deploy.rs` still evaluates the
//! fake server's log; the apply lab reads the audit log).

use std::collections::BTreeSet;

use anyhow::{Context as _, Result};
use serde_json::Value;
use swimlb_control_plane::control_plane::AuditRecord;
use swimlb_fake_api::RequestRecord;

/// One rule of a Role or ClusterRole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// `apiGroups`.
    pub groups: Vec<String>,
    /// `resources` (`services`, `services/status`).
    pub resources: Vec<String>,
    /// `verbs`.
    pub verbs: Vec<String>,
    /// `resourceNames` (empty: any).
    pub names: Vec<String>,
}

impl Rule {
    /// Whether the rule allows a request with attributes `a`.
    pub fn allows(&self, a: &Attributes) -> bool {
        let any = |list: &[String], value: &str| list.iter().any(|x| x == "*" || x == value);
        any(&self.groups, &a.group)
            && any(&self.resources, &a.resource)
            && any(&self.verbs, a.verb)
            && (self.names.is_empty() || a.name.as_ref().is_some_and(|n| self.names.contains(n)))
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn rules_of(role: &Value) -> Vec<Rule> {
    role["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| Rule {
            groups: strings(&r["apiGroups"]),
            resources: strings(&r["resources"]),
            verbs: strings(&r["verbs"]),
            names: strings(&r["resourceNames"]),
        })
        .collect()
}

/// What RBAC grants one service account: rules everywhere (ClusterRoleBindings) and rules in
/// one namespace (RoleBindings).
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// Rules that hold in every namespace and for cluster-scoped resources.
    pub cluster: Vec<Rule>,
    /// Rules that hold in one namespace.
    pub namespaced: Vec<(String, Rule)>,
}

impl Grants {
    /// What the RBAC objects among `objects` (anything else is ignored) grant the service
    /// account `namespace/account`. A binding to a role that is not among them is an error.
    pub fn of(objects: &[Value], namespace: &str, account: &str) -> Result<Grants> {
        let bound = |binding: &Value| {
            binding["subjects"].as_array().is_some_and(|s| {
                s.iter().any(|s| {
                    s["kind"] == "ServiceAccount"
                        && s["name"] == account
                        && s["namespace"] == namespace
                })
            })
        };
        let mut out = Grants::default();
        for binding in objects
            .iter()
            .filter(|o| {
                matches!(
                    o["kind"].as_str(),
                    Some("ClusterRoleBinding" | "RoleBinding")
                )
            })
            .filter(|o| bound(o))
        {
            let reference = &binding["roleRef"];
            let kind = reference["kind"].as_str().unwrap_or_default();
            let binding_ns = binding["metadata"]["namespace"].as_str();
            let role = objects
                .iter()
                .find(|o| {
                    o["kind"] == kind
                        && o["metadata"]["name"] == reference["name"]
                        && (kind == "ClusterRole"
                            || o["metadata"]["namespace"].as_str() == binding_ns)
                })
                .with_context(|| {
                    format!(
                        "{} {}: no {kind} {}",
                        binding["kind"], binding["metadata"]["name"], reference["name"]
                    )
                })?;
            let rules = rules_of(role);
            match (binding["kind"].as_str(), binding_ns) {
                (Some("ClusterRoleBinding"), _) => out.cluster.extend(rules),
                (_, Some(ns)) => out
                    .namespaced
                    .extend(rules.into_iter().map(|r| (ns.to_string(), r))),
                _ => {}
            }
        }
        Ok(out)
    }

    /// Whether a request with attributes `a` is allowed.
    pub fn allows(&self, a: &Attributes) -> bool {
        self.cluster.iter().any(|r| r.allows(a))
            || self
                .namespaced
                .iter()
                .any(|(ns, r)| a.namespace.as_deref() == Some(ns.as_str()) && r.allows(a))
    }
}

/// A request as RBAC sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`
    /// (`unknown` for a method RBAC has no verb for: nothing allows it).
    pub verb: &'static str,
    /// The API group (empty: core).
    pub group: String,
    /// `services` or `services/status`.
    pub resource: String,
    /// The namespace, for namespaced requests.
    pub namespace: Option<String>,
    /// The object's name, for requests that name one (not a create).
    pub name: Option<String>,
}

/// The attributes a real server authorizes a logged request by; a server-side apply that
/// created its object (201) needs `create` as well. Empty for discovery and unknown paths.
pub fn attributes(r: &RequestRecord) -> Vec<Attributes> {
    use swimlb_fake_api::resources::{RESOURCES, Route, parse_path};
    let Some(Route::Resource(p)) = parse_path(&r.path) else {
        return Vec::new();
    };
    let kind = &RESOURCES[p.resource];
    let resource = match &p.subresource {
        Some(sub) => format!("{}/{sub}", kind.plural),
        None => kind.plural.to_string(),
    };
    let verbs: &[&'static str] = match (r.method.as_str(), p.name.is_some(), r.watch) {
        ("GET", _, true) => &["watch"],
        ("GET", true, false) => &["get"],
        ("GET", false, false) => &["list"],
        ("POST", _, _) => &["create"],
        ("PUT", _, _) => &["update"],
        ("PATCH", _, _) if r.code == 201 => &["patch", "create"],
        ("PATCH", _, _) => &["patch"],
        ("DELETE", true, _) => &["delete"],
        ("DELETE", false, _) => &["deletecollection"],
        _ => &["unknown"],
    };
    verbs
        .iter()
        .map(|verb| Attributes {
            verb,
            group: kind.group.to_string(),
            resource: resource.clone(),
            namespace: p.namespace.clone(),
            // RBAC matches resourceNames only for requests that name an object (not create).
            name: if *verb == "create" {
                None
            } else {
                p.name.clone()
            },
        })
        .collect()
}

/// What the API server answered a user's requests, from its audit log.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// Requests of the user.
    pub requests: usize,
    /// The requests the authorizers refused (403).
    pub refused: Vec<AuditRecord>,
    /// The requests the server asked to retry (429): a watch of a custom resource while the
    /// API server's watch cache for it still initializes, just after its CRD was created.
    pub retried: Vec<AuditRecord>,
    /// The requests that failed otherwise: neither answered (2xx), retried, nor an expected
    /// 404 (a missing object) or 409 (a conflict the client resolves).
    pub failed: Vec<AuditRecord>,
    /// What was answered, as `verb resource`.
    pub used: BTreeSet<String>,
}

/// The verdict of the audit log `log` on the requests of `user`.
pub fn audited(log: &[AuditRecord], user: &str) -> Verdict {
    let mut out = Verdict::default();
    for r in log.iter().filter(|r| r.user == user) {
        out.requests += 1;
        match r.code {
            200..=299 => {
                out.used.insert(format!("{} {}", r.verb, r.resource));
            }
            403 => out.refused.push(r.clone()),
            429 => out.retried.push(r.clone()),
            404 | 409 => {}
            _ => out.failed.push(r.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(user: &str, verb: &str, resource: &str, code: u16) -> AuditRecord {
        AuditRecord {
            user: user.to_string(),
            verb: verb.to_string(),
            resource: resource.to_string(),
            namespace: "swimlb-system".to_string(),
            name: String::new(),
            code,
        }
    }

    #[test]
    fn the_audit_log_sorts_a_users_requests_by_their_answer() {
        let sa = "system:serviceaccount:swimlb-system:swimlb-speaker";
        let log = [
            record(sa, "watch", "pods", 200),
            record(sa, "create", "servicel2statuses", 201),
            record(sa, "delete", "servicel2statuses", 404),
            record(sa, "patch", "servicel2statuses", 409),
            record(sa, "get", "secrets", 403),
            record(sa, "patch", "servicel2statuses/status", 500),
            record(sa, "watch", "l2advertisements", 429),
            record("system:node:node1", "get", "secrets", 403),
        ];
        let verdict = audited(&log, sa);
        assert_eq!(verdict.requests, 7);
        assert_eq!(verdict.retried, [log[6].clone()]);
        assert_eq!(verdict.refused, [log[4].clone()]);
        assert_eq!(verdict.failed, [log[5].clone()]);
        assert_eq!(
            verdict.used.into_iter().collect::<Vec<_>>(),
            ["create servicel2statuses", "watch pods"]
        );
    }
}
