//! The standalone speaker's Debian package (`[package.metadata.deb]` in speaker/Cargo.toml,
//! deploy/debian/, deploy/standalone/), built as the book tells a user to build it:
//! `cargo deb -p swimlb-speaker` (a release build of the speaker, reused by cargo afterwards;
//! cargo-deb refuses the dev profile).
//!
//! - its files are where the unit and the book say, with their modes, nothing under /etc; the
//!   binary is stripped, its symbols in the `-dbgsym` package beside it;
//! - its control fields (version, section, priority, dependencies) and its Debian changelog carry
//!   the workspace's version;
//! - lintian finds no error and no warning but the overrides the package carries
//!   (deploy/debian/lintian-overrides, each with its reason), and every override is used;
//! - as root: `dpkg -i` installs it into a copy-on-write view of this machine's own root (an
//!   overlay over `/` in a mount namespace of the test, under `chroot`), where the installed
//!   binary prints the version, the unit verifies with its real `ExecStart`, /etc/swimlb is
//!   made mode 0700, the service is neither enabled nor started, and `dpkg --purge` removes the
//!   package but keeps what the administrator wrote. Nothing reaches the machine itself: the
//!   namespace's mounts and the overlay's writes go when the test ends, panics included.
//!
//! And the static build of the book's page "Standalone": `--target x86_64-unknown-linux-musl`
//! gives one statically linked binary, which runs. That one (`release_musl_...`) is a release
//! step, run on demand (docs/src/development/release.md), not by `test.sh`: a build of the whole
//! tree for a second target costs CI about five minutes.
//!
//! `cargo-deb` is found in `$SWIMLB_CARGO_DEB`, else on the `PATH`; `test.sh` installs the
//! pinned version, and lintian, as root. Without them these tests fail and say so.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use swimlb_e2e::netns;

/// The version every crate of the workspace carries; the package's is this with revision 1.
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `command`, returning its output; panics, naming it, when it cannot start.
fn output(command: &mut Command) -> Output {
    let shown = format!("{command:?}");
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"))
}

/// Runs `command`, returning its stdout; panics, naming it, when it fails.
fn run(command: &mut Command) -> String {
    let shown = format!("{command:?}");
    let out = output(command);
    assert!(
        out.status.success(),
        "{shown}: {}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout).trim(),
        text(&out.stderr).trim()
    );
    text(&out.stdout)
}

fn cargo_deb() -> PathBuf {
    std::env::var_os("SWIMLB_CARGO_DEB").map_or_else(|| PathBuf::from("cargo-deb"), PathBuf::from)
}

/// The package, built once per test binary into a folder of its own.
fn package() -> &'static Path {
    static DEB: OnceLock<PathBuf> = OnceLock::new();
    DEB.get_or_init(build_package)
}

/// `program` (cargo, or cargo-deb, which builds with the cargo that runs this test: `CARGO`) run
/// from the repository without what cargo set for this test (its package, its paths): ring's
/// build script tracks CARGO_MANIFEST_DIR, and a different value rebuilds half the tree.
fn build_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(program);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_BIN_",
            "CARGO_CRATE_",
            "CARGO_PRIMARY_",
        ]
        .iter()
        .any(|p| key.starts_with(p))
            || key == "CARGO_TARGET_TMPDIR"
            || key == "CARGO_RUSTC_CURRENT_DIR"
        {
            command.env_remove(&*key);
        }
    }
    command.current_dir(repo());
    command
}

