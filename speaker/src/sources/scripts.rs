//! The programs the standalone speaker runs, exec checks and notify hooks: keepalived's
//! `enable_script_security` and `script_user`, always on.
//!
//! - [`vet`], when a file is loaded (start-up, SIGHUP, `check-config`), resolves each program (a
//!   name without `/` is looked up in [`SCRIPT_PATH`], never in the speaker's own `PATH`),
//!   refuses one any of whose path components another user could write ([`unsafe_component`]),
//!   resolves the users the programs run as, and returns the file with each program's resolved
//!   path: what was checked is what runs. The daemon ([`vet_to_run`]) also makes sure it may
//!   switch to those users.
//! - [`run`] starts one program, after checking its path again (a directory made writable since
//!   the load is caught before the next run, not at the next reload): with an empty environment
//!   but `PATH` ([`SCRIPT_PATH`]), stdin from `/dev/null`, in a process group of its own, as its
//!   user (that uid and the group's gid; no supplementary groups: std's `Command::uid` drops them
//!   and setting the user's own would need `unsafe` code in the child). On its timeout, and when
//!   the run is abandoned (a reload, the exit deadline), the whole process group is killed, so a
//!   program's own children die with it; then the child is reaped.
//!
//! The rule of a path component (keepalived's): it is unsafe when owned by a user other than
//! root, or writable by its group or by others, unless it is a directory with the sticky bit
//! (`/tmp`: nobody may replace another's file there). A speaker not running as root also
//! trusts its own uid: a program its own user can write gives that user nothing more. Where
//! the path does not exist yet, the components that exist are checked: only who may write the
//! last of them could create the rest.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use swimlb_config::standalone::{CheckKind, ScriptUser, Standalone};

/// The `PATH` programs run with, and where a program named without a `/` is looked up.
pub const SCRIPT_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// A user to run a program as, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    /// The uid.
    pub uid: u32,
    /// The gid: the one given, else the user's primary group.
    pub gid: u32,
}

/// Who, besides root, could change a path component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// Its owner, not root, may write it.
    Owner(u32),
    /// Its owner is not root: it may make it writable.
    OwnedBy(u32),
    /// Its group may write it.
    Group(u32),
    /// Every user may write it.
    Everyone,
}

impl std::fmt::Display for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Writer::Owner(uid) => write!(f, "is writable by uid {uid}"),
            Writer::OwnedBy(uid) => write!(f, "is owned by uid {uid}"),
            Writer::Group(gid) => write!(f, "is writable by group {gid}"),
            Writer::Everyone => write!(f, "is writable by every user"),
        }
    }
}

/// Why a program may not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScriptError {
    /// A name without `/` that no directory of [`SCRIPT_PATH`] holds.
    #[error(
        "`{0}` is not in {SCRIPT_PATH} (where programs named without a `/` are looked up): give its absolute path"
    )]
    NotInPath(String),
    /// A relative path with a `/`: relative to what the speaker's working directory happens to be.
    #[error(
        "`{0}` is a relative path: give an absolute path, or a name looked up in {SCRIPT_PATH}"
    )]
    Relative(String),
    /// A component of the path another user could change.
    #[error("{program}: {component} {writer} (mode {mode:04o})")]
    Unsafe {
        /// The program.
        program: PathBuf,
        /// The component (the program itself, or a directory above it).
        component: PathBuf,
        /// Who could change it.
        writer: Writer,
        /// Its mode.
        mode: u32,
    },
    /// A component could not be examined.
    #[error("{program}: {component}: {message}")]
    Unreadable {
        /// The program.
        program: PathBuf,
        /// The component.
        component: PathBuf,
        /// The error.
        message: String,
    },
    /// No such user in the user database.
    #[error("no user `{0}` on this host")]
    NoUser(String),
    /// No such group in the group database.
    #[error("no group `{0}` on this host")]
    NoGroup(String),
    /// The user or group database could not be read.
    #[error("looking up `{name}`: {message}")]
    Lookup {
        /// The name looked up.
        name: String,
        /// The error.
        message: String,
    },
}

