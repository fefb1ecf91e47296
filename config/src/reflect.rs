//! Caches of Kubernetes objects: what every cached object drops ([`trim_meta`]) and a reflector
//! store kept by a background task ([`spawn_store`]; [`spawn_store_observed`] also shows each
//! event and error to the caller).
//!
//! Guarantees: a store holds only trimmed objects; its task ends when the caller's stop future
//! resolves (or the watch stream ends), and a failed watch is logged and retried with
//! [`RetryBackoff`], never ends the store. A [`Relister`] makes every store it was handed to
//! start its watch over (a fresh list on a fresh connection) while keeping its objects until
//! the list ends.

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::utils::Backoff;
use kube::runtime::{WatchStreamExt, watcher};
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};
use serde::de::DeserializeOwned;

/// How long the API server keeps one watch request open (`timeoutSeconds`) before kube's
/// watcher opens the next from the last resourceVersion (nothing is missed). Short enough that
/// [`READ_TIMEOUT`] can end a connection the network half-closed: after a partition during which
/// the API server restarted, kube's defaults (a 290 s watch, a 295 s read timeout) left a
/// speaker blind to every change for up to five minutes, and the lab's `--api-down` trials saw
/// a `ServiceL2Status` stay stale that long.
pub const WATCH_TIMEOUT_S: u32 = 20;

/// The client's read timeout (set it on the `kube::Config`): a watch connection silent for this
/// long is dead (a live one ends itself after [`WATCH_TIMEOUT_S`]).
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// What a store's objects must be for kube's reflector: every store here holds one kind.
pub trait Stored: Resource<DynamicType: Kind> + Clone + Debug + Send + Sync + Owned {}

impl<K: Resource<DynamicType: Kind> + Clone + Debug + Send + Sync + Owned> Stored for K {}

/// What kube's reflector asks of a resource's dynamic type (`()` for the typed resources here).
pub trait Kind: Default + Eq + Hash + Clone + Send + Sync {}

impl<T: Default + Eq + Hash + Clone + Send + Sync> Kind for T {}

/// Deserializable into an owned value that lives as long as the program.
pub trait Owned: DeserializeOwned + 'static {}

impl<T: DeserializeOwned + 'static> Owned for T {}

/// A watch of [`WATCH_TIMEOUT_S`] per request: every watch of the controller and the speaker.
pub fn watch_config() -> watcher::Config {
    watcher::Config::default().timeout(WATCH_TIMEOUT_S)
}

/// The annotation `kubectl apply` writes: a copy of the whole object, never read here.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops managed fields and the last-applied annotation (pure); for every cached object.
pub fn trim_meta(meta: &mut kube::api::ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// A store of `api`'s objects (trimmed by [`trim_meta`]), kept by a background task until
/// `stop` resolves; `changed` hears of every change.
pub fn spawn_store<K: Stored>(
    api: Api<K>,
    changed: Option<UnboundedSender<()>>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Store<K> {
    spawn_store_with(api, watch_config(), |_| {}, changed, stop)
}

/// [`spawn_store`] with a watch configuration (label or field selectors) and a trim of its own
/// applied after [`trim_meta`] (for example dropping the parts of a Service nobody reads).
pub fn spawn_store_with<K: Stored>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    changed: Option<UnboundedSender<()>>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Store<K> {
    spawn_store_observed(
        api,
        config,
        trim,
        move |seen| {
            if let (Seen::Event(_), Some(tx)) = (seen, &changed) {
                let _ = tx.unbounded_send(());
            }
        },
        Relists::never(),
        stop,
    )
}

/// Tells stores to start their watches over ([`Relists`]): for a node whose link was down,
/// whose watch connections outlived the outage. The server sends what they missed on its
/// retransmit timer, backed off for as long as the link was down (seconds after the link's
/// return, longer on a lossy link); a fresh list on a fresh connection sees the API as it is
/// at once.
#[derive(Debug)]
pub struct Relister(tokio::sync::watch::Sender<u64>);

/// A store's side of a [`Relister`]: each store holds its own clone.
#[derive(Debug, Clone)]
pub struct Relists(Option<tokio::sync::watch::Receiver<u64>>);

/// A relister and the receiver its stores clone.
pub fn relists() -> (Relister, Relists) {
    let (tx, rx) = tokio::sync::watch::channel(0);
    (Relister(tx), Relists(Some(rx)))
}

impl Relister {
    /// Every store holding one of its [`Relists`] starts its watch over.
    pub fn relist(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }
}

impl Relists {
    /// Never asks for a relist.
    pub fn never() -> Relists {
        Relists(None)
    }

    /// Resolves when a relist is asked for (several asked meanwhile count once); never once
    /// the [`Relister`] is gone. Cancel-safe.
    pub async fn asked(&mut self) {
        if let Some(rx) = self.0.as_mut() {
            if rx.changed().await.is_ok() {
                return;
            }
            self.0 = None;
        }
        std::future::pending().await
    }
}

/// What a store's task shows its observer ([`spawn_store_observed`]).
#[derive(Debug)]
pub enum Seen<'a, K> {
    /// An event of the watch, already applied to the store (the object trimmed).
    Event(&'a watcher::Event<K>),
    /// The watch failed (it is logged here and retried with backoff).
    Error(&'a watcher::Error),
}

/// [`spawn_store_with`] that shows `observe` every event once it is in the store, and every
/// watch error: for a caller that needs to know what changed (not only that something did), or
/// counts the errors. `observe` runs on the store's task: it must not block. When `relists`
/// asks, the watch starts over: the store keeps its objects until the new list ends (then
/// `observe` sees `InitDone`, as at the start).
pub fn spawn_store_observed<K: Stored, F>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    mut observe: F,
    mut relists: Relists,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Store<K>
where
    F: FnMut(Seen<'_, K>) + Send + 'static,
{
    let (reader, mut writer) = reflector::store();
    let watch = move || Box::pin(watcher(api.clone(), config.clone()).backoff(RetryBackoff::new()));
    tokio::spawn(async move {
        let mut stream = watch();
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                () = relists.asked() => {
                    tracing::debug!("the watch starts over");
                    stream = watch();
                }
                event = stream.next() => match event {
                    None => return,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "watch failed; retrying");
                        observe(Seen::Error(&e));
                    }
                    Some(Ok(mut event)) => {
                        if let watcher::Event::Apply(o)
                        | watcher::Event::Delete(o)
                        | watcher::Event::InitApply(o) = &mut event
                        {
                            trim_meta(o.meta_mut());
                            trim(o);
                        }
                        writer.apply_watcher_event(&event);
                        observe(Seen::Event(&event));
                    }
                },
            }
        }
    });
    reader
}