fn build_package() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    // The packages of earlier runs (20 MB each).
    for entry in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with("deb-") {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let dir = tmp.join(format!("deb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("package folder");
    let mut command = build_command(cargo_deb());
    command
        .args(["-p", "swimlb-speaker", "--locked", "--output"])
        .arg(&dir);
    let shown = format!("{command:?}");
    let out = command.output().unwrap_or_else(|e| {
        panic!("cannot run {shown} ({e}): install cargo-deb (test.sh does) or set SWIMLB_CARGO_DEB")
    });
    assert!(
        out.status.success(),
        "{shown}: {}\n{}",
        out.status,
        text(&out.stderr)
    );
    let debs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("package folder")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    assert_eq!(debs.len(), 1, "one .deb in {}: {debs:?}", dir.display());
    debs.into_iter().next().expect("one")
}

#[test]
fn the_binary_is_stripped_and_its_symbols_are_in_the_dbgsym_package() {
    let deb = package();
    let ddeb = deb.with_file_name(format!("swimlb-speaker-dbgsym_{VERSION}-1_amd64.ddeb"));
    let symbols = contents(&ddeb);
    assert!(
        symbols
            .iter()
            .any(|(_, p)| p.starts_with("/usr/lib/debug/.build-id/") && p.ends_with(".debug")),
        "{symbols:#?}"
    );
    let dir = deb.with_file_name("unpacked");
    let _ = std::fs::remove_dir_all(&dir);
    run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&dir));
    let file = run(Command::new("file").arg(dir.join("usr/bin/swimlb-speaker")));
    assert!(file.contains(", stripped"), "{file}");
}

/// `dpkg-deb --contents`: (mode string, path without the leading `.`) of every entry.
fn contents(deb: &Path) -> Vec<(String, String)> {
    run(Command::new("dpkg-deb").arg("--contents").arg(deb))
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let path = fields.get(5).unwrap_or_else(|| panic!("entry {line:?}"));
            (
                fields[0].to_string(),
                path.trim_start_matches('.').to_string(),
            )
        })
        .collect()
}

#[test]
fn the_package_puts_the_binary_where_the_unit_runs_it_and_nothing_under_etc() {
    let entries = contents(package());
    for (path, mode) in [
        ("/usr/bin/swimlb-speaker", "-rwxr-xr-x"),
        (
            "/usr/lib/systemd/system/swimlb-speaker.service",
            "-rw-r--r--",
        ),
        ("/usr/lib/modules-load.d/swimlb.conf", "-rw-r--r--"),
        (
            "/usr/share/doc/swimlb-speaker/examples/speaker.yaml",
            "-rw-r--r--",
        ),
        (
            "/usr/share/doc/swimlb-speaker/examples/notify.sh",
            "-rw-r--r--",
        ),
        (
            "/usr/share/doc/swimlb-speaker/examples/swimlb.nft",
            "-rw-r--r--",
        ),
        ("/usr/share/doc/swimlb-speaker/copyright", "-rw-r--r--"),
        (
            "/usr/share/doc/swimlb-speaker/changelog.Debian.gz",
            "-rw-r--r--",
        ),
        ("/usr/share/lintian/overrides/swimlb-speaker", "-rw-r--r--"),
    ] {
        let found = entries.iter().find(|(_, p)| p == path);
        assert_eq!(
            found.map(|(m, _)| m.as_str()),
            Some(mode),
            "{path} in the package: {entries:#?}"
        );
    }
    let under_etc: Vec<&String> = entries
        .iter()
        .map(|(_, p)| p)
        .filter(|p| p.starts_with("/etc/"))
        .collect();
    assert!(
        under_etc.is_empty(),
        "the administrator writes /etc/swimlb: {under_etc:?}"
    );
    // The packaged files are the repository's.
    let unit = std::fs::read_to_string(repo().join("deploy/standalone/swimlb-speaker.service"))
        .expect("unit");
    let exec_start: Vec<&str> = unit
        .lines()
        .filter_map(|l| {
            l.strip_prefix("ExecStart=")
                .or(l.strip_prefix("ExecStartPre="))
        })
        .map(|l| l.split_whitespace().next().expect("a program"))
        .collect();
    assert_eq!(
        exec_start,
        ["/usr/bin/swimlb-speaker", "/usr/bin/swimlb-speaker"],
        "the unit runs the packaged binary"
    );
}

