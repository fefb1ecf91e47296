//! MetalLB on the real nodes: its controller and speaker built static from the pinned module
//! (`e2e/k8s/metallb-static/build.sh`, `CGO_ENABLED=0` as MetalLB's Dockerfiles build them),
//! each in an image built the way MetalLB's Dockerfile builds it (the program at `/controller`
//! or `/speaker`, its entrypoint, MetalLB's `LICENSE` beside it; from an empty base where
//! MetalLB's is `distroless/static`, whose CA bundle and time zones neither program reads here),
//! imported into every node's containerd ([`MetallbImages`]); its `metallb-native.yaml` with
//! only the images replaced and the webhook left out ([`node_manifest`]); and what a speaker
//! shows of its state ([`speaker_view`]): its `/metrics` (`metallb_speaker_announced`) and its
//! container's log as the kubelet keeps it (memberlist's node events).

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use super::RealNode;
use super::image::Builder;
use crate::metallb::{self, METRICS_PORT};
use crate::netns::Lab;

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
    for f in ["controller", "speaker", "LICENSE", metallb::MANIFEST] {
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
        let manifest = std::fs::read_to_string(bin.join(metallb::MANIFEST))?;
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
        let path = self.dir.join(metallb::MANIFEST);
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
        .with_context(|| format!("{}: no image {published}...", metallb::MANIFEST))
}

/// MetalLB's manifest as the real nodes run it: [`metallb::lab_manifest`]'s (without the
/// `ValidatingWebhookConfiguration`, the controller's webhook disabled: the API server runs
/// outside the nodes, where no kube-proxy carries it to the webhook Service) with the two images
/// replaced by `controller` and `speaker`, as a user of a private registry would.
pub fn node_manifest(text: &str, controller: &str, speaker: &str) -> Result<String> {
    let version = manifest_version(text)?;
    let mut out = metallb::lab_manifest(text)?;
    for ((name, published), image) in PUBLISHED.iter().zip([controller, speaker]) {
        let from = format!("image: {published}{version}");
        if out.matches(&from).count() != 1 {
            bail!("{}: not one `{from}` ({name})", metallb::MANIFEST);
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
    let start = format!("{namespace}_{prefix}");
    let Ok(pods) = std::fs::read_dir(node.dir().join("pod-logs")) else {
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
    /// Its memberlist's members ([`metallb::members`] of its log).
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
                members: metallb::members(&container_log(
                    node,
                    metallb::NAMESPACE,
                    "speaker-",
                    "speaker",
                )),
                announces: metallb::announces(&metrics, &node.name, ip),
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
}