/// The first wait before a failed watch is retried.
const FIRST_RETRY: Duration = Duration::from_millis(500);
/// The longest wait: kube's default (30 s) left a speaker blind that long after the API
/// server came back, answering for IPs the API had moved meanwhile.
const LAST_RETRY: Duration = Duration::from_secs(5);

/// How every watch of the speaker and the controller retries after a failure: from
/// [`FIRST_RETRY`], doubling up to [`LAST_RETRY`], each wait shortened by up to half at random so
/// that a cluster's speakers do not all retry in step after an API server restart; a success
/// starts over (kube's backoff stream resets it). kube's default grows to 30 s: a node cut off
/// from the API server for ten seconds then waited up to 25 s more after the cut healed before
/// it relisted its Nodes, and went on answering for an IP its node had been excluded from.
#[derive(Debug)]
pub struct RetryBackoff {
    next: Duration,
    rng: StdRng,
}

impl RetryBackoff {
    /// A backoff at its first wait, its jitter seeded from the clock and the process.
    pub fn new() -> RetryBackoff {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        RetryBackoff {
            next: FIRST_RETRY,
            rng: StdRng::seed_from_u64(seed ^ u64::from(std::process::id())),
        }
    }
}

impl Iterator for RetryBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = self.next;
        self.next = (wait * 2).min(LAST_RETRY);
        let cut = self.rng.random_range(0..=wait.as_millis() as u64 / 2);
        Some(wait - Duration::from_millis(cut))
    }
}

impl Default for RetryBackoff {
    fn default() -> RetryBackoff {
        RetryBackoff::new()
    }
}

impl Backoff for RetryBackoff {
    fn reset(&mut self) {
        self.next = FIRST_RETRY;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_wait_longer_each_time_up_to_five_seconds_and_start_over_after_a_success() {
        let mut backoff = RetryBackoff::new();
        let waits: Vec<Duration> = backoff.by_ref().take(8).collect();
        let ceilings = [500, 1000, 2000, 4000, 5000, 5000, 5000, 5000];
        for (wait, ceiling) in waits.iter().zip(ceilings) {
            let ceiling = Duration::from_millis(ceiling);
            assert!(*wait <= ceiling && *wait >= ceiling / 2, "{waits:?}");
        }
        backoff.reset();
        assert!(backoff.next().unwrap() <= FIRST_RETRY);
    }

    /// Whether `relists` asks for a relist now (within a tick of paused time).
    async fn asks(relists: &mut Relists) -> bool {
        tokio::time::timeout(Duration::from_millis(1), relists.asked())
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn each_store_hears_a_relist_once_and_never_after_the_relister_is_gone() {
        let (relister, mut first) = relists();
        let mut second = first.clone();
        assert!(!asks(&mut first).await, "nothing asked yet");
        relister.relist();
        relister.relist();
        assert!(asks(&mut first).await && asks(&mut second).await);
        assert!(
            !asks(&mut first).await,
            "two relists before the store looked count once"
        );
        drop(relister);
        assert!(!asks(&mut second).await && !asks(&mut second).await);
        assert!(!asks(&mut Relists::never()).await);
    }
}
