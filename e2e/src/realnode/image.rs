//! The images a real node runs, built here as OCI archives for `ctr images import` (no registry
//! is reachable): the project's `Containerfile` built by buildah as `e2e/tests/image.rs` builds
//! it, and the Pod sandboxes' `pause` image from the `pause` program `e2e/k8s/node/build.sh`
//! compiles. buildah works in a storage of its own under the given folder, removed on drop.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

/// Where the Containerfile's `libs` build context points (its header says so).
pub const LIBS: &str = "/usr/lib/x86_64-linux-gnu";
/// The binaries the project's image holds.
pub const BINARIES: [&str; 2] = ["swimlb-speaker", "swimlb-controller"];
/// The target the backend (`swimlb-echo`) is compiled for: static, so its image needs no libc.
pub const ECHO_TARGET: &str = "x86_64-unknown-linux-musl";

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `command`; its stdout, or an error with its stderr.
pub fn run(command: &mut Command) -> Result<String> {
    let shown = format!("{command:?}");
    let out = command
        .output()
        .with_context(|| format!("starting {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown}: {}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// buildah on a storage of its own in a folder, removed on drop.
#[derive(Debug)]
pub struct Builder {
    dir: PathBuf,
}

impl Builder {
    /// A storage in `dir` (made, emptied first).
    pub fn new(dir: &Path) -> Result<Builder> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
        Ok(Builder {
            dir: dir.to_path_buf(),
        })
    }

    fn buildah(&self) -> Command {
        let mut c = Command::new("buildah");
        c.arg(format!("--root={}", self.dir.join("storage").display()))
            .arg(format!("--runroot={}", self.dir.join("run").display()));
        c
    }

    /// The project's image from the `Containerfile`, with the binaries of `bin_dir`, tagged
    /// `tag`, as an OCI archive at `archive`.
    pub fn project_image(&self, bin_dir: &Path, tag: &str, archive: &Path) -> Result<()> {
        run(self
            .buildah()
            .args(["build", "--pull=never", "--layers=false", "--quiet"])
            .arg(format!("--build-context=bin={}", bin_dir.display()))
            .arg(format!("--build-context=libs={LIBS}"))
            .args(["--tag", tag, "--file"])
            .arg(repo().join("Containerfile"))
            .arg(repo()))?;
        self.export(tag, archive)
    }

    /// An image of `base` (an OCI archive holding one image, as [`Builder::project_image`]
    /// exports it) with `env` set in its configuration and nothing else changed (its layers the
    /// same, one empty layer on top), tagged `tag`, as an OCI archive at `archive`: the same
    /// binaries started with other environment variables, a second tag for a rolling update.
    pub fn env_layer(
        &self,
        base: &Path,
        env: &[(&str, &str)],
        tag: &str,
        archive: &Path,
    ) -> Result<()> {
        let container = run(self
            .buildah()
            .args(["from", "--pull=never", "--quiet"])
            .arg(format!("oci-archive:{}", base.display())))?;
        let container = container.trim();
        let mut config = self.buildah();
        config.arg("config");
        for (key, value) in env {
            config.args(["--env", &format!("{key}={value}")]);
        }
        run(config.arg(container))?;
        run(self.buildah().args(["commit", "--quiet", container, tag]))?;
        run(self.buildah().args(["rm", container]))?;
        self.export(tag, archive)
    }

    /// The `pause` image (the program at `/pause`, its entrypoint, run as nobody as upstream's
    /// is), tagged `tag`, as an OCI archive at `archive`.
    pub fn pause_image(&self, pause: &Path, tag: &str, archive: &Path) -> Result<()> {
        let container = run(self.buildah().args(["from", "scratch"]))?;
        let container = container.trim();
        run(self
            .buildah()
            .args(["copy", container])
            .arg(pause)
            .arg("/pause"))?;
        run(self.buildah().args([
            "config",
            "--entrypoint",
            r#"["/pause"]"#,
            "--user",
            "65535:65535",
            container,
        ]))?;
        run(self.buildah().args(["commit", "--quiet", container, tag]))?;
        run(self.buildah().args(["rm", container]))?;
        self.export(tag, archive)
    }

    /// The backend image: `e2e/backend/echo.rs` compiled by `rustc` alone for the musl target
    /// (static, no dependency: a second or two, where a crate of the workspace would compile its
    /// dependencies for musl first), at `/swimlb-echo`, its entrypoint, run as nobody; tagged
    /// `tag`, as an OCI archive at `archive`.
    pub fn echo_image(&self, tag: &str, archive: &Path) -> Result<()> {
        let program = self.dir.join("swimlb-echo");
        run(Command::new("rustc")
            .args(["--edition", "2021", "-O", "--target", ECHO_TARGET, "-o"])
            .arg(&program)
            .arg(repo().join("e2e/backend/echo.rs")))
        .with_context(|| format!("compiling the backend (needs rustup's {ECHO_TARGET} target)"))?;
        let container = run(self.buildah().args(["from", "scratch"]))?;
        let container = container.trim();
        run(self
            .buildah()
            .args(["copy", container])
            .arg(&program)
            .arg("/swimlb-echo"))?;
        run(self.buildah().args([
            "config",
            "--entrypoint",
            r#"["/swimlb-echo"]"#,
            "--user",
            "65534:65534",
            "--port",
            "8080",
            container,
        ]))?;
        run(self.buildah().args(["commit", "--quiet", container, tag]))?;
        run(self.buildah().args(["rm", container]))?;
        self.export(tag, archive)
    }

    /// An image of `files` ((path, name in the image's root)), its entrypoint `/entry`, run as
    /// `user` when given; tagged `tag`, as an OCI archive at `archive`.
    pub fn program_image(
        &self,
        files: &[(&Path, &str)],
        entry: &str,
        user: Option<&str>,
        tag: &str,
        archive: &Path,
    ) -> Result<()> {
        let container = run(self.buildah().args(["from", "scratch"]))?;
        let container = container.trim();
        for (path, name) in files {
            run(self
                .buildah()
                .args(["copy", container])
                .arg(path)
                .arg(format!("/{name}")))?;
        }
        let mut config = self.buildah();
        config.args(["config", "--entrypoint", &format!(r#"["/{entry}"]"#)]);
        if let Some(user) = user {
            config.args(["--user", user]);
        }
        run(config.arg(container))?;
        run(self.buildah().args(["commit", "--quiet", container, tag]))?;
        run(self.buildah().args(["rm", container]))?;
        self.export(tag, archive)
    }

    fn export(&self, tag: &str, archive: &Path) -> Result<()> {
        let _ = std::fs::remove_file(archive);
        run(self
            .buildah()
            .args(["push", "--quiet", tag])
            .arg(format!("oci-archive:{}:{tag}", archive.display())))?;
        Ok(())
    }
}

impl Drop for Builder {
    fn drop(&mut self) {
        let _ = self.buildah().args(["rmi", "--all", "--force"]).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Builds [`BINARIES`] with cargo's profile `profile` (`debug`, `release` or a custom one)
/// and returns the folder that holds them. Without the variables cargo set for a test that
/// calls this (a different CARGO_MANIFEST_DIR rebuilds half the tree).
pub fn cargo_build(profile: &str) -> Result<PathBuf> {
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let prefixes = [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_BIN_",
            "CARGO_CRATE_",
            "CARGO_PRIMARY_",
        ];
        if prefixes.iter().any(|p| key.starts_with(p))
            || key == "CARGO_TARGET_TMPDIR"
            || key == "CARGO_RUSTC_CURRENT_DIR"
        {
            cargo.env_remove(&*key);
        }
    }
    cargo
        .current_dir(repo())
        .args(["build", "--locked", "--message-format=json"])
        .args(["-p", "swimlb-speaker", "-p", "swimlb-controller"]);
    for bin in BINARIES {
        cargo.args(["--bin", bin]);
    }
    match profile {
        "debug" => {}
        "release" => {
            cargo.arg("--release");
        }
        other => {
            cargo.args(["--profile", other]);
        }
    }
    let out = run(&mut cargo)?;
    let mut dirs = Vec::new();
    for line in out.lines() {
        let Ok(message) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if message["reason"] == "compiler-artifact"
            && message["target"]["name"]
                .as_str()
                .is_some_and(|n| BINARIES.contains(&n))
            && let Some(path) = message["executable"].as_str()
        {
            dirs.push(Path::new(path).parent().map(Path::to_path_buf));
        }
    }
    dirs.dedup();
    match dirs.as_slice() {
        [Some(dir)] if dirs.len() == 1 => Ok(dir.clone()),
        _ => bail!("cargo built {BINARIES:?} into one folder, not {dirs:?}"),
    }
}

/// The cargo profile folder this program runs from (`target/<profile>/deps/NAME-HASH` for a
/// test, `target/<profile>/NAME` for a binary).
pub fn profile_of_current_exe() -> Result<String> {
    let exe = std::env::current_exe()?;
    // A test runs from target/<profile>/deps, a binary (swimlb-lab) from target/<profile>.
    let mut dir = exe.parent();
    if dir.and_then(Path::file_name) == Some(OsStr::new("deps")) {
        dir = dir.and_then(Path::parent);
    }
    dir.and_then(Path::file_name)
        .and_then(OsStr::to_str)
        .map(str::to_string)
        .context("the program runs from target/<profile> or target/<profile>/deps")
}