/// `program` as it will run: an absolute path as is; a name without `/` found in
/// [`SCRIPT_PATH`] (the first directory holding a file of that name).
pub fn resolve_program(program: &str) -> Result<PathBuf, ScriptError> {
    let path = Path::new(program);
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    if program.contains('/') {
        return Err(ScriptError::Relative(program.to_string()));
    }
    SCRIPT_PATH
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| ScriptError::NotInPath(program.to_string()))
}

/// The uid a speaker trusts beside root: its own.
pub fn own_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// The first component of `program` (from `/` down, then the same for the path with its links
/// resolved) that a user other than root or `trusted` could change; `Ok(())` when there is none.
pub fn check_path(program: &Path, trusted: u32) -> Result<(), ScriptError> {
    check_components(program, program, trusted)?;
    if let Ok(real) = std::fs::canonicalize(program)
        && real != program
    {
        check_components(program, &real, trusted)?;
    }
    Ok(())
}

fn check_components(program: &Path, path: &Path, trusted: u32) -> Result<(), ScriptError> {
    let components: Vec<&Path> = path.ancestors().collect();
    for component in components.into_iter().rev() {
        let meta = match std::fs::metadata(component) {
            Ok(m) => m,
            // What does not exist yet only a writer of the last existing component could create.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(ScriptError::Unreadable {
                    program: program.to_path_buf(),
                    component: component.to_path_buf(),
                    message: e.to_string(),
                });
            }
        };
        if let Some(writer) =
            unsafe_component(meta.uid(), meta.gid(), meta.mode(), meta.is_dir(), trusted)
        {
            return Err(ScriptError::Unsafe {
                program: program.to_path_buf(),
                component: component.to_path_buf(),
                writer,
                mode: meta.mode() & 0o7777,
            });
        }
    }
    Ok(())
}

/// keepalived's rule for one path component (pure): who besides root (and `trusted`) could
/// change a file or directory of this owner, group and mode.
pub fn unsafe_component(
    uid: u32,
    gid: u32,
    mode: u32,
    is_dir: bool,
    trusted: u32,
) -> Option<Writer> {
    if uid != 0 && uid != trusted {
        return Some(if mode & 0o200 != 0 {
            Writer::Owner(uid)
        } else {
            Writer::OwnedBy(uid)
        });
    }
    if is_dir && mode & 0o1000 != 0 {
        return None;
    }
    if mode & 0o002 != 0 {
        Some(Writer::Everyone)
    } else if mode & 0o020 != 0 {
        Some(Writer::Group(gid))
    } else {
        None
    }
}

/// The uid and gid of `user`: names looked up in the user and group databases, numbers taken
/// as they are (a uid without a group must have an entry, for its primary group).
pub fn resolve_user(user: &ScriptUser) -> Result<RunAs, ScriptError> {
    let lookup = |name: &str, e: nix::Error| ScriptError::Lookup {
        name: name.to_string(),
        message: e.to_string(),
    };
    let entry = match user.user.parse::<u32>() {
        Ok(uid) => nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .map_err(|e| lookup(&user.user, e))?
            .map(|u| (u.uid.as_raw(), u.gid.as_raw()))
            .or_else(|| user.group.as_ref().map(|_| (uid, u32::MAX))),
        Err(_) => nix::unistd::User::from_name(&user.user)
            .map_err(|e| lookup(&user.user, e))?
            .map(|u| (u.uid.as_raw(), u.gid.as_raw())),
    };
    let Some((uid, primary)) = entry else {
        return Err(ScriptError::NoUser(user.user.clone()));
    };
    let gid = match &user.group {
        None => primary,
        Some(group) => match group.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => nix::unistd::Group::from_name(group)
                .map_err(|e| lookup(group, e))?
                .map(|g| g.gid.as_raw())
                .ok_or_else(|| ScriptError::NoGroup(group.clone()))?,
        },
    };
    Ok(RunAs { uid, gid })
}

