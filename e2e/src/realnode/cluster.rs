//! A lab's nodes as real nodes, for whatever the lab runs on them: the images built once
//! ([`NodeImages`]), every node of a [`Lab`] started against one control plane and Ready
//! ([`RealCluster`]), and what each Node's `status.nodeInfo` reports ([`NodeInfo`]).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde_json::Value;

use super::metallb::MetallbImages;
use super::{NodeOptions, NodePrograms, RealNode, image, prepare_cluster};
use crate::control_plane::ControlPlane;
use crate::netns::Lab;

/// The OCI archives a real node imports: the pause image first (pinned), then the project's.
#[derive(Debug, Clone)]
pub struct NodeImages {
    /// The pause image's archive.
    pub pause: PathBuf,
    /// The project's image's archive.
    pub project: PathBuf,
    /// The project's image's reference (what the manifest names instead of the published one).
    pub tag: String,
    /// The backend's archive and reference, once [`NodeImages::with_echo`] built it.
    pub echo: Option<(PathBuf, String)>,
    /// MetalLB's images, once [`NodeImages::with_metallb`] built them.
    pub metallb: Option<MetallbImages>,
    /// Images built on the project's by [`NodeImages::with_env_layer`]: archive and reference.
    pub layers: Vec<(PathBuf, String)>,
}

impl NodeImages {
    /// Builds both images into `dir` with buildah: the project's from the binaries of cargo's
    /// profile `profile` (built first), tagged `tag`; or, when `$SWIMLB_IMAGE_BIN` names a
    /// folder, from the `swimlb-speaker` and `swimlb-controller` already there (a measurement
    /// of a committed tree built apart from a working tree that others edit). A process that
    /// built them once links (or copies) the archives it kept ([`BUILT`]) instead.
    pub fn build(
        programs: &NodePrograms,
        dir: &Path,
        profile: &str,
        tag: &str,
    ) -> Result<NodeImages> {
        let key = format!(
            "{profile} {tag} {} {:?}",
            programs.pause_tag(),
            std::env::var_os("SWIMLB_IMAGE_BIN")
        );
        let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
        let images = NodeImages {
            pause: dir.join("pause.tar"),
            project: dir.join("swimlb.tar"),
            tag: tag.to_string(),
            echo: None,
            metallb: None,
            layers: Vec::new(),
        };
        if let Some((_, cache)) = built.as_ref().filter(|(k, _)| *k == key)
            && reuse(cache, &images).is_ok()
        {
            return Ok(images);
        }
        let bin_dir = match std::env::var_os("SWIMLB_IMAGE_BIN") {
            Some(dir) => PathBuf::from(dir),
            None => image::cargo_build(profile)?,
        };
        let builder = image::Builder::new(&dir.join("buildah"))?;
        builder
            .pause_image(
                &programs.path("pause"),
                &programs.pause_tag(),
                &images.pause,
            )
            .context("the pause image")?;
        builder
            .project_image(&bin_dir, tag, &images.project)
            .context("the project's image")?;
        // Kept for this process's next cluster (a test binary starts one per test).
        let cache = std::env::temp_dir().join(format!("swimlb-node-{}-images", std::process::id()));
        let kept = std::fs::create_dir_all(&cache).and_then(|()| {
            link_or_copy(&images.pause, &cache.join("pause.tar"))?;
            link_or_copy(&images.project, &cache.join("swimlb.tar"))
        });
        if kept.is_ok() {
            *built = Some((key, cache));
        }
        Ok(images)
    }

    /// Also builds the backend's image (`swimlb-echo`, [`image::Builder::echo_image`]) into
    /// `dir`, tagged `tag`; every node imports it too.
    pub fn with_echo(mut self, dir: &Path, tag: &str) -> Result<NodeImages> {
        let builder = image::Builder::new(&dir.join("buildah-echo"))?;
        let archive = dir.join("echo.tar");
        builder
            .echo_image(tag, &archive)
            .context("the backend's image")?;
        self.echo = Some((archive, tag.to_string()));
        Ok(self)
    }

    /// Also builds MetalLB's controller and speaker images ([`MetallbImages::build`]) into
    /// `dir`; every node imports them too.
    pub fn with_metallb(mut self, dir: &Path) -> Result<NodeImages> {
        self.metallb = Some(MetallbImages::build(dir)?);
        Ok(self)
    }

    /// Also builds the project's image with `env` set on top
    /// ([`image::Builder::env_layer`]: the same binaries, one configuration changed) into `dir`,
    /// tagged `tag`; every node imports it too. An upgrade test starts the speakers from it.
    pub fn with_env_layer(
        mut self,
        dir: &Path,
        tag: &str,
        env: &[(&str, &str)],
    ) -> Result<NodeImages> {
        let n = self.layers.len();
        let builder = image::Builder::new(&dir.join(format!("buildah-layer-{n}")))?;
        let archive = dir.join(format!("layer-{n}.tar"));
        builder
            .env_layer(&self.project, env, tag, &archive)
            .with_context(|| format!("the image {tag}"))?;
        self.layers.push((archive, tag.to_string()));
        Ok(self)
    }

