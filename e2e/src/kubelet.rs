//! What a Kubernetes cluster runs for the objects `kubectl apply -f deploy/swimlb.yaml` stores,
//! played by the lab mechanically from those objects: nothing of swimlb is written here by hand,
//! every command line, variable, user, capability, volume and probe comes from the stored
//! DaemonSets and Deployments.
//!
//! - **Nodes** ([`register_nodes`]): each lab node registers its Node as its kubelet would
//!   (`kubernetes.io/hostname`, `kubernetes.io/os` and `kubernetes.io/arch` labels, its
//!   InternalIP, condition Ready).
//! - **The DaemonSet controller** ([`daemonset_pods`]): one Pod per Node that the template's
//!   `nodeSelector` and tolerations admit, made from the Pod template (labels, annotations,
//!   spec), bound to its node (`spec.nodeName`) and owned by the DaemonSet.
//! - **The Deployment controller and the scheduler** ([`deployment_pods`]): the Deployment's
//!   Pods, named and labelled (`pod-template-hash`) as its ReplicaSet names them, on the first
//!   Node. The lab runs **one replica**, whatever `replicas` says: a Pod off the host network
//!   needs a network namespace of its own, and the lab has one for it, the client's (two
//!   replicas there would bind the same port). No ReplicaSet object is made.
//! - **The kubelet** ([`Kubelet`]): one worker thread per Pod, as the kubelet's pod workers. It
//!   writes the Pod's status (on the host network `status.podIP` is the node's address, off it
//!   the client's, [`netns::CLIENT_V4`]), makes its Secret volumes, runs its container, probes
//!   it (startup, liveness, readiness: `httpGet`), restarts it when it exits or fails its
//!   liveness probe (back-off from 10 s, as the kubelet's), and stops it with its grace period.
//!
//! A container runs as `command` + `args` with `$(VAR)` references expanded from its
//! environment as Kubernetes expands them ([`expand`]), with that environment resolved (values,
//! the downward API's `fieldRef`s, `secretKeyRef`, `configMapKeyRef`), the image's binary
//! (`/usr/local/bin/swimlb-speaker`, `/usr/local/bin/swimlb-controller`, see `Containerfile`)
//! mapped to the lab binary's subcommand (`swimlb-lab speaker`, `swimlb-lab controller`), in the
//! Pod's network namespace, under `setpriv` with the user, group, capabilities and
//! `no_new_privs` its `securityContext` asks for ([`Privileges`]).
//!
//! Substitutes:
//! - The in-cluster configuration (the service account's token and `KUBERNETES_SERVICE_HOST`) is
//!   `KUBECONFIG`: a kubeconfig of the fake API server whose token names the Pod's service
//!   account ([`FakeApi::kubeconfig_for_user`]), so the server's request log says whose each
//!   request was. A Pod or ServiceAccount with `automountServiceAccountToken: false` gets none,
//!   as it would get no token.
//! - A Secret volume is a directory of the lab laid out as the kubelet lays it out (files
//!   behind a `..data` symlink that is swapped atomically), and the paths under its `mountPath`
//!   in the container's `args` and environment are rewritten to it ([`rewrite_paths`]). It is
//!   written when the Secret appears or changes, within [`TICK`]; a real kubelet takes up to its
//!   sync period (a minute) plus its cache's time to live.
//!
//! Not played: images and pulling (the lab binary stands for the image), the read-only root
//! file system, seccomp, resource limits, the projected token volume, init containers and Pods
//! of several containers (refused, with the reason), volumes other than Secrets (refused), Pod
//! deletion and rollouts. Containers start with a clean environment: `PATH` (the lab's, where
//! `ip` and `setpriv` are), `HOSTNAME` (the node's name on the host network, else the Pod's
//! name), the container's own variables and `KUBECONFIG`.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use swimlb_fake_api::FakeApi;
use tokio::time::Instant;

use crate::netns::{self, Lab, Node};
use crate::probe;

