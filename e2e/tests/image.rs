//! The container image (issue 14): the repository's `Containerfile` built by buildah from
//! `scratch`, pulling nothing, and `--version` of both binaries run in it by podman. Root only:
//! the test is `#[ignore = "needs root: ..."]` and runs with `--include-ignored` (as
//! `sudo ./test.sh` does).
//!
//! The test builds the two binaries itself (`cargo build` of the profile it was built with:
//! fresh after `cargo test` compiled them, about 30 s the first time), so it depends on no other
//! test. buildah and podman work in a storage of their own (`--root`, `--runroot`, `--tmpdir`
//! in a temporary directory, removed at the end, panics included): the machine's images are
//! neither seen nor touched, and nothing is left behind.
//!
//! What `podman run` needs on these machines, found here and passed as flags:
//! - `--runtime runc`: crun 1.8 (Debian 12's default runtime) refuses to start any container on
//!   a hybrid cgroup layout ("cgroups in hybrid mode not supported, drop all controllers from
//!   cgroupv2"): cgroup v1 controllers plus a cgroup2 hierarchy at /sys/fs/cgroup/unified with
//!   `hugetlb` enabled. runc 1.1 starts them.
//! - `--ulimit nofile=1024:1024 --ulimit nproc=1024:1024`: podman asks the runtime for its
//!   default limits (1048576 open files, and processes above podman's own 32768), and raising a
//!   hard limit needs CAP_SYS_RESOURCE, which root lacks in these VMs (setrlimit: EPERM).
//!   Lowering needs nothing.
//! - `--network none`: `--version` needs no network, and no CNI bridge is set up.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use swimlb_e2e::netns;

/// The version every binary of the workspace carries.
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The binaries the image holds, at `/usr/local/bin/`.
use swimlb_e2e::realnode::image::{self, BINARIES};
/// Where the Containerfile's `libs` build context points (its header says so).
const LIBS: &str = "/usr/lib/x86_64-linux-gnu";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `command`, returning its output; panics, naming it, when it cannot start or fails.
fn run(command: &mut Command) -> Output {
    let shown = format!("{command:?}");
    let out = command.output().unwrap_or_else(|e| panic!("{shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    out
}

/// Builds [`BINARIES`] with the profile this test was built with (the real nodes' builder,
/// [`image::cargo_build`]); their paths by name.
fn build_binaries() -> BTreeMap<String, PathBuf> {
    let profile = image::profile_of_current_exe().expect("the profile this test runs from");
    let dir = image::cargo_build(&profile).unwrap_or_else(|e| panic!("{e:#}"));
    let built: BTreeMap<String, PathBuf> = BINARIES
        .iter()
        .map(|b| (b.to_string(), dir.join(b)))
        .collect();
    for (name, path) in &built {
        assert!(path.is_file(), "cargo built {name} at {}", path.display());
    }
    built
}

/// The files `ldd` says `binary` loads, as the paths the loader opens (the kernel's vDSO left
/// out). Panics on a library `ldd` cannot find.
fn ldd(binary: &Path) -> BTreeSet<String> {
    let out = run(Command::new("ldd").arg(binary));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut files = BTreeSet::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        assert!(!line.contains("not found"), "{}: {line}", binary.display());
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or
        // `/lib64/ld-linux-x86-64.so.2 (0x...)` or `linux-vdso.so.1 (0x...)`.
        let path = match line.split_once(" => ") {
            Some((_, resolved)) => resolved.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            files.insert(path.to_string());
        }
    }
    files
}

/// The Containerfile's `COPY --from=CONTEXT` instructions: (source in the context, path in the
/// image) for every file they copy.
fn copies(containerfile: &str, context: &str) -> Vec<(String, String)> {
    let flag = format!("--from={context}");
    let mut out = Vec::new();
    for line in containerfile.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() < 4 || words[0] != "COPY" || words[1] != flag {
            continue;
        }
        let (dest, sources) = words[2..].split_last().expect("a source and a destination");
        for source in sources {
            let path = match dest.ends_with('/') {
                true => format!("{dest}{source}"),
                false => (*dest).to_string(),
            };
            out.push(((*source).to_string(), path));
        }
    }
    out
}

