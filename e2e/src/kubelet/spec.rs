//! What a container is, read from its Pod: its command line and environment as Kubernetes
//! resolves them ([`container_process`]: `$(VAR)` expansion, the downward API, Secret and
//! ConfigMap keys), the user and capabilities its `securityContext` asks for ([`Privileges`])
//! and its `httpGet` probes ([`http_probe`]). Pure functions over the Pod's JSON, except the probe
//! itself ([`ProbeRun`]), which connects.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use tokio::time::Instant;

/// Where the image keeps its binaries (`Containerfile`: `COPY ... /usr/local/bin/`).
const IMAGE_BINARIES: [(&str, &str); 2] = [
    ("/usr/local/bin/swimlb-speaker", "speaker"),
    ("/usr/local/bin/swimlb-controller", "controller"),
];
/// Images whose Pods name no `command`, so the image's entrypoint runs: (repository, the
/// program of the control plane's build folder that stands for the entrypoint, the image's
/// `USER`). MetalLB's images (`ENTRYPOINT ["/speaker"]`, `["/controller"]`, on
/// `gcr.io/distroless/static`, whose user is root).
const IMAGE_ENTRYPOINTS: [(&str, &str, u32); 2] = [
    ("quay.io/metallb/speaker", "metallb-speaker", 0),
    ("quay.io/metallb/controller", "metallb-controller", 0),
];

/// The programs of the control plane's build folder that stand for images.
pub const BUILT_PROGRAMS: [&str; 2] = [IMAGE_ENTRYPOINTS[0].1, IMAGE_ENTRYPOINTS[1].1];

/// The repository of an image reference, without its tag or digest.
fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => image,
    }
}

/// The entry of [`IMAGE_ENTRYPOINTS`] for `container`'s image.
fn entrypoint(container: &Value) -> Option<(&'static str, &'static str, u32)> {
    let image = repository(text(container, "/image")?);
    IMAGE_ENTRYPOINTS
        .iter()
        .find(|(repo, _, _)| *repo == image)
        .copied()
}
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

/// The string at `pointer` in `v`.
pub(super) fn text<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

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

