//! MetalLB on the real nodes: its controller and speaker built static from the pinned module
//! (`e2e/k8s/metallb-static/build.sh`, `CGO_ENABLED=0` as MetalLB's Dockerfiles build them),
//! each in an image built the way MetalLB's Dockerfile builds it (the program at `/controller`
//! or `/speaker`, its entrypoint, MetalLB's `LICENSE` beside it; from an empty base where
//! MetalLB's is `distroless/static`, whose CA bundle and time zones neither program reads here),
//! imported into every node's containerd ([`MetallbImages`]); its `metallb-native.yaml` with
//! only the images replaced and the webhook left out ([`node_manifest`]); and what a speaker
//! shows of its state ([`speaker_view`]): its `/metrics` (`metallb_speaker_announced`) and its
//! container's log as the kubelet keeps it (memberlist's node events).
//!
//! The pure part: MetalLB's names ([`NAMESPACE`], [`MANIFEST`], [`METRICS_PORT`]), its manifest
//! without the webhook ([`lab_manifest`]), a speaker's memberlist from its log ([`members`]) and
//! whether its `/metrics` announce an address ([`announces`]).

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::RealNode;
use super::image::Builder;
use crate::netns::Lab;
use crate::scrape;

/// MetalLB's namespace (its manifest's).
pub const NAMESPACE: &str = "metallb-system";
/// MetalLB's manifest, in the control plane's build folder (`e2e/k8s/build.sh` copies it from
/// the pinned module).
pub const MANIFEST: &str = "metallb-native.yaml";
/// The speakers' `/metrics` port (`--port=7472` in the manifest), on the node's address.
pub const METRICS_PORT: u16 = 7472;
/// MetalLB's manifest as the lab applies it: without the `ValidatingWebhookConfiguration`, the
/// controller with `--webhook-mode=disabled`; every other document as it is.
pub fn lab_manifest(text: &str) -> Result<String> {
    let mut docs = Vec::new();
    let mut controller = false;
    for doc in text.split("\n---\n") {
        let kind = |k: &str| doc.lines().any(|l| l == format!("kind: {k}"));
        if kind("ValidatingWebhookConfiguration") {
            continue;
        }
        if kind("Deployment") && doc.lines().any(|l| l == "  name: controller") {
            let args = "      - args:\n";
            if doc.matches(args).count() != 1 {
                bail!("{MANIFEST}: the controller's Deployment has not one container with args");
            }
            docs.push(doc.replace(args, &format!("{args}        - --webhook-mode=disabled\n")));
            controller = true;
            continue;
        }
        docs.push(doc.to_string());
    }
    if !controller {
        bail!("{MANIFEST}: no Deployment `controller`");
    }
    Ok(docs.join("\n---\n"))
}

/// The members of a speaker's memberlist, from its log: the node events MetalLB logs ("node
/// event - forcing sync", `NodeJoin`, `NodeLeave`, `NodeUpdate`) since the speaker's last start
/// ("MetalLB speaker starting"). Lines that are not MetalLB's JSON are skipped.
pub fn members(log: &str) -> BTreeSet<String> {
    let mut members = BTreeSet::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let msg = v["msg"].as_str().unwrap_or("");
        if msg.starts_with("MetalLB speaker starting") {
            members.clear();
        }
        if msg != "node event - forcing sync" {
            continue;
        }
        let Some(node) = v["node name"].as_str() else {
            continue;
        };
        match v["node event"].as_str() {
            Some("NodeJoin" | "NodeUpdate") => {
                members.insert(node.to_string());
            }
            Some("NodeLeave") => {
                members.remove(node);
            }
            _ => {}
        }
    }
    members
}