/// The objects of `deploy/swimlb.yaml`.
fn install_objects() -> Vec<Value> {
    let path = repo().join("deploy/swimlb.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/swimlb.yaml");
    text.split("\n---\n")
        .filter(|doc| {
            doc.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#') && l != "---")
        })
        .map(|doc| {
            serde_saphyr::from_str(doc)
                .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
        })
        .collect()
}

/// buildah and podman on a storage of their own, removed on drop.
struct Store {
    dir: PathBuf,
}

impl Store {
    fn new() -> Store {
        // Short: podman refuses a runroot longer than 50 characters (its sockets live there).
        let dir = std::env::temp_dir().join(format!("swimlb-image-{}", std::process::id()));
        // Left by a killed run of a process with the same id, if anything.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the storage directory");
        Store { dir }
    }

    fn storage_args(&self) -> Vec<String> {
        vec![
            format!("--root={}", self.dir.join("storage").display()),
            format!("--runroot={}", self.dir.join("run").display()),
        ]
    }

    fn buildah(&self) -> Command {
        let mut c = Command::new("buildah");
        c.args(self.storage_args());
        c
    }

    fn podman(&self) -> Command {
        let mut c = Command::new("podman");
        c.args(self.storage_args())
            .arg(format!("--tmpdir={}", self.dir.join("libpod").display()))
            .args(["--events-backend=none", "--cgroup-manager=cgroupfs"]);
        c
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Containers are run with --rm; what may be left is the image, mounted or not.
        let _ = self.podman().args(["image", "unmount", "--all"]).output();
        let _ = self.podman().args(["rmi", "--all", "--force"]).output();
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("image test: removing {}: {e}", self.dir.display());
        }
    }
}

/// Every file under `root`, as absolute paths inside it.
fn files_under(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let inside = path.strip_prefix(root).expect("under the root");
                out.insert(format!("/{}", inside.display()));
            }
        }
    }
    out
}

