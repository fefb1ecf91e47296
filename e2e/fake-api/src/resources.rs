//! The static table of resources the fake API server serves, and URL path parsing.
//!
//! Owns: which (group, version, plural) exist, their kind, scope, whether they have a status
//! subresource, which name rule applies, and which field selectors the real server supports for
//! them. Guarantees: a path either parses to a known resource or to a discovery endpoint, or is
//! reported as unknown (404); nothing else is served.

/// How an object name is validated (the real server uses one of these per kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// DNS-1123 subdomain: lowercase alphanumerics, `-` and `.`, at most 253 characters.
    Subdomain,
    /// DNS-1035 label: lowercase alphanumerics and `-`, starts with a letter, at most 63.
    Label1035,
    /// DNS-1123 label: lowercase alphanumerics and `-`, at most 63 (namespaces).
    Label1123,
    /// Events: any name that is a valid path segment (the real server is lenient here).
    PathSegment,
}

/// One served resource.
#[derive(Debug, Clone, Copy)]
pub struct ResourceKind {
    /// API group, empty for the core group.
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub status_subresource: bool,
    pub name_rule: NameRule,
    /// Whether PUT without `metadata.resourceVersion` is allowed (true for built-in kinds,
    /// false for custom resources, as in the real server).
    pub unconditional_update: bool,
    /// Field selector keys supported besides `metadata.name` and `metadata.namespace`.
    pub extra_field_selectors: &'static [&'static str],
}

impl ResourceKind {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `services` or `ipaddresspools.swimlb.io`, as the real server names resources in errors.
    pub fn qualified_name(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The group/version prefix of this resource's URLs.
    pub fn path_prefix(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }

    pub fn is_custom(&self) -> bool {
        self.group == SWIMLB_GROUP
    }
}

/// The group of the swimlb custom resources.
pub const SWIMLB_GROUP: &str = "swimlb.io";

const fn core(
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    status_subresource: bool,
    name_rule: NameRule,
    extra_field_selectors: &'static [&'static str],
) -> ResourceKind {
    ResourceKind {
        group: "",
        version: "v1",
        plural,
        singular,
        kind,
        namespaced,
        status_subresource,
        name_rule,
        unconditional_update: true,
        extra_field_selectors,
    }
}

/// `a == b` in a const context (`str`'s `==` is not const).
const fn const_str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

const fn grouped(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    status_subresource: bool,
    name_rule: NameRule,
) -> ResourceKind {
    ResourceKind {
        group,
        version,
        plural,
        singular,
        kind,
        namespaced: true,
        status_subresource,
        name_rule,
        unconditional_update: !const_str_eq(group, SWIMLB_GROUP),
        extra_field_selectors: &[],
    }
}

/// `resource`, cluster-scoped.
const fn cluster_scoped(mut resource: ResourceKind) -> ResourceKind {
    resource.namespaced = false;
    resource
}