/// Checks every program and user of `config` as the speaker will run them, and returns the
/// file with each exec check's program resolved; or every problem, each with its path in the
/// file (`groups[0].checks[1].exec: /opt/x/check.sh: /opt/x is writable by uid 1000 (mode 0775)`).
pub fn vet(config: &Standalone) -> Result<Standalone, Vec<String>> {
    let trusted = own_uid();
    let mut problems = Vec::new();
    let mut vetted = config.clone();
    if let Some(user) = &config.script_user
        && let Err(e) = resolve_user(user)
    {
        problems.push(format!("scriptUser: {e}"));
    }
    for (i, group) in vetted.groups.iter_mut().enumerate() {
        for (j, check) in group.checks.iter_mut().enumerate() {
            let CheckKind::Exec { argv, user } = &mut check.kind else {
                continue;
            };
            let here = format!("groups[{i}].checks[{j}]");
            if let Some(user) = user
                .as_ref()
                .filter(|u| Some(*u) != config.script_user.as_ref())
                && let Err(e) = resolve_user(user)
            {
                problems.push(format!("{here}.user: {e}"));
            }
            let Some(program) = argv.first_mut() else {
                continue;
            };
            match resolve_program(program).and_then(|p| check_path(&p, trusted).map(|()| p)) {
                Ok(path) => *program = path.to_string_lossy().into_owned(),
                Err(e) => problems.push(format!("{here}.exec: {e}")),
            }
        }
        if let Some(notify) = &group.notify
            && let Err(e) = check_path(notify, trusted)
        {
            problems.push(format!("groups[{i}].notify: {e}"));
        }
    }
    if problems.is_empty() {
        Ok(vetted)
    } else {
        Err(problems)
    }
}

/// [`vet`], and what only the daemon's own process can tell: that it may switch to the users
/// the file names (`CAP_SETUID` and `CAP_SETGID`; the systemd unit leaves them out unless a
/// drop-in adds them). `check-config`, run from a shell, holds other capabilities than the
/// service, so it checks the file only.
pub fn vet_to_run(config: &Standalone) -> Result<Standalone, Vec<String>> {
    let vetted = vet(config)?;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    match first_other_user(&vetted, own_uid()) {
        Some(path) if !can_switch_users(&status) => Err(vec![format!(
            "{path}: running a program as another user needs CAP_SETUID and CAP_SETGID, which \
             this speaker does not hold (systemd: add them to the unit's CapabilityBoundingSet)"
        )]),
        _ => Ok(vetted),
    }
}

/// Where `config` first names a user other than `own` to run a program as.
fn first_other_user(config: &Standalone, own: u32) -> Option<String> {
    let other = |u: &ScriptUser| resolve_user(u).is_ok_and(|r| r.uid != own);
    let notify = config.groups.iter().any(|g| g.notify.is_some());
    if notify && config.script_user.as_ref().is_some_and(other) {
        return Some("scriptUser".into());
    }
    config.groups.iter().enumerate().find_map(|(i, g)| {
        g.checks
            .iter()
            .enumerate()
            .find_map(|(j, c)| match &c.kind {
                CheckKind::Exec { user: Some(u), .. } if other(u) => {
                    Some(format!("groups[{i}].checks[{j}].user"))
                }
                _ => None,
            })
    })
}

/// Whether `/proc/self/status` (its text) gives the effective capabilities `CAP_SETGID` (6)
/// and `CAP_SETUID` (7).
fn can_switch_users(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & 0b1100_0000 == 0b1100_0000)
}

/// How one run ended.
#[derive(Debug)]
pub enum Ran {
    /// The program exited (or a signal ended it).
    Exited(ExitStatus),
    /// Still running at the timeout: its process group was killed.
    Timeout,
    /// It could not be started.
    Spawn(std::io::Error),
    /// Its path or its user did not pass [`check_path`] or [`resolve_user`] at this run.
    Refused(ScriptError),
}