    fn archives(&self) -> Vec<&Path> {
        let mut archives = vec![self.pause.as_path(), self.project.as_path()];
        archives.extend(self.layers.iter().map(|(a, _)| a.as_path()));
        archives.extend(self.echo.as_ref().map(|(a, _)| a.as_path()));
        if let Some(m) = &self.metallb {
            archives.extend(m.archives());
        }
        archives
    }
}

/// The pause and project archives this process built, for its next cluster (a test binary
/// starts one per test): what they were built for (profile, tag, pause tag, `$SWIMLB_IMAGE_BIN`)
/// and their folder, `swimlb-node-<pid>-images` in the temporary folder
/// ([`super::cleanup_stale`] deletes it once the process is gone).
static BUILT: std::sync::Mutex<Option<(String, PathBuf)>> = std::sync::Mutex::new(None);

/// `images`' pause and project archives from the folder `cache` ([`BUILT`]).
fn reuse(cache: &Path, images: &NodeImages) -> std::io::Result<()> {
    if let Some(dir) = images.pause.parent() {
        std::fs::create_dir_all(dir)?;
    }
    link_or_copy(&cache.join("pause.tar"), &images.pause)?;
    link_or_copy(&cache.join("swimlb.tar"), &images.project)
}

/// A hard link of `from` at `to` (replacing it), or a copy where no link can be made.
fn link_or_copy(from: &Path, to: &Path) -> std::io::Result<()> {
    let _ = std::fs::remove_file(to);
    std::fs::hard_link(from, to).or_else(|_| std::fs::copy(from, to).map(|_| ()))
}

/// What a Node's `status.nodeInfo` says of its kubelet and runtime.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeInfo {
    /// The Node's name.
    pub node: String,
    /// `kubeletVersion` (`v1.37.2`).
    pub kubelet_version: String,
    /// `containerRuntimeVersion` (`containerd://2.4.2`).
    pub container_runtime: String,
}

impl NodeInfo {
    /// From a Node object.
    pub fn of(node: &Value) -> NodeInfo {
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let info = &node["status"]["nodeInfo"];
        NodeInfo {
            node: s(&node["metadata"]["name"]),
            kubelet_version: s(&info["kubeletVersion"]),
            container_runtime: s(&info["containerRuntimeVersion"]),
        }
    }
}

/// Every node of a lab as a real node, Ready; dropping it tears them down (before the control
/// plane and the lab, when it is declared after them).
#[derive(Debug)]
pub struct RealCluster {
    /// The nodes, in the lab's order.
    pub nodes: Vec<RealNode>,
    /// Each Node as it was when it turned Ready.
    pub ready: Vec<Value>,
}

impl RealCluster {
    /// Starts a real node in each of `lab`'s node namespaces against `plane` (which runs in
    /// the lab's client namespace and issued the nodes' kubelet certificates), with `images`
    /// imported, the client's routes to their Pods, and waits until every Node is Ready.
    pub fn start(
        lab: &Lab,
        plane: &ControlPlane,
        programs: &NodePrograms,
        options: &NodeOptions,
        images: &NodeImages,
    ) -> Result<RealCluster> {
        prepare_cluster(plane)?;
        let mut nodes = Vec::new();
        for node in &lab.nodes {
            let real = RealNode::start(plane, node, programs, options, &images.archives())
                .with_context(|| format!("the real node {}", node.name))?;
            real.route_pods_from(&lab.client_netns)?;
            nodes.push(real);
        }
        let mut ready = Vec::new();
        for node in &mut nodes {
            ready.push(node.wait_ready(plane)?);
        }
        Ok(RealCluster { nodes, ready })
    }

    /// What each Node's `nodeInfo` reported when it turned Ready.
    pub fn node_infos(&self) -> Vec<NodeInfo> {
        self.ready.iter().map(NodeInfo::of).collect()
    }

    /// Checks that every node's programs still run.
    pub fn check_running(&mut self) -> Result<()> {
        self.nodes.iter_mut().try_for_each(RealNode::check_running)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_info_reads_the_kubelet_and_runtime_versions_of_a_node() {
        let node = serde_json::json!({"metadata": {"name": "node1"}, "status": {"nodeInfo": {
            "kubeletVersion": "v1.37.2", "containerRuntimeVersion": "containerd://2.4.2"}}});
        assert_eq!(
            NodeInfo::of(&node),
            NodeInfo {
                node: "node1".into(),
                kubelet_version: "v1.37.2".into(),
                container_runtime: "containerd://2.4.2".into(),
            }
        );
        assert_eq!(NodeInfo::of(&Value::Null).kubelet_version, "");
    }
}