/// Every served resource. Index into this table is the store's resource id.
pub static RESOURCES: &[ResourceKind] = &[
    core(
        "namespaces",
        "namespace",
        "Namespace",
        false,
        true,
        NameRule::Label1123,
        &["status.phase"],
    ),
    core(
        "services",
        "service",
        "Service",
        true,
        true,
        NameRule::Label1035,
        &["spec.clusterIP", "spec.type"],
    ),
    core(
        "secrets",
        "secret",
        "Secret",
        true,
        false,
        NameRule::Subdomain,
        &["type"],
    ),
    core(
        "nodes",
        "node",
        "Node",
        false,
        true,
        NameRule::Subdomain,
        &["spec.unschedulable"],
    ),
    core(
        "pods",
        "pod",
        "Pod",
        true,
        true,
        NameRule::Subdomain,
        &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    ),
    core(
        "events",
        "event",
        "Event",
        true,
        false,
        NameRule::PathSegment,
        &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
    ),
    grouped(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "endpointslice",
        "EndpointSlice",
        false,
        NameRule::Subdomain,
    ),
    grouped(
        "coordination.k8s.io",
        "v1",
        "leases",
        "lease",
        "Lease",
        false,
        NameRule::Subdomain,
    ),
    grouped(
        "events.k8s.io",
        "v1",
        "events",
        "event",
        "Event",
        false,
        NameRule::PathSegment,
    ),
    grouped(
        SWIMLB_GROUP,
        "v1beta1",
        "ipaddresspools",
        "ipaddresspool",
        "IPAddressPool",
        true,
        NameRule::Subdomain,
    ),
    grouped(
        SWIMLB_GROUP,
        "v1beta1",
        "l2advertisements",
        "l2advertisement",
        "L2Advertisement",
        false,
        NameRule::Subdomain,
    ),
    grouped(
        SWIMLB_GROUP,
        "v1beta1",
        "servicel2statuses",
        "servicel2status",
        "ServiceL2Status",
        true,
        NameRule::Subdomain,
    ),
    // What `kubectl apply --server-side -f deploy/swimlb.yaml` creates besides the above
    // (e2e/tests/deploy.rs): stored and served, with the metadata checks only.
    core(
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        false,
        NameRule::Subdomain,
        &[],
    ),
    cluster_scoped(grouped(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "customresourcedefinition",
        "CustomResourceDefinition",
        true,
        NameRule::Subdomain,
    )),
    cluster_scoped(grouped(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
        NameRule::PathSegment,
    )),
    cluster_scoped(grouped(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        NameRule::PathSegment,
    )),
    grouped(
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "role",
        "Role",
        false,
        NameRule::PathSegment,
    ),
    grouped(
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        false,
        NameRule::PathSegment,
    ),
    grouped(
        "apps",
        "v1",
        "deployments",
        "deployment",
        "Deployment",
        true,
        NameRule::Subdomain,
    ),
    grouped(
        "apps",
        "v1",
        "daemonsets",
        "daemonset",
        "DaemonSet",
        true,
        NameRule::Subdomain,
    ),
    grouped(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        NameRule::Subdomain,
    ),
    grouped(
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "networkpolicy",
        "NetworkPolicy",
        false,
        NameRule::Subdomain,
    ),
];

/// Index of the namespaces resource in [`RESOURCES`].
pub const NAMESPACES: usize = 0;

/// Finds a resource by group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Finds a resource by its `apiVersion` and `kind` (for tests and direct store access).
pub fn find_kind(api_version: &str, kind: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.api_version() == api_version && r.kind == kind)
}

/// What a request path addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/version`
    Version,
    /// `/api`
    CoreVersions,
    /// `/apis`
    GroupList,
    /// `/api/v1` or `/apis/{group}/{version}`
    ResourceList { group: String, version: String },
    /// `/openapi/v3`: the OpenAPI v3 discovery document (which group-versions have a spec).
    OpenApiRoot,
    /// `/openapi/v3/api/v1` or `/openapi/v3/apis/{group}/{version}`: a group-version's spec.
    OpenApiGroupVersion { group: String, version: String },
    /// A collection or a named object, optionally a subresource.
    Resource(ResourcePath),
}

/// A path to a resource collection or object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath {
    pub resource: usize,
    /// `None` for cluster-wide collections and cluster-scoped objects.
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

/// Parses a request path (without query). `None` means 404.
pub fn parse_path(path: &str) -> Option<Route> {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    match segments.as_slice() {
        ["version"] => Some(Route::Version),
        ["api"] => Some(Route::CoreVersions),
        ["apis"] => Some(Route::GroupList),
        ["api", version] => group_exists("", version).then(|| Route::ResourceList {
            group: String::new(),
            version: (*version).to_string(),
        }),
        ["apis", group, version] => group_exists(group, version).then(|| Route::ResourceList {
            group: (*group).to_string(),
            version: (*version).to_string(),
        }),
        ["openapi", "v3"] => Some(Route::OpenApiRoot),
        ["openapi", "v3", "api", version] => {
            group_exists("", version).then(|| Route::OpenApiGroupVersion {
                group: String::new(),
                version: (*version).to_string(),
            })
        }
        ["openapi", "v3", "apis", group, version] => {
            group_exists(group, version).then(|| Route::OpenApiGroupVersion {
                group: (*group).to_string(),
                version: (*version).to_string(),
            })
        }
        ["api", version, rest @ ..] => parse_resource("", version, rest).map(Route::Resource),
        ["apis", group, version, rest @ ..] => {
            parse_resource(group, version, rest).map(Route::Resource)
        }
        _ => None,
    }
}

fn group_exists(group: &str, version: &str) -> bool {
    RESOURCES
        .iter()
        .any(|r| r.group == group && r.version == version)
}

