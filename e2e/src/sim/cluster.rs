//! The gossip's network and the owner watches run on one virtual clock.

use super::*;

/// The gossip's [`SimNet`] and, unless switched off, the [`OwnerWatches`] beside it, run on one
/// clock: every watch event runs after the gossip events due at the same time or earlier.
#[derive(Debug)]
pub struct Cluster {
    net: SimNet,
    watch: Option<OwnerWatches>,
    /// The gossip's datagrams by kind, while counted ([`Cluster::count_kinds`]).
    kinds: Option<Kinds>,
}

impl Cluster {
    /// `net`, with `watch` beside it.
    pub fn new(net: SimNet, watch: Option<OwnerWatches>) -> Cluster {
        Cluster {
            net,
            watch,
            kinds: None,
        }
    }

    /// Starts counting the gossip's datagrams by kind (`sim --kinds`).
    pub(super) fn count_kinds(&mut self) -> anyhow::Result<()> {
        self.net.tap(true);
        self.kinds = Some(Kinds::new()?);
        Ok(())
    }

    /// Stops counting them; returns the counts (empty when they were not counted).
    pub(super) fn take_kinds(&mut self) -> BTreeMap<&'static str, u64> {
        self.count_tapped();
        self.net.tap(false);
        self.kinds.take().map(|k| k.counts).unwrap_or_default()
    }

    /// Counts what the tap recorded so far.
    fn count_tapped(&mut self) {
        if let Some(kinds) = &mut self.kinds {
            kinds.count(self.net.take_tapped());
        }
    }

    /// The virtual time.
    pub fn now(&self) -> Duration {
        self.net.now()
    }

    /// Node `i`'s core, if it runs.
    pub fn core(&self, i: usize) -> Option<&Core> {
        self.net.core(i)
    }

    /// The gossip datagrams node `i` sent so far.
    pub fn traffic(&self, i: usize) -> Traffic {
        self.net.traffic(i)
    }

    /// The watch, when it runs.
    pub fn watch(&self) -> Option<&OwnerWatches> {
        self.watch.as_ref()
    }

    /// Starts (or restarts) node `i` with `core`, and its watch.
    pub fn start(&mut self, i: usize, core: Core) -> anyhow::Result<()> {
        self.net.start(i, core);
        if let Some(watch) = &mut self.watch {
            watch.start(&self.net, i)?;
        }
        Ok(())
    }

    /// Crashes node `i` and its watch.
    pub fn crash(&mut self, i: usize) {
        self.net.crash(i);
        if let Some(watch) = &mut self.watch {
            watch.crash(i);
        }
    }

    /// [`SimNet::set_lag`]: the watch lags too.
    pub fn set_lag(&mut self, i: usize, lag: Duration) {
        self.net.set_lag(i, lag);
    }

    /// [`SimNet::pause`]: the watch pauses too.
    pub fn pause(&mut self, i: usize, until: Duration) {
        self.net.pause(i, until);
    }

    /// [`SimNet::set_group`]: the watch's datagrams cross only within a group too.
    pub fn set_group(&mut self, i: usize, group: u32) {
        self.net.set_group(i, group);
    }

    /// [`SimNet::heal`].
    pub fn heal(&mut self) {
        self.net.heal();
    }

    /// [`SimNet::drain_changes`].
    pub fn drain_changes(&mut self) -> std::vec::Drain<'_, (Duration, usize, LiveChange)> {
        self.net.drain_changes()
    }

    /// Marks `member` as the stalled one (its takeovers are [`TakeoverKind::Stalled`]).
    pub(super) fn set_stalled(&mut self, member: Option<usize>) {
        if let Some(watch) = &mut self.watch {
            watch.stalled = member;
        }
    }

    /// Marks the partition phase (takeovers of running members are
    /// [`TakeoverKind::Partitioned`]).
    pub(super) fn set_partitioned(&mut self, on: bool) {
        if let Some(watch) = &mut self.watch {
            watch.partitioned = on;
        }
    }

    /// Takeovers so far (none without the watch).
    pub fn takeovers(&self) -> &[Takeover] {
        self.watch.as_ref().map_or(&[], OwnerWatches::takeovers)
    }

    /// Runs both up to `until`.
    pub fn run_until(&mut self, until: Duration) {
        let Some(watch) = &mut self.watch else {
            self.net.run_until(until);
            self.count_tapped();
            return;
        };
        while let Some(at) = watch.next_at().filter(|at| *at <= until) {
            self.net.run_until(at);
            route_relays(&mut self.net, watch);
            watch.step(&self.net);
            route_relays(&mut self.net, watch);
        }
        self.net.run_until(until);
        route_relays(&mut self.net, watch);
        self.count_tapped();
    }

    /// Runs both for `span`.
    pub fn run_for(&mut self, span: Duration) {
        let until = self.now() + span;
        self.run_until(until);
    }
}

/// Claims and refutations travel through the gossip as they do in the daemon: from each watch
/// core to its gossip core ([`Core::relay_watch`]), and what the gossip cores received to their
/// watch cores ([`WatchCore::handle_relayed`]); so do the members each watch heard alive
/// ([`Core::heard_on_watch`]).
fn route_relays(net: &mut SimNet, watch: &mut OwnerWatches) {
    for (i, payload) in watch.take_relays() {
        net.with_core(i, |core, _| core.relay_watch(&payload));
    }
    for (i, addr, bump) in watch.take_heard() {
        net.with_core(i, |core, now| core.heard_on_watch(now, addr, bump));
    }
    let relayed: Vec<_> = net.drain_watch_relayed().collect();
    for (at, i, r) in relayed {
        watch.relayed(net, i, at, r.from, &r.payload);
    }
}