#[test]
#[ignore = "needs root: buildah/podman"]
fn the_image_holds_both_binaries_with_their_libraries_and_runs_them() {
    assert!(
        netns::is_root(),
        "the image test needs root: buildah and podman build and run the image in a storage of \
         their own, as root; run it as root (sudo ./test.sh runs every root test with \
         --include-ignored)"
    );
    for tool in ["buildah", "podman", "runc", "ldd"] {
        assert!(
            Command::new(tool).arg("--version").output().is_ok(),
            "{tool} is missing: install Debian's buildah, podman and runc (sudo ./test.sh does)"
        );
    }
    let binaries = build_binaries();
    let bin_dir = binaries[BINARIES[0]].parent().expect("a directory");
    assert!(
        binaries.values().all(|p| p.parent() == Some(bin_dir)),
        "both binaries in one directory: {binaries:?}"
    );

    // The libraries: exactly what ldd lists, each copied from the file the loader opens.
    let containerfile =
        std::fs::read_to_string(repo().join("Containerfile")).expect("the Containerfile");
    let libraries = copies(&containerfile, "libs");
    let needed: BTreeSet<String> = binaries.values().flat_map(|b| ldd(b)).collect();
    let copied: BTreeSet<String> = libraries.iter().map(|(_, to)| to.clone()).collect();
    assert_eq!(
        copied, needed,
        "the Containerfile's libraries (left) are what ldd lists for the binaries (right)"
    );
    for (source, to) in &libraries {
        let ours = std::fs::canonicalize(Path::new(LIBS).join(source))
            .unwrap_or_else(|e| panic!("{LIBS}/{source}: {e}"));
        let loaded = std::fs::canonicalize(to).unwrap_or_else(|e| panic!("{to}: {e}"));
        assert_eq!(
            ours, loaded,
            "{source} is the file the loader opens as {to}"
        );
    }
    let programs: BTreeSet<String> = copies(&containerfile, "bin")
        .into_iter()
        .map(|(_, to)| to)
        .collect();
    assert_eq!(
        programs,
        BINARIES
            .iter()
            .map(|b| format!("/usr/local/bin/{b}"))
            .collect(),
        "the binaries' place in the image"
    );

    // Build: from scratch, pulling nothing, one layer.
    let store = Store::new();
    let tag = format!(
        "localhost/swimlb-image-test-{}:{VERSION}",
        std::process::id()
    );
    let started = tokio::time::Instant::now();
    run(store
        .buildah()
        .args(["build", "--pull=never", "--layers=false", "--quiet"])
        .arg(format!("--build-context=bin={}", bin_dir.display()))
        .arg(format!("--build-context=libs={LIBS}"))
        .args(["--tag", tag.as_str(), "--file"])
        .arg(repo().join("Containerfile"))
        .arg(repo()));
    eprintln!("image built in {:.1} s", started.elapsed().as_secs_f64());

    // Its configuration: no entrypoint, not root, the binaries on the PATH.
    let inspect = run(store.podman().args(["image", "inspect", &tag]));
    let inspect: Value = serde_json::from_slice(&inspect.stdout).expect("inspect's JSON");
    let config = &inspect[0]["Config"];
    assert_eq!(config["User"], "65532:65532", "{config}");
    assert!(
        config["Entrypoint"].as_array().is_none_or(|e| e.is_empty()),
        "{config}"
    );
    assert!(
        config["Env"]
            .as_array()
            .is_some_and(|env| env.iter().any(|e| e == "PATH=/usr/local/bin")),
        "{config}"
    );
    assert_eq!(
        inspect[0]["RootFS"]["Layers"].as_array().map(Vec::len),
        Some(1),
        "one layer, no base"
    );

    // Its files: the binaries and their libraries, nothing else.
    let mount = run(store.podman().args(["image", "mount", &tag]));
    let root = PathBuf::from(String::from_utf8_lossy(&mount.stdout).trim());
    let files = files_under(&root);
    run(store.podman().args(["image", "unmount", &tag]));
    let expected: BTreeSet<String> = copied.iter().chain(&programs).cloned().collect();
    assert_eq!(files, expected, "the image's files");

    // Run: each binary as its Pod in deploy/swimlb.yaml names it, with the Pod's user.
    let objects = install_objects();
    for (kind, name, container, binary) in [
        ("DaemonSet", "swimlb-speaker", "speaker", "swimlb-speaker"),
        (
            "Deployment",
            "swimlb-controller",
            "controller",
            "swimlb-controller",
        ),
    ] {
        let object = objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in deploy/swimlb.yaml"));
        let pod = &object["spec"]["template"]["spec"];
        let spec = pod["containers"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == container))
            .unwrap_or_else(|| panic!("no container {container} in {kind} {name}"));
        assert_eq!(
            spec["image"],
            format!("localhost/swimlb/swimlb:{VERSION}"),
            "{kind} {name}: the image the Containerfile's header tags"
        );
        let command = spec["command"][0].as_str().expect("a command");
        assert_eq!(command, format!("/usr/local/bin/{binary}"), "{kind} {name}");
        let user = spec["securityContext"]["runAsUser"]
            .as_u64()
            .or_else(|| pod["securityContext"]["runAsUser"].as_u64())
            .expect("a user");
        let out = run(store
            .podman()
            .args([
                "run",
                "--rm",
                "--pull=never",
                "--runtime=runc",
                "--network=none",
            ])
            .args(["--ulimit=nofile=1024:1024", "--ulimit=nproc=1024:1024"])
            .arg(format!("--user={user}"))
            .arg(format!("--entrypoint={command}"))
            .args([tag.as_str(), "--version"]));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{binary} {VERSION}"),
            "{kind} {name}: `{command} --version` in the image"
        );
    }
    // And by name, as the image's PATH finds it, with the image's own user.
    for binary in BINARIES {
        let out = run(store
            .podman()
            .args([
                "run",
                "--rm",
                "--pull=never",
                "--runtime=runc",
                "--network=none",
            ])
            .args(["--ulimit=nofile=1024:1024", "--ulimit=nproc=1024:1024"])
            .args([tag.as_str(), binary, "--version"]));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{binary} {VERSION}")
        );
    }
    eprintln!(
        "image built and run in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