fn parse_resource(group: &str, version: &str, rest: &[&str]) -> Option<ResourcePath> {
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..] if find(group, version, plural).is_some() => {
            (Some((*ns).to_string()), {
                let mut v = vec![*plural];
                v.extend_from_slice(tail);
                v
            })
        }
        _ => (None, rest.to_vec()),
    };
    let (plural, name, subresource) = match rest.as_slice() {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some((*name).to_string()), None),
        [plural, name, sub] => (*plural, Some((*name).to_string()), Some((*sub).to_string())),
        _ => return None,
    };
    let resource = find(group, version, plural)?;
    let kind = &RESOURCES[resource];
    if namespace.is_some() && !kind.namespaced {
        return None;
    }
    if name.as_deref() == Some("") {
        return None;
    }
    Some(ResourcePath {
        resource,
        namespace: namespace.map(|n| percent_decode(&n)),
        name: name.map(|n| percent_decode(&n)),
        subresource,
    })
}

/// Decodes `%XX` escapes and, when `plus_is_space`, `+` (query strings). Invalid escapes are kept.
pub fn percent_decode_with(input: &str, plus_is_space: bool) -> String {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn percent_decode(input: &str) -> String {
    percent_decode_with(input, false)
}

/// Parses a query string into decoded pairs.
pub fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode_with(k, true), percent_decode_with(v, true))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_swimlb_custom_resources_need_a_resource_version_to_replace() {
        for r in RESOURCES {
            assert_eq!(
                r.unconditional_update,
                r.group != SWIMLB_GROUP,
                "{}",
                r.qualified_name()
            );
        }
        assert!(const_str_eq("swimlb.io", SWIMLB_GROUP));
        // Same length as swimlb.io, another group: the length comparison got this wrong.
        assert!(!const_str_eq("swimlb.xy", SWIMLB_GROUP));
    }

    #[test]
    fn namespaced_object_paths_parse_to_their_resource() {
        let route = parse_path("/api/v1/namespaces/default/services/web/status");
        let Some(Route::Resource(p)) = route else {
            panic!("not a resource route: {route:?}");
        };
        assert_eq!(RESOURCES[p.resource].plural, "services");
        assert_eq!(p.namespace.as_deref(), Some("default"));
        assert_eq!(p.name.as_deref(), Some("web"));
        assert_eq!(p.subresource.as_deref(), Some("status"));
    }

    #[test]
    fn the_namespaces_resource_itself_is_cluster_scoped() {
        let Some(Route::Resource(p)) = parse_path("/api/v1/namespaces/default") else {
            panic!("namespaces/default must parse");
        };
        assert_eq!(p.resource, NAMESPACES);
        assert_eq!(p.name.as_deref(), Some("default"));
        assert_eq!(p.namespace, None);
    }

    #[test]
    fn unknown_resources_and_namespaced_cluster_kinds_are_not_found() {
        assert_eq!(parse_path("/api/v1/configmaps"), None);
        assert_eq!(parse_path("/api/v1/namespaces/x/nodes/n"), None);
        assert_eq!(parse_path("/apis/swimlb.io/v1/ipaddresspools"), None);
    }

    #[test]
    fn the_openapi_v3_documents_exist_for_served_group_versions_only() {
        assert_eq!(parse_path("/openapi/v3"), Some(Route::OpenApiRoot));
        assert_eq!(
            parse_path("/openapi/v3/apis/apps/v1"),
            Some(Route::OpenApiGroupVersion {
                group: "apps".into(),
                version: "v1".into()
            })
        );
        assert!(parse_path("/openapi/v3/api/v1").is_some());
        assert_eq!(parse_path("/openapi/v3/apis/batch/v1"), None);
        assert_eq!(parse_path("/openapi/v2"), None);
    }

    #[test]
    fn the_cluster_scoped_kinds_of_the_install_file_take_no_namespace() {
        assert!(parse_path("/apis/rbac.authorization.k8s.io/v1/clusterroles/x").is_some());
        assert_eq!(
            parse_path("/apis/rbac.authorization.k8s.io/v1/namespaces/a/clusterroles/x"),
            None
        );
        assert!(parse_path("/apis/rbac.authorization.k8s.io/v1/namespaces/a/roles/x").is_some());
    }

    #[test]
    fn query_strings_decode_escapes_and_plus() {
        let q = parse_query("labelSelector=app%3Dweb%2Ctier+in+(a)&watch=true");
        assert_eq!(q[0], ("labelSelector".into(), "app=web,tier in (a)".into()));
        assert_eq!(q[1], ("watch".into(), "true".into()));
    }
}