/// How often a pod worker looks at its container, its Secrets and its probes.
pub const TICK: Duration = Duration::from_millis(100);
/// The kubelet's first restart back-off; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(10);
/// The kubelet's longest restart back-off.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Where the image keeps its binaries (`Containerfile`: `COPY ... /usr/local/bin/`).
const IMAGE_BINARIES: [(&str, &str); 2] = [
    ("/usr/local/bin/swimlb-speaker", "speaker"),
    ("/usr/local/bin/swimlb-controller", "controller"),
];
/// The `PATH` of a container in the lab: the lab's tools (`ip`, `setpriv`) must be found.
const CONTAINER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The capabilities a container runtime (containerd, CRI-O) grants by default.
const DEFAULT_CAPABILITIES: [&str; 14] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "NET_RAW",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];
/// The letters of generated names (Kubernetes' `utilrand` alphabet: no vowels, no 0/1/3).
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Each lab node registers its Node, as its kubelet would.
pub fn register_nodes(api: &FakeApi, nodes: &[Node]) -> Result<()> {
    for node in nodes {
        api.create(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node.name, "labels": {
                "kubernetes.io/hostname": node.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": std::env::consts::ARCH}},
            "spec": {}}))?;
        api.merge_patch(
            "nodes",
            None,
            &node.name,
            &json!({"status": {
                "addresses": [{"type": "InternalIP", "address": node.v4.to_string()},
                              {"type": "Hostname", "address": node.name}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}),
            true,
        )?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The workload controllers: Pods from templates.

/// FNV-1a, 64 bits: the stable hash behind generated names.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `len` letters of [`NAME_ALPHABET`] from `seed` (a generated name's suffix; stable, where
/// Kubernetes draws them at random).
fn name_suffix(seed: &str, len: usize) -> String {
    let mut n = fnv1a(seed.as_bytes());
    let base = NAME_ALPHABET.len() as u64;
    (0..len)
        .map(|_| {
            let c = NAME_ALPHABET[(n % base) as usize];
            n /= base;
            char::from(c)
        })
        .collect()
}

fn text<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn described(object: &Value) -> String {
    format!(
        "{} {}/{}",
        text(object, "/kind").unwrap_or("object"),
        text(object, "/metadata/namespace").unwrap_or(""),
        text(object, "/metadata/name").unwrap_or("?")
    )
}

/// Whether `node`'s labels satisfy the template's `nodeSelector` and its taints are tolerated;
/// a required node affinity is refused (the lab does not evaluate it).
fn schedulable(spec: &Value, node: &Value) -> Result<bool> {
    if spec
        .pointer("/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution")
        .is_some()
    {
        bail!("spec.affinity.nodeAffinity.requiredDuringScheduling...: not played by the lab");
    }
    let labels = &node["metadata"]["labels"];
    let selected = spec["nodeSelector"]
        .as_object()
        .is_none_or(|want| want.iter().all(|(k, v)| labels[k] == *v));
    let tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    let tolerated = |taint: &Value| {
        tolerations.iter().any(|t| {
            let key_ok = match t["operator"].as_str().unwrap_or("Equal") {
                "Exists" => t["key"].is_null() || t["key"] == taint["key"],
                _ => t["key"] == taint["key"] && t["value"] == taint["value"],
            };
            key_ok && (t["effect"].is_null() || t["effect"] == taint["effect"])
        })
    };
    let taints_ok = node["spec"]["taints"].as_array().is_none_or(|taints| {
        taints
            .iter()
            .filter(|t| t["effect"] == "NoSchedule" || t["effect"] == "NoExecute")
            .all(tolerated)
    });
    Ok(selected && taints_ok)
}

/// A Pod of `template` (a workload's `spec.template`) named `name` in `namespace` on `node`.
fn pod_from_template(
    template: &Value,
    name: &str,
    namespace: &str,
    node: &str,
    extra_labels: &[(&str, &str)],
    owner: Option<Value>,
) -> Result<Value> {
    let mut metadata = json!({"name": name, "namespace": namespace});
    for field in ["labels", "annotations"] {
        if let Some(map) = template["metadata"].get(field) {
            metadata[field] = map.clone();
        }
    }
    for (k, v) in extra_labels {
        metadata["labels"][*k] = json!(v);
    }
    if let Some(owner) = owner {
        metadata["ownerReferences"] = json!([owner]);
    }
    let mut spec = template
        .get("spec")
        .filter(|s| s.is_object())
        .cloned()
        .context("the template has no spec")?;
    spec["nodeName"] = json!(node);
    if spec["serviceAccountName"].is_null() {
        spec["serviceAccountName"] = json!("default");
    }
    Ok(json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}))
}

/// The DaemonSet controller's Pods for `daemonset` over the Node objects `nodes`: one per node
/// it may run on, `<daemonset>-<5 letters>`.
pub fn daemonset_pods(daemonset: &Value, nodes: &[Value]) -> Result<Vec<Value>> {
    let what = described(daemonset);
    let name = text(daemonset, "/metadata/name").with_context(|| format!("{what}: no name"))?;
    let namespace = text(daemonset, "/metadata/namespace").unwrap_or("default");
    let template = &daemonset["spec"]["template"];
    let owner = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name,
        "uid": daemonset["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true});
    let mut pods = Vec::new();
    for node in nodes {
        let node_name = text(node, "/metadata/name").context("a Node without a name")?;
        if !schedulable(&template["spec"], node).with_context(|| what.clone())? {
            continue;
        }
        let pod = format!("{name}-{}", name_suffix(&format!("{name}/{node_name}"), 5));
        pods.push(
            pod_from_template(
                template,
                &pod,
                namespace,
                node_name,
                &[],
                Some(owner.clone()),
            )
            .with_context(|| what.clone())?,
        );
    }
    Ok(pods)
}

/// The Deployment controller's Pods for `deployment`, at most `replicas` of them, scheduled on
/// `node`: `<deployment>-<pod-template-hash>-<5 letters>`, labelled `pod-template-hash`.
pub fn deployment_pods(deployment: &Value, node: &str, replicas: usize) -> Result<Vec<Value>> {
    let what = described(deployment);
    let name = text(deployment, "/metadata/name").with_context(|| format!("{what}: no name"))?;
    let namespace = text(deployment, "/metadata/namespace").unwrap_or("default");
    let template = &deployment["spec"]["template"];
    let wanted = deployment["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
    let hash = name_suffix(&template.to_string(), 10);
    (0..wanted.min(replicas))
        .map(|i| {
            let pod = format!("{name}-{hash}-{}", name_suffix(&format!("{name}/{i}"), 5));
            pod_from_template(
                template,
                &pod,
                namespace,
                node,
                &[("pod-template-hash", &hash)],
                None,
            )
            .with_context(|| what.clone())
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// A container's command line and environment.

/// Expands `$(VAR)` references in `input` as Kubernetes does for `command`, `args` and env
/// values (`k8s.io/kubernetes/third_party/forked/golang/expansion`): `$(NAME)` becomes
/// `lookup(NAME)`, or stays `$(NAME)` when it is not defined; `$$` is one `$`; an unclosed
/// `$(` and a `$` before anything else stay as they are.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match lookup(name) {
                        Some(value) => out.push_str(&value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Rewrites every path in `text` that lies under one of `mounts`' mount paths (the path itself
/// or below it, at the start of `text` or after `=`, `:` or `,`) to the same path under the
/// directory that stands for it.
pub fn rewrite_paths(text: &str, mounts: &[(String, PathBuf)]) -> String {
    let mut mounts: Vec<&(String, PathBuf)> = mounts.iter().collect();
    mounts.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'scan: while let Some(c) = rest.chars().next() {
        if out.is_empty() || out.ends_with(['=', ':', ',']) {
            for (from, to) in &mounts {
                let from = from.trim_end_matches('/');
                if let Some(tail) = rest.strip_prefix(from)
                    && (tail.is_empty() || tail.starts_with(['/', ':', ',']))
                {
                    out.push_str(&to.to_string_lossy());
                    rest = tail;
                    continue 'scan;
                }
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// The value of a downward API `fieldPath` of `pod`.
fn field_ref(pod: &Value, path: &str) -> Result<String> {
    let simple = match path {
        "metadata.name" => Some("/metadata/name"),
        "metadata.namespace" => Some("/metadata/namespace"),
        "metadata.uid" => Some("/metadata/uid"),
        "spec.nodeName" => Some("/spec/nodeName"),
        "spec.serviceAccountName" => Some("/spec/serviceAccountName"),
        "status.podIP" => Some("/status/podIP"),
        "status.hostIP" => Some("/status/hostIP"),
        _ => None,
    };
    if let Some(pointer) = simple {
        return text(pod, pointer)
            .map(str::to_string)
            .with_context(|| format!("fieldRef {path}: the Pod has none yet"));
    }
    let ips = |field: &str| {
        pod["status"][field]
            .as_array()
            .map(|l| {
                l.iter()
                    .filter_map(|i| i["ip"].as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .with_context(|| format!("fieldRef {path}: the Pod has none yet"))
    };
    match path {
        "status.podIPs" => return ips("podIPs"),
        "status.hostIPs" => return ips("hostIPs"),
        _ => {}
    }
    for map in ["labels", "annotations"] {
        if let Some(key) = path
            .strip_prefix(&format!("metadata.{map}['"))
            .and_then(|k| k.strip_suffix("']"))
        {
            return Ok(text(
                &pod["metadata"][map],
                &format!("/{}", key.replace('~', "~0").replace('/', "~1")),
            )
            .unwrap_or("")
            .to_string());
        }
    }
    bail!("fieldRef {path}: not a field the downward API offers to env")
}

/// The objects a container's environment may name: `lookup(resource, namespace, name)` with
/// resource `secrets` or `configmaps`.
pub type Lookup<'a> = &'a dyn Fn(&str, &str, &str) -> Option<Value>;

/// Key `key` of Secret or ConfigMap `name` (in `namespace`), `None` when it (or the key) is
/// missing and the reference is optional.
fn key_ref(
    lookup: Lookup<'_>,
    resource: &str,
    namespace: &str,
    reference: &Value,
) -> Result<Option<String>> {
    let name = text(reference, "/name").context("a key reference without a name")?;
    let key = text(reference, "/key").context("a key reference without a key")?;
    let optional = reference["optional"].as_bool().unwrap_or(false);
    let value = lookup(resource, namespace, name).and_then(|object| {
        if resource == "secrets" {
            secret_data(&object).ok()?.remove(key)
        } else {
            object["data"][key].as_str().map(|s| s.as_bytes().to_vec())
        }
    });
    match value {
        Some(bytes) => String::from_utf8(bytes)
            .map(Some)
            .with_context(|| format!("{resource} {namespace}/{name} key {key}: not UTF-8")),
        None if optional => Ok(None),
        None => bail!("{resource} {namespace}/{name} has no key {key} (yet)"),
    }
}

/// The decoded `data` of a Secret object.
fn secret_data(secret: &Value) -> Result<BTreeMap<String, Vec<u8>>> {
    let typed: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(secret.clone()).context("decoding a Secret")?;
    let mut data: BTreeMap<String, Vec<u8>> = typed
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    for (k, v) in typed.string_data.unwrap_or_default() {
        data.insert(k, v.into_bytes());
    }
    Ok(data)
}

/// How the lab runs one container: the lab binary's subcommand, its arguments, its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerProcess {
    /// `speaker` or `controller`: the lab binary's subcommand for the image's binary.
    pub subcommand: &'static str,
    /// The arguments after it (the rest of `command`, then `args`), expanded and rewritten.
    pub args: Vec<String>,
    /// The container's environment, in order, expanded and rewritten.
    pub env: Vec<(String, String)>,
}

/// The process of `container` (of `pod`, whose status holds its IPs): `$(VAR)` expanded, the
/// environment resolved (`lookup` finds Secrets and ConfigMaps), paths under `mounts`
/// rewritten ([`rewrite_paths`]). An error names what the lab cannot run, or what is missing
/// for now (a Secret a non-optional `secretKeyRef` names).
pub fn container_process(
    pod: &Value,
    container: &Value,
    lookup: Lookup<'_>,
    mounts: &[(String, PathBuf)],
) -> Result<ContainerProcess> {
    let cname = text(container, "/name").unwrap_or("?");
    let namespace = text(pod, "/metadata/namespace").unwrap_or("default");
    if container.get("envFrom").is_some() {
        bail!("container {cname}: envFrom is not played by the lab");
    }
    let mut env: Vec<(String, String)> = Vec::new();
    for var in container["env"].as_array().into_iter().flatten() {
        let name = text(var, "/name")
            .with_context(|| format!("container {cname}: an env entry without a name"))?;
        let defined = env.clone();
        let earlier = |n: &str| {
            defined
                .iter()
                .rev()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
        };
        let value = if let Some(value) = var.get("value") {
            Some(expand(value.as_str().unwrap_or(""), earlier))
        } else if let Some(from) = var.get("valueFrom") {
            let context = || format!("container {cname}: env {name}");
            if let Some(field) = from.get("fieldRef") {
                let path = text(field, "/fieldPath").with_context(context)?;
                Some(field_ref(pod, path).with_context(context)?)
            } else if let Some(reference) = from.get("secretKeyRef") {
                key_ref(lookup, "secrets", namespace, reference).with_context(context)?
            } else if let Some(reference) = from.get("configMapKeyRef") {
                key_ref(lookup, "configmaps", namespace, reference).with_context(context)?
            } else {
                bail!("{}: valueFrom {from} is not played by the lab", context());
            }
        } else {
            Some(String::new())
        };
        if let Some(value) = value {
            env.retain(|(k, _)| k != name);
            env.push((name.to_string(), value));
        }
    }
    let all = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let strings = |field: &str| -> Vec<String> {
        container[field]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|s| rewrite_paths(&expand(s, all), mounts))
            .collect()
    };
    let command = strings("command");
    let Some(binary) = command.first() else {
        bail!(
            "container {cname}: no command (the lab runs the image's binary named in `command`, \
             it does not read the image's entrypoint)"
        );
    };
    let Some((_, subcommand)) = IMAGE_BINARIES.iter().find(|(path, _)| path == binary) else {
        bail!(
            "container {cname}: command {binary}: not a binary of the image ({})",
            IMAGE_BINARIES.map(|(p, _)| p).join(", ")
        );
    };
    let mut args: Vec<String> = command[1..].to_vec();
    args.extend(strings("args"));
    let env = env
        .into_iter()
        .map(|(k, v)| (k, rewrite_paths(&v, mounts)))
        .collect();
    Ok(ContainerProcess {
        subcommand,
        args,
        env,
    })
}

// ---------------------------------------------------------------------------------------------
// Users and capabilities.

/// The identity and privileges of a container, from its Pod's and its own `securityContext`
/// (the container's fields win).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Privileges {
    /// `runAsUser`.
    pub uid: u32,
    /// `runAsGroup` (0 when unset: the image has no `/etc/passwd` to take it from).
    pub gid: u32,
    /// The capabilities it holds, upper case without `CAP_`, sorted.
    pub capabilities: Vec<String>,
    /// `allowPrivilegeEscalation: false`.
    pub no_new_privs: bool,
}

impl Privileges {
    /// The privileges of `container` in `pod_spec`, or why the lab (or the kubelet) refuses to
    /// run it.
    pub fn of(pod_spec: &Value, container: &Value) -> Result<Privileges> {
        let pod = &pod_spec["securityContext"];
        let own = &container["securityContext"];
        let field = |name: &str| {
            own.get(name)
                .filter(|v| !v.is_null())
                .or_else(|| pod.get(name).filter(|v| !v.is_null()))
        };
        if own["privileged"] == true {
            bail!("privileged: not played by the lab");
        }
        let uid = field("runAsUser")
            .and_then(Value::as_u64)
            .context("no runAsUser: the image's USER would apply, which the lab does not read")?
            as u32;
        let gid = field("runAsGroup").and_then(Value::as_u64).unwrap_or(0) as u32;
        if uid == 0 && field("runAsNonRoot") == Some(&json!(true)) {
            bail!("runAsNonRoot with runAsUser 0: the kubelet refuses to start it");
        }
        let names = |list: &Value| -> Vec<String> {
            list.as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(|c| c.trim_start_matches("CAP_").to_ascii_uppercase())
                .collect()
        };
        let drop = names(&own["capabilities"]["drop"]);
        let mut capabilities: Vec<String> = if drop.iter().any(|c| c == "ALL") {
            Vec::new()
        } else {
            DEFAULT_CAPABILITIES
                .iter()
                .map(|c| c.to_string())
                .filter(|c| !drop.contains(c))
                .collect()
        };
        capabilities.extend(names(&own["capabilities"]["add"]));
        capabilities.sort();
        capabilities.dedup();
        Ok(Privileges {
            uid,
            gid,
            capabilities,
            no_new_privs: own["allowPrivilegeEscalation"] == false,
        })
    }

    /// The `setpriv` options that give a process these privileges, as a container runtime
    /// does: the user and group, no supplementary groups, the capabilities as the bounding set
    /// (root holds all of it; another user none, as without ambient capabilities), nothing
    /// inheritable or ambient.
    pub fn setpriv_args(&self) -> Vec<String> {
        let mut bounding = String::from("-all");
        for c in &self.capabilities {
            bounding.push_str(&format!(",+{}", c.to_ascii_lowercase()));
        }
        let mut args = vec![
            format!("--reuid={}", self.uid),
            format!("--regid={}", self.gid),
            "--clear-groups".to_string(),
            "--inh-caps=-all".to_string(),
            "--ambient-caps=-all".to_string(),
            format!("--bounding-set={bounding}"),
        ];
        if self.no_new_privs {
            args.push("--no-new-privs".to_string());
        }
        args
    }
}

// ---------------------------------------------------------------------------------------------
// Probes.

/// An `httpGet` probe of a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpProbe {
    /// The path.
    pub path: String,
    /// The port (a named one resolved through the container's ports).
    pub port: u16,
    /// `initialDelaySeconds`.
    pub initial_delay: Duration,
    /// `periodSeconds` (default 10).
    pub period: Duration,
    /// `timeoutSeconds` (default 1).
    pub timeout: Duration,
    /// `successThreshold` (default 1).
    pub success_threshold: u32,
    /// `failureThreshold` (default 3).
    pub failure_threshold: u32,
}

/// The probe `field` (`startupProbe`, `livenessProbe`, `readinessProbe`) of `container`, if it
/// has one; other probe kinds than `httpGet` are refused.
pub fn http_probe(container: &Value, field: &str) -> Result<Option<HttpProbe>> {
    let Some(p) = container.get(field).filter(|p| !p.is_null()) else {
        return Ok(None);
    };
    let Some(get) = p.get("httpGet") else {
        bail!("{field}: only httpGet probes are played by the lab");
    };
    if get["scheme"].as_str().is_some_and(|s| s != "HTTP") {
        bail!("{field}: only scheme HTTP is played by the lab");
    }
    let port = match &get["port"] {
        Value::Number(n) => n.as_u64(),
        Value::String(name) => container["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == name.as_str())
            .and_then(|p| p["containerPort"].as_u64()),
        _ => None,
    }
    .and_then(|p| u16::try_from(p).ok())
    .with_context(|| format!("{field}: port {} is no port of the container", get["port"]))?;
    let seconds =
        |name: &str, default: u64| Duration::from_secs(p[name].as_u64().unwrap_or(default));
    let count = |name: &str, default: u64| p[name].as_u64().unwrap_or(default) as u32;
    Ok(Some(HttpProbe {
        path: text(get, "/path").unwrap_or("/").to_string(),
        port,
        initial_delay: seconds("initialDelaySeconds", 0),
        period: seconds("periodSeconds", 10),
        timeout: seconds("timeoutSeconds", 1),
        success_threshold: count("successThreshold", 1),
        failure_threshold: count("failureThreshold", 3),
    }))
}

/// One `GET path` to `addr`: whether it answered 200 to 399 within `timeout`.
fn http_ok(addr: SocketAddr, path: &str, timeout: Duration) -> bool {
    let attempt = || -> Option<bool> {
        let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
        s.set_read_timeout(Some(timeout)).ok()?;
        s.set_write_timeout(Some(timeout)).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nhost: {addr}\r\nuser-agent: kube-probe/lab\r\nconnection: close\r\n\r\n"
        )
        .ok()?;
        let mut head = [0u8; 16];
        let n = s.read(&mut head).ok()?;
        let line = std::str::from_utf8(&head[..n]).ok()?;
        let code: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some((200..400).contains(&code))
    };
    attempt().unwrap_or(false)
}

/// A probe's schedule and counts in a pod worker.
#[derive(Debug)]
struct ProbeRun {
    probe: HttpProbe,
    due: Instant,
    successes: u32,
    failures: u32,
    /// The verdict once a threshold was reached.
    verdict: Option<bool>,
}

impl ProbeRun {
    fn new(probe: HttpProbe, started: Instant) -> ProbeRun {
        ProbeRun {
            due: started + probe.initial_delay,
            probe,
            successes: 0,
            failures: 0,
            verdict: None,
        }
    }

    /// Probes `ip` when due; the verdict.
    fn run(&mut self, ip: IpAddr, now: Instant) -> Option<bool> {
        if now < self.due {
            return self.verdict;
        }
        self.due = now + self.probe.period;
        if http_ok(
            SocketAddr::new(ip, self.probe.port),
            &self.probe.path,
            self.probe.timeout,
        ) {
            self.failures = 0;
            self.successes += 1;
            if self.successes >= self.probe.success_threshold {
                self.verdict = Some(true);
            }
        } else {
            self.successes = 0;
            self.failures += 1;
            if self.failures >= self.probe.failure_threshold {
                self.verdict = Some(false);
            }
        }
        self.verdict
    }
}

// ---------------------------------------------------------------------------------------------
// Secret volumes.

/// A Secret volume mounted by a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretVolume {
    /// The volume's name.
    pub name: String,
    /// The Secret.
    pub secret: String,
    /// `optional`: the container starts without it.
    pub optional: bool,
    /// `items` (key, path, mode), or every key under its own name.
    pub items: Option<Vec<(String, String, Option<u32>)>>,
    /// `defaultMode` (0644 when unset).
    pub default_mode: u32,
    /// Where the container sees it.
    pub mount_path: String,
    /// The lab's directory standing for it.
    pub dir: PathBuf,
}

/// The Secret volumes `container` mounts, each in a directory under `pod_dir` laid out as the
/// kubelet's (`volumes/kubernetes.io~secret/<name>`); any other kind of volume is refused.
pub fn secret_volumes(
    pod_spec: &Value,
    container: &Value,
    pod_dir: &Path,
) -> Result<Vec<SecretVolume>> {
    let volumes = pod_spec["volumes"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    for mount in container["volumeMounts"].as_array().into_iter().flatten() {
        let name = text(mount, "/name").context("a volumeMount without a name")?;
        let mount_path = text(mount, "/mountPath")
            .with_context(|| format!("volumeMount {name}: no mountPath"))?;
        if mount.get("subPath").is_some() {
            bail!("volumeMount {name}: subPath is not played by the lab");
        }
        let volume = volumes
            .iter()
            .find(|v| v["name"] == name)
            .with_context(|| format!("volumeMount {name}: no such volume"))?;
        let Some(secret) = volume.get("secret") else {
            bail!("volume {name}: only Secret volumes are played by the lab");
        };
        let items = secret["items"].as_array().map(|items| {
            items
                .iter()
                .map(|i| {
                    (
                        text(i, "/key").unwrap_or("").to_string(),
                        text(i, "/path").unwrap_or("").to_string(),
                        i["mode"].as_u64().map(|m| m as u32),
                    )
                })
                .collect()
        });
        out.push(SecretVolume {
            name: name.to_string(),
            secret: text(secret, "/secretName")
                .with_context(|| format!("volume {name}: no secretName"))?
                .to_string(),
            optional: secret["optional"].as_bool().unwrap_or(false),
            items,
            default_mode: secret["defaultMode"].as_u64().unwrap_or(0o644) as u32,
            mount_path: mount_path.to_string(),
            dir: pod_dir.join("volumes/kubernetes.io~secret").join(name),
        });
    }
    Ok(out)
}

impl SecretVolume {
    /// The files (path, bytes, mode) the volume holds for `secret`.
    pub fn files(&self, secret: &Value) -> Result<Vec<(String, Vec<u8>, u32)>> {
        let data = secret_data(secret)?;
        match &self.items {
            None => Ok(data
                .into_iter()
                .map(|(k, v)| (k, v, self.default_mode))
                .collect()),
            Some(items) => items
                .iter()
                .filter_map(|(key, path, mode)| match data.get(key) {
                    Some(v) => Some(Ok((
                        path.clone(),
                        v.clone(),
                        mode.unwrap_or(self.default_mode),
                    ))),
                    None if self.optional => None,
                    None => Some(Err(anyhow::anyhow!(
                        "Secret {} has no key {key}",
                        self.secret
                    ))),
                })
                .collect(),
        }
    }

    /// Writes `files` as the kubelet's atomic writer does: a fresh directory `..<serial>`, the
    /// symlink `..data` swapped to it by a rename, one symlink per file into `..data`, the old
    /// directory removed.
    pub fn write(&self, files: &[(String, Vec<u8>, u32)], serial: &str) -> Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = &self.dir;
        std::fs::create_dir_all(dir)?;
        let fresh = format!("..{serial}");
        let target = dir.join(&fresh);
        let _ = std::fs::remove_dir_all(&target);
        std::fs::create_dir_all(&target)?;
        for (path, bytes, mode) in files {
            if path.is_empty() || path.contains("..") || path.starts_with('/') {
                bail!("volume {}: item path {path:?} is not relative", self.name);
            }
            let file = target.join(path);
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&file, bytes)?;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(*mode))?;
        }
        let old = std::fs::read_link(dir.join("..data")).ok();
        let staged = dir.join("..data_tmp");
        let _ = std::fs::remove_file(&staged);
        std::os::unix::fs::symlink(&fresh, &staged)?;
        std::fs::rename(&staged, dir.join("..data"))?;
        for (path, _, _) in files {
            let top = path.split('/').next().unwrap_or(path);
            let link = dir.join(top);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(Path::new("..data").join(top), &link)?;
            }
        }
        if let Some(old) = old.filter(|o| *o != Path::new(&fresh)) {
            let _ = std::fs::remove_dir_all(dir.join(old));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The kubelet.

/// Where a Pod's containers run and the addresses its status reports.
#[derive(Debug, Clone)]
struct Sandbox {
    netns: String,
    pod_ip: IpAddr,
    host_ip: IpAddr,
    hostname: String,
}

/// What a pod worker has seen of its Pod, for the test and its report.
#[derive(Debug, Clone, Default)]
pub struct PodState {
    /// When the container first started.
    pub started: Option<Instant>,
    /// The process id of the running container.
    pub pid: Option<u32>,
    /// When every Secret volume first held data.
    pub volumes_filled: Option<Instant>,
    /// Whether the readiness probe (if any) passes now.
    pub ready: bool,
    /// When it first became ready.
    pub first_ready: Option<Instant>,
    /// Restarts of the container (exits and failed liveness or startup probes).
    pub restarts: u32,
    /// Why the container last stopped (exit status or probe).
    pub last_stop: Option<String>,
    /// Why the container cannot start right now (the lab's or the kubelet's refusal).
    pub waiting: Option<String>,
}

/// One Pod's worker thread.
#[derive(Debug)]
struct PodWorker {
    name: String,
    node: String,
    log: PathBuf,
    state: Arc<Mutex<PodState>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The lab's kubelets and workload controllers for every DaemonSet and Deployment in the API
/// server. Dropping it stops every container with its grace period, as a drained node would.
#[derive(Debug)]
pub struct Kubelet {
    workers: Vec<PodWorker>,
}

impl Kubelet {
    /// Makes the Pods of every stored DaemonSet (on the host network: in its node's namespace)
    /// and Deployment (one replica, off the host network: in the client's namespace, scheduled on
    /// the first node), creates them in the API server and starts a worker for each. `program`
    /// is the lab binary; each Pod's files and its container's log go under `dir`.
    pub fn start(lab: &Lab, api: Arc<FakeApi>, program: &Path, dir: &Path) -> Result<Kubelet> {
        let nodes = api.objects("nodes")?;
        let mut placed: Vec<(Value, Sandbox)> = Vec::new();
        let sandbox = |pod: &Value| -> Result<Sandbox> {
            let node_name = text(pod, "/spec/nodeName").context("an unscheduled Pod")?;
            let node = lab
                .nodes
                .iter()
                .find(|n| n.name == node_name)
                .with_context(|| format!("{node_name} is no lab node"))?;
            let host_network = pod["spec"]["hostNetwork"] == true;
            let name = text(pod, "/metadata/name").unwrap_or_default();
            Ok(if host_network {
                Sandbox {
                    netns: node.netns.clone(),
                    pod_ip: IpAddr::V4(node.v4),
                    host_ip: IpAddr::V4(node.v4),
                    hostname: node.name.clone(),
                }
            } else {
                Sandbox {
                    netns: lab.client_netns.clone(),
                    pod_ip: IpAddr::V4(netns::CLIENT_V4),
                    host_ip: IpAddr::V4(node.v4),
                    hostname: name.to_string(),
                }
            })
        };
        for daemonset in api.objects("daemonsets.apps")? {
            for pod in daemonset_pods(&daemonset, &nodes)? {
                if pod["spec"]["hostNetwork"] != true {
                    bail!(
                        "{}: the lab runs DaemonSet Pods on the host network only",
                        described(&daemonset)
                    );
                }
                let sandbox = sandbox(&pod)?;
                placed.push((pod, sandbox));
            }
        }
        let first = lab.nodes.first().context("a lab without nodes")?;
        let mut off_host = 0;
        for deployment in api.objects("deployments.apps")? {
            for pod in deployment_pods(&deployment, &first.name, 1)? {
                let sandbox = sandbox(&pod)?;
                if pod["spec"]["hostNetwork"] != true {
                    off_host += 1;
                }
                placed.push((pod, sandbox));
            }
        }
        if off_host > 1 {
            bail!("{off_host} Pods off the host network: the lab has one namespace for them");
        }
        let mut kubelet = Kubelet {
            workers: Vec::new(),
        };
        // One kubeconfig per service account, written before any container reads it.
        let mut kubeconfigs: BTreeMap<String, Option<PathBuf>> = BTreeMap::new();
        for (pod, _) in &placed {
            let account = text(pod, "/spec/serviceAccountName").unwrap_or("default");
            if !kubeconfigs.contains_key(account) {
                kubeconfigs.insert(account.to_string(), kubeconfig(&api, pod)?);
            }
        }
        for (pod, sandbox) in placed {
            let account = text(&pod, "/spec/serviceAccountName").unwrap_or("default");
            let kubeconfig = kubeconfigs.get(account).cloned().flatten();
            let created = api.create(pod)?;
            kubelet.workers.push(PodWorker::start(
                api.clone(),
                created,
                sandbox,
                kubeconfig,
                program.to_path_buf(),
                dir,
            )?);
        }
        Ok(kubelet)
    }

    /// Every Pod as (name, node, what its worker has seen), in start order.
    pub fn pods(&self) -> Vec<(String, String, PodState)> {
        self.workers
            .iter()
            .map(|w| {
                let state = w.state.lock().unwrap_or_else(|e| e.into_inner()).clone();
                (w.name.clone(), w.node.clone(), state)
            })
            .collect()
    }

    /// Waits (at most `limit`) until every Pod is ready; the Pods that are not, otherwise.
    pub fn wait_ready(&self, limit: Duration) -> Result<(), Vec<(String, PodState)>> {
        let deadline = Instant::now() + limit;
        loop {
            let pending: Vec<(String, PodState)> = self
                .pods()
                .into_iter()
                .filter(|(_, _, s)| !s.ready)
                .map(|(n, _, s)| (n, s))
                .collect();
            if pending.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(pending);
            }
            std::thread::sleep(TICK);
        }
    }

    /// Every container's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        for w in &self.workers {
            let text = std::fs::read_to_string(&w.log).unwrap_or_default();
            all.push_str(&format!("--- {} on {} ---\n{text}", w.name, w.node));
        }
        all
    }

    /// The log of the Pod named `pod`.
    pub fn log_of(&self, pod: &str) -> Option<String> {
        let worker = self.workers.iter().find(|w| w.name == pod)?;
        std::fs::read_to_string(&worker.log).ok()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        // Every worker stops its container at once, then each is joined.
        for w in &self.workers {
            w.stop.store(true, Ordering::Relaxed);
        }
        for w in &mut self.workers {
            if let Some(thread) = w.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

impl PodWorker {
    fn start(
        api: Arc<FakeApi>,
        pod: Value,
        sandbox: Sandbox,
        kubeconfig: Option<PathBuf>,
        program: PathBuf,
        dir: &Path,
    ) -> Result<PodWorker> {
        let name = text(&pod, "/metadata/name").unwrap_or_default().to_string();
        let node = text(&pod, "/spec/nodeName").unwrap_or_default().to_string();
        let pod_dir = dir.join("pods").join(&name);
        std::fs::create_dir_all(&pod_dir)?;
        let log = pod_dir.join("container.log");
        let state: Arc<Mutex<PodState>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let mut run = PodRun {
            api,
            pod,
            sandbox,
            kubeconfig,
            program,
            pod_dir,
            log: log.clone(),
            state: state.clone(),
            stop: stop.clone(),
            child: None,
            volume_versions: BTreeMap::new(),
            probes: Probes::default(),
            next_start: Instant::now(),
            backoff: FIRST_BACKOFF,
            published: None,
        };
        let thread = std::thread::Builder::new()
            .name(format!("kubelet-{name}"))
            .spawn(move || run.work())
            .context("starting a pod worker")?;
        Ok(PodWorker {
            name,
            node,
            log,
            state,
            stop,
            thread: Some(thread),
        })
    }
}

/// The running container's probes.
#[derive(Debug, Default)]
struct Probes {
    startup: Option<ProbeRun>,
    liveness: Option<ProbeRun>,
    readiness: Option<ProbeRun>,
}

/// A pod worker's state (owned by its thread).
#[derive(Debug)]
struct PodRun {
    api: Arc<FakeApi>,
    pod: Value,
    sandbox: Sandbox,
    /// The in-cluster configuration's substitute (`KUBECONFIG`), if the token is mounted.
    kubeconfig: Option<PathBuf>,
    program: PathBuf,
    pod_dir: PathBuf,
    log: PathBuf,
    state: Arc<Mutex<PodState>>,
    stop: Arc<AtomicBool>,
    child: Option<Child>,
    /// The resourceVersion of each Secret volume's Secret last written.
    volume_versions: BTreeMap<String, String>,
    probes: Probes,
    next_start: Instant,
    backoff: Duration,
    /// The Pod status last written.
    published: Option<Value>,
}

impl PodRun {
    fn namespace(&self) -> String {
        text(&self.pod, "/metadata/namespace")
            .unwrap_or("default")
            .to_string()
    }

    fn name(&self) -> String {
        text(&self.pod, "/metadata/name")
            .unwrap_or_default()
            .to_string()
    }

    fn update(&self, f: impl FnOnce(&mut PodState)) {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn state(&self) -> PodState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The worker's loop: until told to stop, then the container is stopped.
    fn work(&mut self) {
        // Probes go out from the Pod's namespace, as a kubelet's from its node.
        if let Err(e) = probe::enter_netns(&self.sandbox.netns) {
            self.update(|s| s.waiting = Some(format!("entering {}: {e:#}", self.sandbox.netns)));
            return;
        }
        if let Err(e) = self.publish_ips() {
            self.update(|s| s.waiting = Some(format!("{e:#}")));
        }
        while !self.stop.load(Ordering::Relaxed) {
            if let Err(e) = self.step(Instant::now()) {
                self.update(|s| s.waiting = Some(format!("{e:#}")));
            }
            self.publish_status();
            std::thread::sleep(TICK);
        }
        self.stop_container("the lab stops");
        self.publish_status();
    }

    /// The kubelet's part before any container: the Pod's IPs in its status.
    fn publish_ips(&mut self) -> Result<()> {
        let status = json!({"status": {
            "phase": "Pending",
            "hostIP": self.sandbox.host_ip.to_string(),
            "hostIPs": [{"ip": self.sandbox.host_ip.to_string()}],
            "podIP": self.sandbox.pod_ip.to_string(),
            "podIPs": [{"ip": self.sandbox.pod_ip.to_string()}],
            "startTime": now_rfc3339()}});
        self.pod =
            self.api
                .merge_patch("pods", Some(&self.namespace()), &self.name(), &status, true)?;
        Ok(())
    }

    fn container(&self) -> Result<Value> {
        let spec = &self.pod["spec"];
        if spec["initContainers"]
            .as_array()
            .is_some_and(|l| !l.is_empty())
        {
            bail!("initContainers are not played by the lab");
        }
        match spec["containers"].as_array().map(Vec::as_slice) {
            Some([one]) => Ok(one.clone()),
            _ => bail!("the lab plays Pods of exactly one container"),
        }
    }

    fn step(&mut self, now: Instant) -> Result<()> {
        let container = self.container()?;
        let volumes = secret_volumes(&self.pod["spec"], &container, &self.pod_dir)?;
        let filled = self.sync_volumes(&volumes)?;
        if let Some(child) = self.child.as_mut() {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                self.crashed(format!("exited: {status}"), now);
                return Ok(());
            }
            self.run_probes(now);
            return Ok(());
        }
        if now < self.next_start {
            return Ok(());
        }
        let missing: Vec<&str> = volumes
            .iter()
            .zip(&filled)
            .filter(|(v, f)| !v.optional && !**f)
            .map(|(v, _)| v.secret.as_str())
            .collect();
        if !missing.is_empty() {
            bail!(
                "ContainerCreating: Secret {} not found (volume not optional)",
                missing.join(", ")
            );
        }
        self.start_container(&container, &volumes, now)
    }

    /// Writes every Secret volume whose Secret appeared or changed; for each, whether it holds
    /// the Secret's data.
    fn sync_volumes(&mut self, volumes: &[SecretVolume]) -> Result<Vec<bool>> {
        let namespace = self.namespace();
        let mut filled = Vec::new();
        for volume in volumes {
            std::fs::create_dir_all(&volume.dir)?;
            let secret = self.api.get("secrets", Some(&namespace), &volume.secret);
            let Some(secret) = secret else {
                filled.push(self.volume_versions.contains_key(&volume.name));
                continue;
            };
            let version = text(&secret, "/metadata/resourceVersion")
                .unwrap_or("")
                .to_string();
            if self.volume_versions.get(&volume.name) != Some(&version) {
                let files = volume.files(&secret)?;
                volume.write(&files, &version)?;
                self.volume_versions.insert(volume.name.clone(), version);
            }
            filled.push(true);
        }
        if !volumes.is_empty() && filled.iter().all(|f| *f) && self.state().volumes_filled.is_none()
        {
            self.update(|s| s.volumes_filled = Some(Instant::now()));
        }
        Ok(filled)
    }

    fn start_container(
        &mut self,
        container: &Value,
        volumes: &[SecretVolume],
        now: Instant,
    ) -> Result<()> {
        let api = self.api.clone();
        let lookup = move |resource: &str, namespace: &str, name: &str| {
            api.get(resource, Some(namespace), name)
        };
        let mounts: Vec<(String, PathBuf)> = volumes
            .iter()
            .map(|v| (v.mount_path.clone(), v.dir.clone()))
            .collect();
        let process = container_process(&self.pod, container, &lookup, &mounts)?;
        let privileges = Privileges::of(&self.pod["spec"], container)?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.sandbox.netns, "setpriv"])
            .args(privileges.setpriv_args())
            .arg("--")
            .arg(&self.program)
            .arg(process.subcommand)
            .args(&process.args)
            .env_clear()
            .env("PATH", CONTAINER_PATH)
            .env("HOSTNAME", &self.sandbox.hostname)
            .envs(process.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(kubeconfig) = &self.kubeconfig {
            cmd.env("KUBECONFIG", kubeconfig);
        }
        let child = cmd.spawn().context("starting the container")?;
        let pid = child.id();
        self.child = Some(child);
        let probe = |field: &str| -> Result<Option<ProbeRun>> {
            Ok(http_probe(container, field)?.map(|p| ProbeRun::new(p, now)))
        };
        self.probes = Probes {
            startup: probe("startupProbe")?,
            liveness: probe("livenessProbe")?,
            readiness: probe("readinessProbe")?,
        };
        let restart = self.state().started.is_some();
        self.update(|s| {
            s.waiting = None;
            s.pid = Some(pid);
            s.started.get_or_insert(now);
            if restart {
                s.restarts += 1;
            }
            // Without a readiness probe a running container is ready.
            s.ready = false;
        });
        Ok(())
    }

    fn run_probes(&mut self, now: Instant) {
        let ip = self.sandbox.pod_ip;
        if let Some(startup) = self.probes.startup.as_mut() {
            match startup.run(ip, now) {
                Some(true) => {}
                Some(false) => return self.probe_failed("startup probe failed", now),
                None => return,
            }
        }
        if let Some(liveness) = self.probes.liveness.as_mut()
            && liveness.run(ip, now) == Some(false)
        {
            return self.probe_failed("liveness probe failed", now);
        }
        let ready = match self.probes.readiness.as_mut() {
            Some(readiness) => readiness.run(ip, now) == Some(true),
            None => true,
        };
        self.update(|s| {
            s.ready = ready;
            if ready {
                s.first_ready.get_or_insert(now);
            }
        });
    }

    fn probe_failed(&mut self, why: &str, now: Instant) {
        self.stop_container(why);
        self.crashed(why.to_string(), now);
    }

    /// Records a stop and schedules the restart with the back-off.
    fn crashed(&mut self, why: String, now: Instant) {
        self.update(|s| {
            s.ready = false;
            s.pid = None;
            s.last_stop = Some(why);
        });
        self.next_start = now + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// SIGTERM, then SIGKILL after the Pod's grace period.
    fn stop_container(&mut self, why: &str) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let grace = Duration::from_secs(
            self.pod["spec"]["terminationGracePeriodSeconds"]
                .as_u64()
                .unwrap_or(30),
        );
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + grace;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status.to_string(),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(TICK / 4),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break "killed after the grace period".to_string();
                }
            }
        };
        self.update(|s| {
            s.ready = false;
            s.pid = None;
            s.last_stop = Some(format!("{why}: {status}"));
        });
    }

    /// Writes the Pod's status when it changed.
    fn publish_status(&mut self) {
        let state = self.state();
        let running = self.child.is_some();
        let ready = running && state.ready;
        let condition = |kind: &str, on: bool| json!({"type": kind, "status": if on { "True" } else { "False" }});
        let name = text(&self.pod, "/spec/containers/0/name").unwrap_or("");
        let container_state = if running {
            json!({"running": {}})
        } else if state.last_stop.is_some() {
            json!({"waiting": {"reason": "CrashLoopBackOff", "message": state.last_stop}})
        } else {
            json!({"waiting": {"reason": "ContainerCreating", "message": state.waiting}})
        };
        let status = json!({
            "phase": if state.started.is_some() { "Running" } else { "Pending" },
            "conditions": [condition("PodScheduled", true), condition("Initialized", true),
                condition("ContainersReady", ready), condition("Ready", ready)],
            "containerStatuses": [{"name": name, "ready": ready, "started": running,
                "restartCount": state.restarts, "image": self.pod["spec"]["containers"][0]["image"],
                "imageID": "", "state": container_state}]});
        if self.published.as_ref() == Some(&status) {
            return;
        }
        let patched = self.api.merge_patch(
            "pods",
            Some(&self.namespace()),
            &self.name(),
            &json!({"status": status}),
            true,
        );
        if patched.is_ok() {
            self.published = Some(status);
        }
    }
}

/// The kubeconfig standing for the in-cluster configuration of `pod`'s service account, or
/// none when its token is not mounted; a missing ServiceAccount refuses the Pod, as the
/// ServiceAccount admission plugin does.
fn kubeconfig(api: &FakeApi, pod: &Value) -> Result<Option<PathBuf>> {
    let account = text(pod, "/spec/serviceAccountName").unwrap_or("default");
    let namespace = text(pod, "/metadata/namespace").unwrap_or("default");
    let object = api
        .get("serviceaccounts", Some(namespace), account)
        .with_context(|| format!("ServiceAccount {namespace}/{account} not found"))?;
    let automount = pod["spec"]["automountServiceAccountToken"]
        .as_bool()
        .or_else(|| object["automountServiceAccountToken"].as_bool())
        .unwrap_or(true);
    if !automount {
        return Ok(None);
    }
    api.kubeconfig_for_user(account).map(Some)
}

fn now_rfc3339() -> String {
    swimlb_fake_api::store::rfc3339(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(name: &str) -> Option<String> {
        match name {
            "VAR_A" => Some("A".into()),
            "VAR_B" => Some("B".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expansion_follows_kubernetes_table() {
        // Cases from k8s.io/kubernetes/third_party/forked/golang/expansion/expand_test.go.
        for (input, want) in [
            ("$(VAR_A)", "A"),
            ("___$(VAR_B)___", "___B___"),
            ("$(VAR_A)-$(VAR_B)", "A-B"),
            ("$(VAR_A)$(EMPTY)$(VAR_B)", "AB"),
            ("$(UNKNOWN)", "$(UNKNOWN)"),
            ("$$(VAR_A)", "$(VAR_A)"),
            ("$$$(VAR_A)", "$A"),
            ("$$$$(VAR_A)", "$$(VAR_A)"),
            ("$(VAR_A", "$(VAR_A"),
            ("$VAR_A", "$VAR_A"),
            ("$", "$"),
            ("$$", "$"),
            ("f000-$$VAR_A", "f000-$VAR_A"),
            ("--lease-namespace=$(VAR_A)", "--lease-namespace=A"),
            ("$()", "$()"),
            ("ünï$(VAR_A)cödé", "ünïAcödé"),
        ] {
            assert_eq!(expand(input, vars), want, "{input}");
        }
    }

    #[test]
    fn paths_under_a_mount_are_rewritten_only_at_a_path_boundary() {
        let mounts = vec![(
            "/etc/swimlb/gossip".to_string(),
            PathBuf::from("/lab/p/gossip"),
        )];
        for (input, want) in [
            ("/etc/swimlb/gossip/keys", "/lab/p/gossip/keys"),
            (
                "--key-file=/etc/swimlb/gossip/keys",
                "--key-file=/lab/p/gossip/keys",
            ),
            ("/etc/swimlb/gossip", "/lab/p/gossip"),
            ("/etc/swimlb/gossipy", "/etc/swimlb/gossipy"),
            ("x/etc/swimlb/gossip", "x/etc/swimlb/gossip"),
            ("/etc/swimlb/other", "/etc/swimlb/other"),
        ] {
            assert_eq!(rewrite_paths(input, &mounts), want, "{input}");
        }
    }

    fn node(name: &str, labels: Value, taints: Value) -> Value {
        json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}})
    }

    fn daemonset(template_spec: Value) -> Value {
        json!({"kind": "DaemonSet", "metadata": {"name": "ds", "namespace": "ns", "uid": "u-1"},
            "spec": {"template": {"metadata": {"labels": {"app": "x"}}, "spec": template_spec}}})
    }

    #[test]
    fn a_daemonset_gets_one_bound_owned_pod_per_admitted_node() {
        let nodes = [
            node("a", json!({"os": "linux"}), json!(null)),
            node("b", json!({"os": "windows"}), json!(null)),
            node(
                "c",
                json!({"os": "linux"}),
                json!([{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]),
            ),
            node(
                "d",
                json!({"os": "linux"}),
                json!([{"key": "dedicated", "value": "db", "effect": "NoExecute"}]),
            ),
        ];
        let ds = daemonset(json!({"nodeSelector": {"os": "linux"},
            "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "i"}]}));
        let pods = daemonset_pods(&ds, &nodes).unwrap();
        let on: Vec<&str> = pods
            .iter()
            .map(|p| p["spec"]["nodeName"].as_str().unwrap())
            .collect();
        assert_eq!(on, ["a", "c"]);
        let pod = &pods[0];
        assert_eq!(pod["metadata"]["namespace"], "ns");
        assert_eq!(pod["metadata"]["labels"]["app"], "x");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(pod["spec"]["serviceAccountName"], "default");
        let name = pod["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("ds-") && name.len() == 8, "{name}");
        assert_ne!(pods[0]["metadata"]["name"], pods[1]["metadata"]["name"]);
    }

    #[test]
    fn a_deployment_runs_at_most_the_replicas_the_lab_allows_with_its_template_hash() {
        let deployment = json!({"kind": "Deployment",
            "metadata": {"name": "ctl", "namespace": "ns"},
            "spec": {"replicas": 2, "template": {"metadata": {"labels": {"app": "c"}},
                "spec": {"serviceAccountName": "sa", "containers": [{"name": "c", "image": "i"}]}}}});
        let pods = deployment_pods(&deployment, "n1", 1).unwrap();
        assert_eq!(pods.len(), 1);
        let hash = pods[0]["metadata"]["labels"]["pod-template-hash"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(hash.len(), 10);
        assert!(
            pods[0]["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with(&format!("ctl-{hash}-"))
        );
        assert_eq!(pods[0]["spec"]["serviceAccountName"], "sa");
        assert_eq!(deployment_pods(&deployment, "n1", 5).unwrap().len(), 2);
    }

    fn pod() -> Value {
        json!({"metadata": {"name": "p-1", "namespace": "ns", "labels": {"app.kubernetes.io/name": "x"}},
            "spec": {"nodeName": "node1"},
            "status": {"podIP": "198.51.100.11", "podIPs": [{"ip": "198.51.100.11"}],
                "hostIP": "198.51.100.11"}})
    }

    fn no_objects(_: &str, _: &str, _: &str) -> Option<Value> {
        None
    }

    #[test]
    fn a_container_runs_as_the_lab_binary_with_its_env_resolved_and_expanded() {
        let container = json!({"name": "c",
            "command": ["/usr/local/bin/swimlb-controller"],
            "args": ["--lease-namespace=$(POD_NAMESPACE)", "--identity=$(POD_NAME)",
                "--key=/etc/k/keys", "$(UNDEFINED)", "$$(POD_NAME)"],
            "env": [
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "LABEL", "valueFrom": {"fieldRef":
                    {"fieldPath": "metadata.labels['app.kubernetes.io/name']"}}},
                {"name": "WHO", "value": "$(POD_NAME)@$(LATER)"},
                {"name": "LATER", "value": "l"},
                {"name": "KEY", "value": "/etc/k/keys"}]});
        let mounts = vec![("/etc/k".to_string(), PathBuf::from("/lab/k"))];
        let p = container_process(&pod(), &container, &no_objects, &mounts).unwrap();
        assert_eq!(p.subcommand, "controller");
        assert_eq!(
            p.args,
            [
                "--lease-namespace=ns",
                "--identity=p-1",
                "--key=/lab/k/keys",
                "$(UNDEFINED)",
                "$(POD_NAME)"
            ]
        );
        let env: BTreeMap<&str, &str> = p
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(env["NODE"], "node1");
        assert_eq!(env["IP"], "198.51.100.11");
        assert_eq!(env["LABEL"], "x");
        // Only earlier variables expand in a value.
        assert_eq!(env["WHO"], "p-1@$(LATER)");
        assert_eq!(env["KEY"], "/lab/k/keys");
    }

    #[test]
    fn secret_and_config_map_references_resolve_or_wait_unless_optional() {
        let objects = |resource: &str, _: &str, name: &str| match (resource, name) {
            ("secrets", "s") => Some(json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "s"}, "data": {"k": "aGVsbG8="}})),
            ("configmaps", "c") => Some(json!({"data": {"k": "plain"}})),
            _ => None,
        };
        let container = |env: Value| json!({"name": "c", "command": ["/usr/local/bin/swimlb-speaker"], "env": env});
        let p = container_process(
            &pod(),
            &container(json!([
                {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
                {"name": "O", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k", "optional": true}}}])),
            &objects,
            &[],
        )
        .unwrap();
        assert_eq!(
            p.env,
            [("S".into(), "hello".into()), ("C".into(), "plain".into())]
        );
        let missing = container_process(
            &pod(),
            &container(
                json!([{"name": "S", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k"}}}]),
            ),
            &objects,
            &[],
        )
        .unwrap_err();
        assert!(format!("{missing:#}").contains("gone"), "{missing:#}");
    }

    #[test]
    fn what_the_lab_cannot_run_is_refused_with_the_reason() {
        let refused = |container: Value| {
            format!(
                "{:#}",
                container_process(&pod(), &container, &no_objects, &[]).unwrap_err()
            )
        };
        assert!(refused(json!({"name": "c"})).contains("no command"));
        assert!(refused(json!({"name": "c", "command": ["/bin/sh"]})).contains("not a binary"));
        assert!(
            refused(json!({"name": "c", "command": ["/usr/local/bin/swimlb-speaker"],
                "env": [{"name": "X", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}]}))
            .contains("not played")
        );
        assert!(
            refused(
                json!({"name": "c", "command": ["/usr/local/bin/swimlb-speaker"],
                "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.hostname"}}}]})
            )
            .contains("downward API")
        );
    }

    #[test]
    fn privileges_follow_the_security_contexts() {
        let speaker = Privileges::of(
            &json!({"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}),
            &json!({"securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"], "add": ["NET_RAW"]}}}),
        )
        .unwrap();
        assert_eq!(
            speaker,
            Privileges {
                uid: 0,
                gid: 0,
                capabilities: vec!["NET_RAW".into()],
                no_new_privs: true
            }
        );
        assert_eq!(
            speaker.setpriv_args(),
            [
                "--reuid=0",
                "--regid=0",
                "--clear-groups",
                "--inh-caps=-all",
                "--ambient-caps=-all",
                "--bounding-set=-all,+net_raw",
                "--no-new-privs"
            ]
        );
        let controller = Privileges::of(
            &json!({"securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532}}),
            &json!({"securityContext": {"capabilities": {"drop": ["ALL"]}}}),
        )
        .unwrap();
        assert_eq!((controller.uid, controller.gid), (65532, 65532));
        assert!(controller.capabilities.is_empty());
        assert!(!controller.no_new_privs);
        let default = Privileges::of(
            &json!({}),
            &json!({"securityContext": {"runAsUser": 7,
            "capabilities": {"drop": ["NET_RAW"]}}}),
        )
        .unwrap();
        assert_eq!(default.capabilities.len(), DEFAULT_CAPABILITIES.len() - 1);
        let refused = |pod: Value, c: Value| format!("{:#}", Privileges::of(&pod, &c).unwrap_err());
        assert!(refused(json!({}), json!({})).contains("runAsUser"));
        assert!(
            refused(
                json!({"securityContext": {"runAsNonRoot": true}}),
                json!({"securityContext": {"runAsUser": 0}})
            )
            .contains("refuses")
        );
    }

    #[test]
    fn probes_resolve_named_ports_and_kubernetes_defaults() {
        let container = json!({"ports": [{"name": "metrics", "containerPort": 7572}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 2},
            "livenessProbe": {"tcpSocket": {"port": 1}},
            "startupProbe": {"httpGet": {"path": "/healthz", "port": "nope"}}});
        assert_eq!(
            http_probe(&container, "readinessProbe").unwrap(),
            Some(HttpProbe {
                path: "/readyz".into(),
                port: 7572,
                initial_delay: Duration::ZERO,
                period: Duration::from_secs(2),
                timeout: Duration::from_secs(1),
                success_threshold: 1,
                failure_threshold: 3,
            })
        );
        assert!(http_probe(&container, "livenessProbe").is_err());
        assert!(http_probe(&container, "startupProbe").is_err());
        assert_eq!(http_probe(&container, "other").unwrap(), None);
    }

    #[test]
    fn a_secret_volume_is_written_atomically_with_its_items_and_modes() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("swimlb-kubelet-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let spec = json!({"volumes": [{"name": "key", "secret": {"secretName": "s",
            "optional": true, "defaultMode": 256, "items": [{"key": "keys", "path": "keys"}]}}]});
        let container = json!({"volumeMounts": [{"name": "key", "mountPath": "/etc/k"}]});
        let volumes = secret_volumes(&spec, &container, &dir).unwrap();
        assert_eq!(volumes.len(), 1);
        let volume = &volumes[0];
        assert!(volume.optional);
        let secret = |keys: &str| {
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                "data": {"keys": keys, "other": "eA=="}})
        };
        let files = volume.files(&secret("b25l")).unwrap();
        assert_eq!(files, [("keys".to_string(), b"one".to_vec(), 0o400)]);
        volume.write(&files, "1").unwrap();
        let path = volume.dir.join("keys");
        assert_eq!(std::fs::read(&path).unwrap(), b"one");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o400);
        volume
            .write(&volume.files(&secret("dHdv")).unwrap(), "2")
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert!(!volume.dir.join("..1").exists(), "the old data is removed");
        let other = json!({"volumes": [{"name": "key", "emptyDir": {}}]});
        assert!(secret_volumes(&other, &container, &dir).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
