//! Notify hooks: a program run on every state change of a group, as keepalived's `notify`.
//!
//! The program gets two arguments, the group name and the new state (`owner`, `backup` or
//! `fault`), and runs detached from the speaker's decisions: a slow or failing hook never delays
//! an announcement. Calls for one group run one after another, in order, each bounded by a
//! timeout; a failure is logged and counted, never retried. At exit the speaker lets the queued
//! calls finish, within a deadline ([`Notifier::finish`]), so the last `fault` is not lost.
//!
//! A hook runs as [`scripts::run`] runs programs: as the file's `scriptUser`, with an empty
//! environment but `PATH`, its path checked again before each call, its process group killed on
//! the timeout.

use std::path::PathBuf;
use std::time::Duration;

use swimlb_config::standalone::ScriptUser;
use tokio::sync::mpsc;

use crate::sources::scripts::{self, Ran};

/// A group's state as notify hooks see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupState {
    /// This node owns the group's addresses.
    Owner,
    /// Another node owns them, or nobody; this node could take over.
    Backup,
    /// This node may not own the group (a weight-0 check fails, or it is draining).
    Fault,
}

impl GroupState {
    /// The argument passed to the hook.
    pub const fn as_str(&self) -> &'static str {
        match self {
            GroupState::Owner => "owner",
            GroupState::Backup => "backup",
            GroupState::Fault => "fault",
        }
    }
}

/// How one hook call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookResult {
    /// Exit status 0.
    Ok,
    /// Non-zero exit status (or killed by a signal: `-1`).
    Failed(i32),
    /// Still running at the timeout; killed.
    Timeout,
    /// Could not be started.
    Spawn,
    /// Not started: its path became writable by another user, or its user is gone.
    Refused,
}

impl HookResult {
    /// A stable label for logs and metrics.
    pub const fn as_str(&self) -> &'static str {
        match self {
            HookResult::Ok => "ok",
            HookResult::Failed(_) => "failed",
            HookResult::Timeout => "timeout",
            HookResult::Spawn => "spawn",
            HookResult::Refused => "refused",
        }
    }
}

/// Runs `program group state` once as `user`, bounded by `timeout`.
pub async fn call(
    program: &std::path::Path,
    group: &str,
    state: GroupState,
    user: Option<&ScriptUser>,
    timeout: Duration,
) -> HookResult {
    let program = program.to_string_lossy();
    match scripts::run(&program, &[group, state.as_str()], user, timeout).await {
        Ran::Exited(status) if status.success() => HookResult::Ok,
        Ran::Exited(status) => HookResult::Failed(status.code().unwrap_or(-1)),
        Ran::Timeout => HookResult::Timeout,
        Ran::Spawn(_) => HookResult::Spawn,
        Ran::Refused(error) => {
            tracing::warn!(%program, %error, "notify hook not run");
            HookResult::Refused
        }
    }
}

/// A queue of hook calls for one group, run in order by a background task.
#[derive(Debug)]
pub struct Notifier {
    tx: mpsc::UnboundedSender<GroupState>,
    task: tokio::task::JoinHandle<()>,
}

impl Notifier {
    /// Starts the task for `group`'s `program`, run as `user`; `done` receives each call's result.
    pub fn spawn(
        program: PathBuf,
        group: String,
        user: Option<ScriptUser>,
        timeout: Duration,
        done: mpsc::UnboundedSender<(String, GroupState, HookResult)>,
    ) -> Notifier {
        let (tx, mut rx) = mpsc::unbounded_channel::<GroupState>();
        let task = tokio::spawn(async move {
            while let Some(state) = rx.recv().await {
                let result = call(&program, &group, state, user.as_ref(), timeout).await;
                if done.send((group.clone(), state, result)).is_err() {
                    return;
                }
            }
        });
        Notifier { tx, task }
    }

    /// Queues a call; never blocks.
    pub fn notify(&self, state: GroupState) {
        let _ = self.tx.send(state);
    }

    /// Takes no more calls and waits until the queued ones have run, at most until `deadline`
    /// (then the running call is killed). Returns whether the queue ran empty.
    pub async fn finish(self, deadline: tokio::time::Instant) -> bool {
        drop(self.tx);
        let mut task = self.task;
        match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(_) => true,
            Err(_) => {
                task.abort();
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(body: &str) -> (tempdir::Dir, PathBuf) {
        let dir = tempdir::Dir::new();
        let path = dir.0.join("notify.sh");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        (dir, path)
    }

    mod tempdir {
        /// A directory removed on drop.
        pub struct Dir(pub std::path::PathBuf);
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        impl Dir {
            pub fn new() -> Dir {
                let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let p =
                    std::env::temp_dir().join(format!("swimlb-notify-{}-{n}", std::process::id()));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[tokio::test]
    async fn hooks_get_group_and_state_in_order() {
        let (dir, path) = script("echo \"$1 $2\" >> \"$(dirname \"$0\")/calls\"");
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        let n = Notifier::spawn(path, "api".into(), None, Duration::from_secs(5), done_tx);
        n.notify(GroupState::Backup);
        n.notify(GroupState::Owner);
        n.notify(GroupState::Fault);
        for expected in [GroupState::Backup, GroupState::Owner, GroupState::Fault] {
            let (group, state, result) = done_rx.recv().await.unwrap();
            assert_eq!(
                (group.as_str(), state, result),
                ("api", expected, HookResult::Ok)
            );
        }
        let calls = std::fs::read_to_string(dir.0.join("calls")).unwrap();
        assert_eq!(calls, "api backup\napi owner\napi fault\n");
    }

    #[tokio::test]
    async fn finish_runs_the_queued_calls_before_it_returns() {
        let (dir, path) = script("echo \"$1 $2\" >> \"$(dirname \"$0\")/calls\"");
        let (done_tx, _done_rx) = mpsc::unbounded_channel();
        let n = Notifier::spawn(path, "api".into(), None, Duration::from_secs(5), done_tx);
        n.notify(GroupState::Owner);
        n.notify(GroupState::Fault);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        assert!(n.finish(deadline).await);
        let calls = std::fs::read_to_string(dir.0.join("calls")).unwrap();
        assert_eq!(calls, "api owner\napi fault\n");
    }

    #[tokio::test]
    async fn failing_slow_and_missing_hooks_are_reported() {
        let (_d1, failing) = script("exit 7");
        assert_eq!(
            call(
                &failing,
                "g",
                GroupState::Owner,
                None,
                Duration::from_secs(5)
            )
            .await,
            HookResult::Failed(7)
        );
        let (_d2, slow) = script("sleep 5");
        assert_eq!(
            call(
                &slow,
                "g",
                GroupState::Owner,
                None,
                Duration::from_millis(100)
            )
            .await,
            HookResult::Timeout
        );
        let missing = std::path::Path::new("/nonexistent/notify.sh");
        assert_eq!(
            call(
                missing,
                "g",
                GroupState::Owner,
                None,
                Duration::from_secs(1)
            )
            .await,
            HookResult::Spawn
        );
    }
}