/// The value of a downward API `fieldPath` of `pod`.
pub(super) fn field_ref(pod: &Value, path: &str) -> Result<String> {
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
pub(super) fn secret_data(secret: &Value) -> Result<BTreeMap<String, Vec<u8>>> {
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

/// The program that stands for a container's binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// The lab binary's subcommand (`speaker`, `controller`): swimlb's image.
    Lab(&'static str),
    /// A program of the control plane's build folder (`metallb-speaker`): the entrypoint of an
    /// image of [`IMAGE_ENTRYPOINTS`].
    Built(&'static str),
}

/// How the lab runs one container: its program, its arguments, its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerProcess {
    /// What runs for the image's binary.
    pub program: Program,
    /// The arguments after it (the rest of `command`, then `args`), expanded.
    pub args: Vec<String>,
    /// The container's environment, in order, expanded: the kubelet's variables first (the
    /// Services' links), then the container's own.
    pub env: Vec<(String, String)>,
}

/// The process of `container` (of `pod`, whose status holds its IPs): `$(VAR)` expanded, the
/// environment resolved (`lookup` finds Secrets and ConfigMaps) after the kubelet's own
/// variables `base`, which it may name and override. An error names what the lab cannot run,
/// or what is missing for now (a Secret a non-optional `secretKeyRef` names).
pub fn container_process(
    pod: &Value,
    container: &Value,
    lookup: Lookup<'_>,
    base: &[(String, String)],
) -> Result<ContainerProcess> {
    let cname = text(container, "/name").unwrap_or("?");
    let namespace = text(pod, "/metadata/namespace").unwrap_or("default");
    if container.get("envFrom").is_some() {
        bail!("container {cname}: envFrom is not played by the lab");
    }
    let mut env: Vec<(String, String)> = base.to_vec();
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
            .map(|s| expand(s, all))
            .collect()
    };
    let command = strings("command");
    if command.is_empty()
        && let Some((_, built, _)) = entrypoint(container)
    {
        return Ok(ContainerProcess {
            program: Program::Built(built),
            args: strings("args"),
            env,
        });
    }
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
    Ok(ContainerProcess {
        program: Program::Lab(subcommand),
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
        let uid = match field("runAsUser").and_then(Value::as_u64) {
            Some(uid) => uid as u32,
            None => entrypoint(container).map(|(_, _, user)| user).context(
                "no runAsUser: the image's USER would apply, which the lab does not read",
            )?,
        };
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
pub(super) struct ProbeRun {
    probe: HttpProbe,
    due: Instant,
    successes: u32,
    failures: u32,
    /// The verdict once a threshold was reached.
    verdict: Option<bool>,
}

impl ProbeRun {
    pub(super) fn new(probe: HttpProbe, started: Instant) -> ProbeRun {
        ProbeRun {
            due: started + probe.initial_delay,
            probe,
            successes: 0,
            failures: 0,
            verdict: None,
        }
    }

    /// Probes `ip` when due; the verdict.
    pub(super) fn run(&mut self, ip: IpAddr, now: Instant) -> Option<bool> {
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
                {"name": "API", "value": "$(KUBERNETES_SERVICE_HOST)"},
                {"name": "KEY", "value": "/etc/k/keys"}]});
        let base = [(
            "KUBERNETES_SERVICE_HOST".to_string(),
            "192.0.2.129".to_string(),
        )];
        let p = container_process(&pod(), &container, &no_objects, &base).unwrap();
        assert_eq!(p.program, Program::Lab("controller"));
        assert_eq!(
            p.args,
            [
                "--lease-namespace=ns",
                "--identity=p-1",
                "--key=/etc/k/keys",
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
        assert_eq!(env["API"], "192.0.2.129");
        assert_eq!(env["KEY"], "/etc/k/keys");
        // The kubelet's variables come first; a container's may name them.
        assert_eq!(p.env[0].0, "KUBERNETES_SERVICE_HOST");
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
    fn metallbs_images_run_their_entrypoint_from_the_build_folder_as_root() {
        let speaker = json!({"name": "speaker", "image": "quay.io/metallb/speaker:v0.15.2",
            "args": ["--port=7472", "--log-level=info"],
            "env": [{"name": "METALLB_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
            "securityContext": {"allowPrivilegeEscalation": false,
                "capabilities": {"add": ["NET_RAW"], "drop": ["ALL"]}}});
        let p = container_process(&pod(), &speaker, &no_objects, &[]).unwrap();
        assert_eq!(p.program, Program::Built("metallb-speaker"));
        assert_eq!(p.args, ["--port=7472", "--log-level=info"]);
        assert_eq!(p.env, [("METALLB_NODE_NAME".into(), "node1".into())]);
        let privileges = Privileges::of(&json!({}), &speaker).unwrap();
        assert_eq!(
            (privileges.uid, privileges.capabilities.clone()),
            (0, vec!["NET_RAW".to_string()])
        );
        let controller = json!({"name": "controller",
            "image": "quay.io/metallb/controller@sha256:00", "args": []});
        assert_eq!(
            container_process(&pod(), &controller, &no_objects, &[])
                .unwrap()
                .program,
            Program::Built("metallb-controller")
        );
        // Another image without a command is still refused.
        let other = json!({"name": "c", "image": "registry.example/metallb/speaker:v1"});
        assert!(container_process(&pod(), &other, &no_objects, &[]).is_err());
        assert_eq!(
            repository("registry.example:5000/a/b"),
            "registry.example:5000/a/b"
        );
        assert_eq!(
            repository("registry.example:5000/a/b:v1"),
            "registry.example:5000/a/b"
        );
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
}
