//! Real `kubectl`, as an operator runs it: the pinned release the control plane was built with
//! (`$SWIMLB_K8S_BIN/kubectl`), or the one from `PATH`
//! (Debian's `kubernetes-client`, which test.sh installs, or any other).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

use crate::netns::command_in;

/// The pinned release's `kubectl` (`$SWIMLB_K8S_BIN/kubectl`, the control plane's own build)
/// when there is one, else `kubectl` from `PATH`, or an error that says how to install it.
pub fn path() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SWIMLB_K8S_BIN") {
        let pinned = PathBuf::from(dir).join("kubectl");
        if pinned.is_file() {
            return Ok(pinned);
        }
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file())
        .context(
            "kubectl is not on PATH: apt-get install kubernetes-client (Debian's kubectl; \
             test.sh installs it as root)",
        )
}

/// The minor version of the kubectl client.
pub fn minor(kubectl: &Path) -> Result<u32> {
    let out = Command::new(kubectl)
        .args(["version", "--client", "--output", "json"])
        .output()
        .context("running kubectl version")?;
    let version: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "kubectl version --client -o json: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    let minor = version["clientVersion"]["minor"]
        .as_str()
        .unwrap_or_default();
    minor
        .trim_end_matches('+')
        .parse()
        .with_context(|| format!("kubectl's minor version {minor:?}"))
}

/// The flags `kubectl apply` needs against the fake API server: a kubectl older than 1.25
/// (Debian bookworm's kubernetes-client is 1.20) validates on the client from the OpenAPI v2
/// schema, which the fake server does not serve, so it gets `--validate=false`; a newer one asks
/// the server to validate (`/openapi/v3`, `fieldValidation`), as against a real cluster.
pub fn apply_flags(minor: u32) -> &'static [&'static str] {
    if minor < 25 {
        &["--validate=false"]
    } else {
        &[]
    }
}

/// What `kubectl apply` applies.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// A manifest file (`-f FILE`).
    File(&'a Path),
    /// Manifests given on standard input (`-f -`), as an operator pastes them.
    Text(&'a str),
}

/// `kubectl` run from network namespace `netns` (or this one) with `kubeconfig` and its
/// discovery cache in `cache`.
#[derive(Debug, Clone)]
pub struct Kubectl {
    /// The program (`None`: [`path`]).
    program: Option<PathBuf>,
    netns: Option<String>,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    /// kubectl against the server of `kubeconfig`, from `netns` when given.
    pub fn new(netns: Option<&str>, kubeconfig: &Path, cache: &Path) -> Kubectl {
        Kubectl {
            program: None,
            netns: netns.map(str::to_string),
            kubeconfig: kubeconfig.to_path_buf(),
            cache: cache.to_path_buf(),
        }
    }

    /// The same with `program` as kubectl.
    pub fn with_program(mut self, program: PathBuf) -> Kubectl {
        self.program = Some(program);
        self
    }

    fn program(&self) -> Result<PathBuf> {
        match &self.program {
            Some(program) => Ok(program.clone()),
            None => path(),
        }
    }

    /// Runs `kubectl ARGS` (with `stdin` on its standard input); its standard output, or an
    /// error with its output and exit status.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let kubectl = self.program()?;
        let kubectl = kubectl.to_string_lossy();
        let mut cmd = match &self.netns {
            Some(netns) => command_in(netns, &kubectl),
            None => Command::new(kubectl.as_ref()),
        };
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().context("running kubectl")?;
        if let Some(text) = stdin {
            child
                .stdin
                .take()
                .context("kubectl's stdin")?
                .write_all(text.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "kubectl {} ({}):\n{stdout}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(stdout)
    }

    /// `kubectl apply --server-side -f FILE` (or `-f -`); its output.
    pub fn apply(&self, source: Source<'_>) -> Result<String> {
        let minor = minor(&self.program()?)?;
        let mut args = vec!["apply", "--server-side"];
        args.extend_from_slice(apply_flags(minor));
        match source {
            Source::File(file) => {
                let file = file.to_str().context("a manifest path that is not UTF-8")?;
                args.extend(["-f", file]);
                self.run(&args, None)
            }
            Source::Text(text) => {
                args.extend(["-f", "-"]);
                self.run(&args, Some(text))
            }
        }
    }
}