/// Kills a process group when dropped, unless disarmed (its leader reaped).
struct GroupGuard(Option<nix::unistd::Pid>);

impl GroupGuard {
    fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            // ESRCH: the group is gone already.
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `program args` once as `user`, bounded by `timeout` (see the module docs); its output
/// goes nowhere.
pub async fn run(
    program: &str,
    args: &[impl AsRef<std::ffi::OsStr>],
    user: Option<&ScriptUser>,
    timeout: Duration,
) -> Ran {
    let path = match resolve_program(program).and_then(|p| check_path(&p, own_uid()).map(|()| p)) {
        Ok(path) => path,
        Err(e) => return Ran::Refused(e),
    };
    let run_as = match user.map(resolve_user).transpose() {
        Ok(run_as) => run_as,
        Err(e) => return Ran::Refused(e),
    };
    let mut command = tokio::process::Command::new(&path);
    command
        .args(args)
        .env_clear()
        .env("PATH", SCRIPT_PATH)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(RunAs { uid, gid }) = run_as {
        command.gid(gid).uid(uid);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => return Ran::Spawn(e),
    };
    // The child leads its own group: its id is the group's.
    let mut group = GroupGuard(
        child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(nix::unistd::Pid::from_raw),
    );
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) => {
            // Reaped: the id may be reused, so the group is not ours to kill any more.
            group.0 = None;
            Ran::Exited(status)
        }
        Ok(Err(e)) => Ran::Spawn(e),
        Err(_) => {
            group.kill();
            // The child itself too, should it have left its group (`setsid`).
            let _ = child.start_kill();
            let _ = child.wait().await;
            Ran::Timeout
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    /// A directory of this test's, removed on drop.
    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Dir {
            let p =
                std::env::temp_dir().join(format!("swimlb-scripts-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            Dir(p)
        }

        /// An executable shell script `name` holding `body`.
        fn script(&self, name: &str, body: &str) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            path
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The live (not zombie) processes whose command line holds `marker`.
    fn processes_with(marker: &str) -> Vec<u32> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
            if !zombie && String::from_utf8_lossy(&cmdline).contains(marker) {
                found.push(pid);
            }
        }
        found
    }

    #[test]
    fn switching_users_needs_both_capabilities() {
        assert!(can_switch_users("Name:\tx\nCapEff:\t000001ffffffffff\n"));
        assert!(can_switch_users("CapEff:\t00000000000000c0\n"));
        assert!(
            !can_switch_users("CapEff:\t0000000000003000\n"),
            "NET_ADMIN and NET_RAW only"
        );
        assert!(
            !can_switch_users("CapEff:\t0000000000000080\n"),
            "SETUID without SETGID"
        );
        assert!(!can_switch_users(""));
    }

    #[test]
    fn the_daemon_needs_the_capabilities_only_for_a_user_other_than_its_own() {
        let config = |extra: &str| {
            Standalone::parse(&format!(
                "cluster: c\nbind: 192.0.2.10\ninsecure: true\n{extra}groups: [{{name: a, addresses: [192.0.2.100], checks: [{{name: x, exec: 'true'}}, {{name: z, exec: 'true', user: nobody}}]}}]"
            ))
            .unwrap()
        };
        let plain = Standalone::parse(
            "cluster: c\nbind: 192.0.2.10\ninsecure: true\ngroups: [{name: a, addresses: [192.0.2.100], checks: [{name: x, exec: 'true'}]}]",
        )
        .unwrap();
        assert_eq!(first_other_user(&plain, 0), None);
        assert_eq!(
            first_other_user(&config(""), 0).as_deref(),
            Some("groups[0].checks[1].user")
        );
        let nobody = resolve_user(&ScriptUser {
            user: "nobody".into(),
            group: None,
        })
        .unwrap();
        assert_eq!(
            first_other_user(&config(""), nobody.uid),
            None,
            "its own user"
        );
    }

    #[tokio::test]
    async fn a_timeout_kills_the_program_and_every_process_it_started() {
        let dir = Dir::new("group");
        // `sleep` under a name of its own, so its processes are found by their command line.
        let marker = dir.0.join(format!("swimlb-marker-{}", std::process::id()));
        std::os::unix::fs::symlink(resolve_program("sleep").unwrap(), &marker).unwrap();
        let script = dir.script(
            "check.sh",
            &format!("{m} 30 &\n{m} 30", m = marker.display()),
        );
        let marker = marker.to_string_lossy().into_owned();
        let program = script.to_string_lossy().into_owned();
        let run = tokio::spawn(async move {
            run(&program, &[] as &[&str], None, Duration::from_secs(3)).await
        });
        // Both sleeps run: the script's child and its grandchild in the background.
        let started = tokio::time::Instant::now();
        while processes_with(&marker).len() < 2 {
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "the script never started both"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The run ends at its timeout (3 s), not when the sleeps would (30 s).
        let ran = tokio::time::timeout(Duration::from_secs(10), run).await;
        assert!(matches!(ran, Ok(Ok(Ran::Timeout))), "{ran:?}");
        let killed = tokio::time::Instant::now();
        while !processes_with(&marker).is_empty() {
            assert!(
                killed.elapsed() < Duration::from_secs(2),
                "still running after the timeout: {:?}",
                processes_with(&marker)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_program_runs_with_only_path_in_its_environment() {
        let dir = Dir::new("env");
        let out = dir.0.join("env.out");
        let script = dir.script("env.sh", &format!("env > {}", out.display()));
        let ran = run(
            &script.to_string_lossy(),
            &[] as &[&str],
            None,
            Duration::from_secs(5),
        )
        .await;
        assert!(matches!(ran, Ran::Exited(s) if s.success()), "{ran:?}");
        let env = std::fs::read_to_string(&out).unwrap();
        assert!(
            env.lines().any(|l| l == format!("PATH={SCRIPT_PATH}")),
            "{env}"
        );
        // The test runs under cargo, whose variables the speaker's environment would carry.
        assert!(std::env::var_os("CARGO").is_some());
        assert!(!env.contains("CARGO"), "{env}");
    }

    #[tokio::test]
    async fn a_program_whose_directory_others_may_write_is_refused_at_load_and_at_each_run() {
        let dir = Dir::new("writable");
        let script = dir.script("check.sh", "exit 0");
        let config = Standalone::parse(&format!(
            "cluster: c\nbind: 192.0.2.10\ninsecure: true\ngroups: [{{name: a, addresses: [192.0.2.100], notify: {s}, checks: [{{name: x, exec: 'true'}}, {{name: z, exec: {s}}}]}}]",
            s = script.display()
        ))
        .unwrap();
        let vetted = vet(&config).unwrap();
        let CheckKind::Exec { argv, .. } = &vetted.groups[0].checks[0].kind else {
            panic!("an exec check");
        };
        assert!(
            argv[0].starts_with('/') && argv[0].ends_with("/true"),
            "{argv:?}"
        );
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
        let unsafe_dir = format!(
            "{}: {} is writable by every user (mode 0777)",
            script.display(),
            dir.0.display()
        );
        assert_eq!(
            vet(&config).unwrap_err(),
            [
                format!("groups[0].checks[1].exec: {unsafe_dir}"),
                format!("groups[0].notify: {unsafe_dir}"),
            ]
        );
        let ran = run(
            &script.to_string_lossy(),
            &[] as &[&str],
            None,
            Duration::from_secs(5),
        )
        .await;
        assert!(
            matches!(ran, Ran::Refused(ScriptError::Unsafe { .. })),
            "{ran:?}"
        );
    }

    #[tokio::test]
    #[ignore = "needs root: runs a program as another user"]
    async fn a_program_runs_as_its_user_with_no_supplementary_groups() {
        let dir = Dir::new("user");
        // The output goes to a directory of its own, which the user may write.
        let out = Dir::new("user-out");
        std::fs::set_permissions(&out.0, std::fs::Permissions::from_mode(0o777)).unwrap();
        let script = dir.script(
            "id.sh",
            "id -u > \"$1/id\"; id -g >> \"$1/id\"; id -G >> \"$1/id\"",
        );
        let nobody = ScriptUser {
            user: "nobody".into(),
            group: None,
        };
        let expected = resolve_user(&nobody).unwrap();
        assert_ne!(expected.uid, 0);
        let ran = run(
            &script.to_string_lossy(),
            &[out.0.as_os_str()],
            Some(&nobody),
            Duration::from_secs(5),
        )
        .await;
        assert!(matches!(ran, Ran::Exited(s) if s.success()), "{ran:?}");
        let id = std::fs::read_to_string(out.0.join("id")).unwrap();
        assert_eq!(
            id,
            format!("{u}\n{g}\n{g}\n", u = expected.uid, g = expected.gid)
        );
    }

    #[test]
    fn a_component_others_could_change_is_named_by_keepalived_s_rule() {
        let dir = true;
        let file = false;
        assert_eq!(unsafe_component(0, 0, 0o755, dir, 0), None);
        assert_eq!(unsafe_component(0, 0, 0o1777, dir, 0), None, "/tmp");
        assert_eq!(
            unsafe_component(0, 0, 0o777, file, 0),
            Some(Writer::Everyone)
        );
        assert_eq!(
            unsafe_component(0, 0, 0o1777, file, 0),
            Some(Writer::Everyone),
            "the sticky bit protects a directory's entries, not a file"
        );
        assert_eq!(
            unsafe_component(0, 50, 0o775, dir, 0),
            Some(Writer::Group(50))
        );
        assert_eq!(
            unsafe_component(1000, 1000, 0o775, dir, 0),
            Some(Writer::Owner(1000))
        );
        assert_eq!(
            unsafe_component(1000, 1000, 0o555, file, 0),
            Some(Writer::OwnedBy(1000))
        );
        assert_eq!(
            unsafe_component(1000, 1000, 0o755, file, 1000),
            None,
            "a speaker running as uid 1000 trusts its own files"
        );
    }

    #[test]
    fn names_without_a_slash_are_looked_up_in_the_fixed_path_and_relative_paths_refused() {
        let found = resolve_program("sh").unwrap();
        assert!(found.is_absolute() && found.ends_with("sh"), "{found:?}");
        assert_eq!(
            resolve_program("/opt/x/check.sh").unwrap(),
            Path::new("/opt/x/check.sh")
        );
        assert_eq!(
            resolve_program("swimlb-no-such-program")
                .unwrap_err()
                .to_string(),
            "`swimlb-no-such-program` is not in /usr/sbin:/usr/bin:/sbin:/bin (where programs named without a `/` are looked up): give its absolute path"
        );
        assert_eq!(
            resolve_program("bin/check.sh").unwrap_err(),
            ScriptError::Relative("bin/check.sh".into())
        );
    }

    #[test]
    fn users_and_groups_resolve_by_name_and_number_and_unknown_ones_are_named() {
        let root = |s: &str| {
            let (user, group) = match s.split_once(':') {
                Some((u, g)) => (u, Some(g.to_string())),
                None => (s, None),
            };
            resolve_user(&ScriptUser {
                user: user.into(),
                group,
            })
        };
        assert_eq!(root("root"), Ok(RunAs { uid: 0, gid: 0 }));
        assert_eq!(root("0"), Ok(RunAs { uid: 0, gid: 0 }));
        assert_eq!(root("root:0"), Ok(RunAs { uid: 0, gid: 0 }));
        assert_eq!(
            root("swimlb-no-such-user"),
            Err(ScriptError::NoUser("swimlb-no-such-user".into()))
        );
        assert_eq!(
            root("root:swimlb-no-such-group"),
            Err(ScriptError::NoGroup("swimlb-no-such-group".into()))
        );
    }
}