/// Whether `metrics` (a speaker's `/metrics`) says that `node` announces `ip`.
pub fn announces(metrics: &str, node: &str, ip: IpAddr) -> bool {
    let ip = ip.to_string();
    scrape::samples(metrics).iter().any(|s| {
        let label = |k: &str| {
            s.labels
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        s.name == "metallb_speaker_announced"
            && label("ip") == Some(ip.as_str())
            && label("node") == Some(node)
            && s.value == 1.0
    })
}

/// The images MetalLB's manifest names, replaced by [`node_manifest`].
const PUBLISHED: [(&str, &str); 2] = [
    ("controller", "quay.io/metallb/controller:"),
    ("speaker", "quay.io/metallb/speaker:"),
];

/// The folder of the static programs: `$SWIMLB_METALLB_STATIC_BIN` when set (`test.sh` sets
/// it), else what `e2e/k8s/metallb-static/build.sh` prints (it builds once, then finds its
/// cache).
pub fn locate() -> Result<PathBuf> {
    let dir = super::built_dir("SWIMLB_METALLB_STATIC_BIN", "k8s/metallb-static/build.sh")?;
    for f in ["controller", "speaker", "LICENSE", MANIFEST] {
        if !dir.join(f).is_file() {
            bail!(
                "{} is missing: run e2e/k8s/metallb-static/build.sh",
                dir.join(f).display()
            );
        }
    }
    Ok(dir)
}

/// MetalLB's two images as OCI archives, with their references.
#[derive(Debug, Clone)]
pub struct MetallbImages {
    /// The folder of the programs and of `metallb-native.yaml`.
    pub dir: PathBuf,
    /// (archive, reference) of the controller's image.
    pub controller: (PathBuf, String),
    /// (archive, reference) of the speaker's image.
    pub speaker: (PathBuf, String),
}

impl MetallbImages {
    /// Builds both images into `dir` from the programs [`locate`] finds, tagged
    /// `localhost/metallb/NAME:VERSION` with the manifest's version.
    pub fn build(dir: &Path) -> Result<MetallbImages> {
        let bin = locate()?;
        let manifest = std::fs::read_to_string(bin.join(MANIFEST))?;
        let version = manifest_version(&manifest)?;
        let builder = Builder::new(&dir.join("buildah-metallb"))?;
        let mut built = Vec::new();
        for (name, _) in PUBLISHED {
            let tag = format!("localhost/metallb/{name}:{version}");
            let archive = dir.join(format!("metallb-{name}.tar"));
            builder
                .program_image(
                    &[(&bin.join(name), name), (&bin.join("LICENSE"), "LICENSE")],
                    name,
                    None,
                    &tag,
                    &archive,
                )
                .with_context(|| format!("MetalLB's {name} image"))?;
            built.push((archive, tag));
        }
        let speaker = built.pop().context("the speaker's image")?;
        let controller = built.pop().context("the controller's image")?;
        Ok(MetallbImages {
            dir: bin,
            controller,
            speaker,
        })
    }

    /// The archives every node imports.
    pub fn archives(&self) -> [&Path; 2] {
        [self.controller.0.as_path(), self.speaker.0.as_path()]
    }

    /// MetalLB's manifest for these images ([`node_manifest`]).
    pub fn manifest(&self) -> Result<String> {
        let path = self.dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
        node_manifest(&text, &self.controller.1, &self.speaker.1)
    }
}

/// The version of MetalLB's images in its manifest (`v0.15.2`).
pub fn manifest_version(text: &str) -> Result<String> {
    let (_, published) = PUBLISHED[1];
    text.lines()
        .find_map(|l| l.trim().strip_prefix("image: ")?.strip_prefix(published))
        .map(str::to_string)
        .with_context(|| format!("{}: no image {published}...", MANIFEST))
}

/// MetalLB's manifest as the real nodes run it: [`lab_manifest`]'s (without the
/// `ValidatingWebhookConfiguration`, the controller's webhook disabled: the API server runs
/// outside the nodes, where no kube-proxy carries it to the webhook Service) with the two images
/// replaced by `controller` and `speaker`, as a user of a private registry would.
pub fn node_manifest(text: &str, controller: &str, speaker: &str) -> Result<String> {
    let version = manifest_version(text)?;
    let mut out = lab_manifest(text)?;
    for ((name, published), image) in PUBLISHED.iter().zip([controller, speaker]) {
        let from = format!("image: {published}{version}");
        if out.matches(&from).count() != 1 {
            bail!("{}: not one `{from}` ({name})", MANIFEST);
        }
        out = out.replace(&from, &format!("image: {image}"));
    }
    Ok(out)
}

/// The text of a container log as the kubelet writes it (CRI format: `TIME STREAM TAG TEXT`,
/// tag `P` for a part of a line, `F` for its end); lines not in that format are skipped.
pub fn cri_log_text(raw: &str) -> String {
    let mut text = String::new();
    for line in raw.lines() {
        let mut parts = line.splitn(4, ' ');
        let (Some(_), Some(_), Some(tag), Some(rest)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        text.push_str(rest);
        if tag != "P" {
            text.push('\n');
        }
    }
    text
}

/// The log of container `container` of the Pod in `namespace` whose name starts with `prefix`
/// on `node`, every restart's in order, as text ([`cri_log_text`]); empty when there is none.
pub fn container_log(node: &RealNode, namespace: &str, prefix: &str, container: &str) -> String {
    pod_log(&node.dir().join("pod-logs"), namespace, prefix, container)
}

/// [`container_log`] from a node's Pod log folder (`pod-logs` in [`RealNode::dir`]).
pub fn pod_log(pod_logs: &Path, namespace: &str, prefix: &str, container: &str) -> String {
    let start = format!("{namespace}_{prefix}");
    let Ok(pods) = std::fs::read_dir(pod_logs) else {
        return String::new();
    };
    let mut text = String::new();
    for pod in pods.flatten() {
        if !pod.file_name().to_string_lossy().starts_with(&start) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(pod.path().join(container)) else {
            continue;
        };
        // `N.log`, N the restart count.
        let mut logs: Vec<(u64, PathBuf)> = files
            .flatten()
            .filter_map(|f| {
                let name = f.file_name().to_string_lossy().into_owned();
                Some((name.strip_suffix(".log")?.parse().ok()?, f.path()))
            })
            .collect();
        logs.sort();
        for (_, path) in logs {
            text.push_str(&cri_log_text(
                &std::fs::read_to_string(path).unwrap_or_default(),
            ));
        }
    }
    text
}

/// What one MetalLB speaker shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeakerView {
    /// Its memberlist's members ([`members`] of its log).
    pub members: BTreeSet<String>,
    /// Whether it announces the address asked.
    pub announces: bool,
}

/// What each node's MetalLB speaker shows of `ip`, in node order (`None`: no `/metrics`).
pub fn speaker_view(lab: &Lab, nodes: &[RealNode], ip: IpAddr) -> Vec<Option<SpeakerView>> {
    let addrs: Vec<SocketAddr> = lab
        .nodes
        .iter()
        .map(|n| SocketAddr::from((n.v4, METRICS_PORT)))
        .collect();
    let metrics = crate::lab::read_each(lab, addrs, "/metrics", 1, |t| Some(t.to_string()));
    nodes
        .iter()
        .zip(metrics)
        .map(|(node, metrics)| {
            let metrics = metrics?;
            Some(SpeakerView {
                members: members(&container_log(node, NAMESPACE, "speaker-", "speaker")),
                announces: announces(&metrics, &node.name, ip),
            })
        })
        .collect()
}

/// The one node every speaker's view names: each sees all `n` members and exactly one
/// announces; `None` otherwise.
pub fn settled_owner(names: &[&str], views: &[Option<SpeakerView>]) -> Option<String> {
    let n = names.len();
    if views.len() != n
        || views
            .iter()
            .any(|v| v.as_ref().is_none_or(|v| v.members.len() != n))
    {
        return None;
    }
    let announcers: Vec<&str> = names
        .iter()
        .zip(views)
        .filter(|(_, v)| v.as_ref().is_some_and(|v| v.announces))
        .map(|(name, _)| *name)
        .collect();
    match announcers.as_slice() {
        [one] => Some(one.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: controller\nspec:\n  template:\n    spec:\n      containers:\n      - args:\n        - --port=7472\n        image: quay.io/metallb/controller:v0.15.2\n---\nkind: ValidatingWebhookConfiguration\nmetadata:\n  name: x\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: speaker\nspec:\n  template:\n    spec:\n      containers:\n      - args:\n        - --port=7472\n        image: quay.io/metallb/speaker:v0.15.2\n";

    #[test]
    fn the_node_manifest_replaces_both_images_and_drops_the_webhook() {
        assert_eq!(manifest_version(SAMPLE).unwrap(), "v0.15.2");
        let out = node_manifest(SAMPLE, "localhost/c:1", "localhost/s:1").unwrap();
        assert!(out.contains("image: localhost/c:1") && out.contains("image: localhost/s:1"));
        assert!(!out.contains("quay.io") && !out.contains("ValidatingWebhookConfiguration"));
        assert!(out.contains("--webhook-mode=disabled"));
        assert!(node_manifest(&SAMPLE.replace("speaker:v0", "other:v0"), "a", "b").is_err());
        assert!(manifest_version("kind: Namespace\n").is_err());
    }

    #[test]
    fn a_cri_log_is_its_lines_with_parts_joined() {
        let raw = "2026-12-07T12:00:00.1Z stderr F {\"a\":1}\n2026-12-07T12:00:00.2Z stderr P {\"b\"\n2026-12-07T12:00:00.3Z stderr F :2}\nbroken\n";
        assert_eq!(cri_log_text(raw), "{\"a\":1}\n{\"b\":2}\n");
        assert_eq!(cri_log_text(""), "");
    }

    #[test]
    fn the_owner_is_the_one_announcer_when_every_speaker_sees_every_member() {
        let names = ["node1", "node2", "node3"];
        let all: BTreeSet<String> = names.iter().map(|s| s.to_string()).collect();
        let view = |announces, members: &BTreeSet<String>| {
            Some(SpeakerView {
                members: members.clone(),
                announces,
            })
        };
        let views = vec![view(false, &all), view(true, &all), view(false, &all)];
        assert_eq!(settled_owner(&names, &views).as_deref(), Some("node2"));
        let mut two = views.clone();
        two[0] = view(true, &all);
        assert_eq!(settled_owner(&names, &two), None);
        let mut partial = views.clone();
        let mut fewer = all.clone();
        fewer.remove("node3");
        partial[2] = view(false, &fewer);
        assert_eq!(settled_owner(&names, &partial), None);
        let mut missing = views;
        missing[0] = None;
        assert_eq!(settled_owner(&names, &missing), None);
    }

    const NATIVE_SAMPLE: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: metallb-system\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: controller\n  namespace: metallb-system\nspec:\n  template:\n    spec:\n      containers:\n      - args:\n        - --port=7472\n        image: quay.io/metallb/controller:v0.15.2\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata:\n  name: metallb-webhook-configuration\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: speaker\nspec:\n  template:\n    spec:\n      containers:\n      - args:\n        - --port=7472\n";

    #[test]
    fn the_lab_drops_the_webhook_configuration_and_disables_the_controllers_webhooks() {
        let out = lab_manifest(NATIVE_SAMPLE).unwrap();
        assert!(!out.contains("ValidatingWebhookConfiguration"), "{out}");
        assert_eq!(out.matches("--webhook-mode=disabled").count(), 1, "{out}");
        let controller = out
            .split("\n---\n")
            .find(|d| d.contains("kind: Deployment"))
            .unwrap();
        assert!(
            controller.contains(
                "      - args:\n        - --webhook-mode=disabled\n        - --port=7472\n"
            ),
            "{controller}"
        );
        // The speaker's DaemonSet is MetalLB's.
        assert!(out.ends_with("kind: DaemonSet\nmetadata:\n  name: speaker\nspec:\n  template:\n    spec:\n      containers:\n      - args:\n        - --port=7472\n"));
        assert!(lab_manifest("kind: Namespace\n").is_err());
    }

    #[test]
    fn the_memberlist_is_what_the_node_events_since_the_last_start_leave() {
        let event = |node: &str, e: &str| {
            format!(
                r#"{{"caller":"speakerlist.go:331","level":"info","msg":"node event - forcing sync","node addr":"198.51.100.1","node event":"{e}","node name":"{node}","ts":"2026-11-26T15:00:00Z"}}"#
            )
        };
        let start = r#"{"level":"info","msg":"MetalLB speaker starting version 0.15.2"}"#;
        let log = [
            start.to_string(),
            event("node1", "NodeJoin"),
            event("node2", "NodeJoin"),
            "not json".to_string(),
            event("node3", "NodeJoin"),
            event("node2", "NodeLeave"),
            event("node3", "NodeUpdate"),
        ]
        .join("\n");
        assert_eq!(
            members(&log).into_iter().collect::<Vec<_>>(),
            ["node1", "node3"]
        );
        let restarted = format!("{log}\n{start}\n{}", event("node1", "NodeJoin"));
        assert_eq!(members(&restarted).len(), 1);
        assert!(members("").is_empty());
    }

    #[test]
    fn only_the_announced_gauge_of_this_node_and_ip_at_one_counts() {
        let vip: IpAddr = "198.51.100.100".parse().unwrap();
        let metrics = "# TYPE metallb_speaker_announced gauge\nmetallb_speaker_announced{ip=\"198.51.100.100\",node=\"node3\",protocol=\"layer2\",service=\"default/web\"} 1\n";
        assert!(announces(metrics, "node3", vip));
        assert!(!announces(metrics, "node2", vip));
        assert!(!announces(
            metrics,
            "node3",
            "198.51.100.101".parse().unwrap()
        ));
        assert!(!announces(&metrics.replace("} 1", "} 0"), "node3", vip));
        assert!(!announces("", "node3", vip));
    }
}
