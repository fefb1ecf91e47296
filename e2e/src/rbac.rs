//! Kubernetes RBAC evaluated over the fake API server's request log: what the Roles,
//! ClusterRoles and their bindings grant a service account ([`Grants`]), and the attributes a
//! real server authorizes a logged request by ([`attributes`]). The fake server enforces nothing;
//! this says what a real one would have refused.
//!
//! Covered: rules by API group, resource (with subresource), verb and `resourceNames`;
//! ClusterRoleBindings (everywhere) and RoleBindings (their namespace, to a Role or a
//! ClusterRole). Not covered: aggregated ClusterRoles, groups as subjects, non-resource URLs
//! (discovery is allowed to every authenticated user by default anyway).

use anyhow::{Context as _, Result};
use serde_json::Value;
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

/// What a user's requests asked of its grants.
#[derive(Debug, Clone, Default)]
pub struct Audit {
    /// Requests of the user.
    pub requests: usize,
    /// The attributes RBAC would have refused.
    pub denied: std::collections::BTreeSet<Attributes>,
    /// What was allowed, as `verb group/resource`.
    pub used: std::collections::BTreeSet<String>,
    /// Granted rules no request needed (in every namespace they hold in).
    pub unused: Vec<Rule>,
}

/// Audits the requests of `user` in `log` against `grants`.
pub fn audit(grants: &Grants, log: &[RequestRecord], user: &str) -> Audit {
    let mut out = Audit::default();
    let mut needed = vec![false; grants.cluster.len() + grants.namespaced.len()];
    for r in log.iter().filter(|r| r.user == user) {
        out.requests += 1;
        for a in attributes(r) {
            if !grants.allows(&a) {
                out.denied.insert(a);
                continue;
            }
            out.used
                .insert(format!("{} {}/{}", a.verb, a.group, a.resource));
            for (i, rule) in grants.cluster.iter().enumerate() {
                needed[i] |= rule.allows(&a);
            }
            for (i, (ns, rule)) in grants.namespaced.iter().enumerate() {
                needed[grants.cluster.len() + i] |=
                    a.namespace.as_deref() == Some(ns.as_str()) && rule.allows(&a);
            }
        }
    }
    let rules = grants
        .cluster
        .iter()
        .chain(grants.namespaced.iter().map(|(_, r)| r));
    out.unused = rules
        .zip(&needed)
        .filter(|(_, n)| !**n)
        .map(|(r, _)| r.clone())
        .collect();
    out
}