#[test]
fn the_control_fields_carry_the_workspace_version_and_the_dependencies_dpkg_found() {
    let fields = run(Command::new("dpkg-deb")
        .arg("--field")
        .arg(package())
        .args(["Package", "Version", "Section", "Priority", "Depends"]));
    let field = |name: &str| {
        fields
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} in {fields}"))
            .to_string()
    };
    assert_eq!(field("Package"), "swimlb-speaker");
    assert_eq!(field("Version"), format!("{VERSION}-1"));
    assert_eq!(field("Section"), "net");
    assert_eq!(field("Priority"), "optional");
    // From dpkg-shlibdeps: the binary links glibc alone.
    let depends = field("Depends");
    assert!(depends.starts_with("libc6 (>= 2."), "{depends}");
}

#[test]
fn the_debian_changelog_names_the_workspace_version() {
    let changelog =
        std::fs::read_to_string(repo().join("deploy/debian/changelog")).expect("changelog");
    let first = changelog.lines().next().unwrap_or_default();
    assert_eq!(
        first,
        format!("swimlb-speaker ({VERSION}-1) unstable; urgency=medium"),
        "deploy/debian/changelog opens with the release (the book's page Releasing)"
    );
}

#[test]
fn every_lintian_override_says_why() {
    let overrides =
        std::fs::read_to_string(repo().join("deploy/debian/lintian-overrides")).expect("overrides");
    let mut reason = false;
    for line in overrides.lines() {
        if line.starts_with('#') {
            reason = true;
        } else if line.trim().is_empty() {
            reason = false;
        } else {
            assert!(reason, "override without a `#` reason above it: {line}");
        }
    }
}

#[test]
fn lintian_finds_no_error_and_no_warning_and_uses_every_override() {
    let out = output(
        Command::new("lintian")
            .args(["--info", "--fail-on", "error,warning"])
            .arg(package()),
    );
    let report = text(&out.stdout);
    assert!(
        out.status.success(),
        "lintian ({}; test.sh installs it as root):\n{report}{}",
        out.status,
        text(&out.stderr)
    );
    let unused: Vec<&str> = report
        .lines()
        .filter(|l| l.contains("unused-override") || l.contains("mismatched-override"))
        .collect();
    assert!(
        unused.is_empty(),
        "overrides lintian did not need: {unused:?}"
    );
}

/// Installs, checks and purges the package inside a mount namespace: `/` under an overlay whose
/// upper layer is `$1/upper`, `chroot`ed into. Prints `key: value` lines.
const INSTALL: &str = r#"
set -eu
d=$1
mount -t overlay overlay -o "lowerdir=/,upperdir=$d/upper,workdir=$d/work" "$d/root"
mount -t proc proc "$d/root/proc"
mount --rbind /dev "$d/root/dev"
cp "$2" "$d/root/tmp/swimlb-speaker.deb"
exec chroot "$d/root" sh -euc '
  # A fresh host: no swimlb of an earlier install or of the lab (in the overlay only).
  dpkg --purge swimlb-speaker >/dev/null 2>&1 || true
  rm -rf /etc/swimlb
  dpkg -i /tmp/swimlb-speaker.deb >/dev/null
  echo "version: $(/usr/bin/swimlb-speaker --version)"
  echo "etc: $(stat -c "%a %U" /etc/swimlb)"
  echo "enabled: $(systemctl is-enabled swimlb-speaker.service || true)"
  echo "running: $(test -d /run/systemd/system && echo yes || echo no)"
  echo "modules: $(grep -v "^#" /usr/lib/modules-load.d/swimlb.conf)"
  systemd-analyze verify /usr/lib/systemd/system/swimlb-speaker.service
  echo "verified: yes"
  (umask 077 && swimlb-speaker keygen > /etc/swimlb/keys)
  dpkg --purge swimlb-speaker >/dev/null
  echo "purged binary: $(test -e /usr/bin/swimlb-speaker && echo left || echo gone)"
  echo "purged unit: $(test -e /usr/lib/systemd/system/swimlb-speaker.service && echo left || echo gone)"
  echo "kept: $(ls /etc/swimlb)"
  rm /etc/swimlb/keys
  dpkg -i /tmp/swimlb-speaker.deb >/dev/null
  dpkg --purge swimlb-speaker >/dev/null
  echo "empty purged: $(test -e /etc/swimlb && echo left || echo gone)"
