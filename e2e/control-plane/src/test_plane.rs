//! One test's control plane: on the loopback (no root), in a folder of its own that is removed
//! when the test passed and kept, with every component's log, when it failed.

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::control_plane::{AuditRecord, ControlPlane, Network, Options};

/// A [`ControlPlane`] on the loopback for one test (it derefs to it).
#[derive(Debug)]
pub struct TestPlane {
    plane: Option<ControlPlane>,
    dir: PathBuf,
}

impl TestPlane {
    /// Starts a control plane for test `name` (unique within the test binary) with `options`.
    /// Blocking: from async code, call it in `spawn_blocking` or [`TestPlane::start_async`].
    pub fn start(name: &str, options: &Options) -> Result<TestPlane> {
        let dir = std::env::temp_dir().join(format!("swimlb-cp-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let plane = ControlPlane::start(&dir, Network::Loopback, options)?;
        Ok(TestPlane {
            plane: Some(plane),
            dir,
        })
    }

    /// The same, with swimlb's CRDs installed.
    pub fn start_with_crds(name: &str, options: &Options) -> Result<TestPlane> {
        let plane = TestPlane::start(name, options)?;
        plane.install_crds()?;
        Ok(plane)
    }

    /// Makes namespace `name`.
    pub fn create_namespace(&self, name: &str) -> Result<()> {
        self.admin().create(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
        }))?;
        Ok(())
    }

    /// [`TestPlane::start_with_crds`] from async code; panics with the reason when it fails,
    /// as a test would.
    pub async fn start_async(name: &str) -> TestPlane {
        let name = name.to_string();
        tokio::task::spawn_blocking(move || TestPlane::start_with_crds(&name, &Options::default()))
            .await
            .expect("starting the control plane")
            .unwrap_or_else(|e| panic!("the control plane: {e:#}"))
    }

    /// An async client as the administrator.
    pub async fn client(&self) -> kube::Client {
        client_from(&self.admin_kubeconfig())
            .await
            .unwrap_or_else(|e| panic!("the administrator's client: {e:#}"))
    }

    /// An async client as user `user` (in `system:masters`): the audit log tells its requests
    /// apart.
    pub async fn client_of(&self, user: &str) -> kube::Client {
        let path = self
            .user_kubeconfig(user)
            .unwrap_or_else(|e| panic!("a kubeconfig for {user}: {e:#}"));
        client_from(&path)
            .await
            .unwrap_or_else(|e| panic!("a client for {user}: {e:#}"))
    }

    /// Every request so far, from the API server's audit log.
    pub fn requests(&self) -> Vec<AuditRecord> {
        self.audit().expect("the audit log")
    }

    /// The test's folder.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

/// An async client from kubeconfig `path`.
pub async fn client_from(path: &Path) -> Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

impl Deref for TestPlane {
    type Target = ControlPlane;
    fn deref(&self) -> &ControlPlane {
        self.plane.as_ref().expect("running until drop")
    }
}

impl DerefMut for TestPlane {
    fn deref_mut(&mut self) -> &mut ControlPlane {
        self.plane.as_mut().expect("running until drop")
    }
}

impl Drop for TestPlane {
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        drop(self.plane.take());
        if failed {
            eprintln!("control plane files kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