'
"#;

#[test]
#[ignore = "needs root: a mount namespace, an overlay over / and chroot, to run dpkg -i"]
fn dpkg_installs_it_disabled_with_etc_swimlb_0700_and_purges_it_keeping_the_admins_files() {
    assert!(netns::is_root(), "run as root (sudo ./test.sh)");
    let deb = package();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("dpkg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["upper", "work", "root"] {
        std::fs::create_dir_all(dir.join(sub)).expect("overlay folders");
    }
    let out = output(
        Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                INSTALL,
                "sh",
            ])
            .arg(&dir)
            .arg(deb),
    );
    // The namespace is gone, and its mounts with it: only the overlay's folders are left.
    let _ = std::fs::remove_dir_all(&dir);
    let report = text(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{report}{}",
        out.status,
        text(&out.stderr)
    );
    let value = |key: &str| {
        report
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}: ")))
            .unwrap_or_else(|| panic!("no {key} in {report}"))
    };
    assert_eq!(value("version"), format!("swimlb-speaker {VERSION}"));
    assert_eq!(value("etc"), "700 root");
    assert_eq!(value("enabled"), "disabled", "{report}");
    assert_eq!(
        value("running"),
        "no",
        "the chroot saw the machine's systemd: the maintainer scripts would have told it"
    );
    assert_eq!(value("modules"), "dummy");
    assert_eq!(value("verified"), "yes");
    assert_eq!(value("purged binary"), "gone");
    assert_eq!(value("purged unit"), "gone");
    assert_eq!(
        value("kept"),
        "keys",
        "purge keeps the administrator's files"
    );
    assert_eq!(
        value("empty purged"),
        "gone",
        "purge removes an empty /etc/swimlb"
    );
}

/// The static build of the book's page "Standalone": the musl target, whose C parts (ring's) need
/// `musl-gcc` (Debian's musl-tools) and whose Rust side is rustup's `x86_64-unknown-linux-musl`
/// target (the release page says how to add both).
const MUSL: &str = "x86_64-unknown-linux-musl";

#[test]
#[ignore = "a release step, on demand: cargo test -p swimlb-e2e --test package -- --ignored release_"]
fn release_musl_build_is_one_static_binary_that_runs() {
    let out = output(build_command(env!("CARGO")).args([
        "build",
        "--release",
        "--locked",
        "-p",
        "swimlb-speaker",
        "--bin",
        "swimlb-speaker",
        "--target",
        MUSL,
    ]));
    assert!(
        out.status.success(),
        "cargo build --target {MUSL} (`rustup target add x86_64-unknown-linux-musl` and Debian's musl-tools first): \
         {}\n{}",
        out.status,
        text(&out.stderr)
    );
    let binary = repo().join(format!("target/{MUSL}/release/swimlb-speaker"));
    let file = run(Command::new("file").arg(&binary));
    assert!(
        file.contains("static-pie linked") || file.contains("statically linked"),
        "{file}"
    );
    // ldd exits 1 on a static binary: its words are the check.
    let ldd = output(Command::new("ldd").arg(&binary));
    let said = format!("{}{}", text(&ldd.stdout), text(&ldd.stderr));
    assert!(
        said.contains("statically linked") || said.contains("not a dynamic executable"),
        "ldd: {said}"
    );
    assert_eq!(
        run(Command::new(&binary).arg("--version")).trim(),
        format!("swimlb-speaker {VERSION}")
    );
    // keygen reads the kernel's random source through musl: one base64 key of 32 bytes.
    let key = run(Command::new(&binary).arg("keygen"));
    assert_eq!(key.trim_end().len(), 44, "{key:?}");
}
