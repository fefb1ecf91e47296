//! The client's observers over a chaos run: a prober and an ARP asker per VIP, a reader of every
//! node's `/status`, in Kubernetes a reader of the API server's records and Services, and what
//! they recorded as the checker reads it.

use super::*;

/// How often the `/status` reader reads every node.
pub(super) const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// What one round of `/status` reads gave: per node (`None`: no answer) the owner it names for
/// each VIP, and when the last read returned (a read slowed by loss may return after a fault
/// that began during the round).
pub(super) type StatusRead = (Vec<Option<Vec<Option<String>>>>, Instant);

/// One round of `/status` reads: when it started, and what it gave.
pub(super) type StatusRound = (Instant, StatusRead);

/// One read of the API server: when it started, and what it found (`None`: no answer).
pub(super) type RecordRound = (Instant, Option<ApiRead>);

/// Reads something every [`POLL_INTERVAL`] on a thread of its own, recording when each read
/// started and what it gave, until stopped.
#[derive(Debug)]
pub(super) struct Reader<T> {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
    log: Arc<Mutex<Vec<(Instant, T)>>>,
}

/// The `/status` reader.
pub(super) type StatusReader = Reader<StatusRead>;
/// The API server's reader (records and Services).
pub(super) type RecordReader = Reader<Option<ApiRead>>;

/// The reading loop of a [`Reader`]: `read` every [`POLL_INTERVAL`] until `stop`.
fn read_until<T>(stop: &AtomicBool, log: &Mutex<Vec<(Instant, T)>>, mut read: impl FnMut() -> T) {
    while !stop.load(Ordering::Relaxed) {
        let at = Instant::now();
        let value = read();
        log.lock().expect("reader log").push((at, value));
        let next = at + POLL_INTERVAL;
        while Instant::now() < next && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl StatusReader {
    /// Reads every node's `/status` from the client's namespace, all nodes at once.
    pub(super) fn start(lab: &Lab, vips: Vec<Ipv4Addr>) -> Result<StatusReader> {
        let stop = Arc::new(AtomicBool::new(false));
        let log: Arc<Mutex<Vec<_>>> = Arc::default();
        let (flag, polls) = (stop.clone(), log.clone());
        let addrs = lab::http_addrs(lab);
        let netns = lab.client_netns.clone();
        let handle = probe::spawn_in(
            &lab.client_netns,
            "chaos-status",
            || Ok(()),
            move |()| {
                read_until(&flag, &polls, || {
                    std::thread::scope(|scope| {
                        let reads: Vec<_> = addrs
                            .iter()
                            .map(|addr| {
                                let (netns, vips) = (&netns, &vips);
                                scope.spawn(move || {
                                    probe::enter_netns(netns).ok()?;
                                    owners_named(&lab::http_get(*addr, "/status")?, vips)
                                })
                            })
                            .collect();
                        let owners = reads.into_iter().map(|r| r.join().ok().flatten()).collect();
                        (owners, Instant::now())
                    })
                })
            },
        )?;
        Ok(Reader {
            stop,
            handle: Some(handle),
            log,
        })
    }
}

impl RecordReader {
    /// Reads the status records and the Services of the Kubernetes lab, with a client of its
    /// own (made again after a failed read).
    pub(super) fn start(records: kubelab::Records) -> RecordReader {
        let stop = Arc::new(AtomicBool::new(false));
        let log: Arc<Mutex<Vec<_>>> = Arc::default();
        let (flag, reads) = (stop.clone(), log.clone());
        let handle = std::thread::spawn(move || {
            let mut client = None;
            read_until(&flag, &reads, || {
                let kube = match client.take() {
                    Some(kube) => kube,
                    None => records.client().ok()?,
                };
                let read = records.read(&kube)?;
                client = Some(kube);
                Some(ApiRead {
                    records: read.records,
                    services: read.services.iter().map(service_ips).collect(),
                })
            })
        });
        Reader {
            stop,
            handle: Some(handle),
            log,
        }
    }
}

/// A Service as the record invariants see it.
fn service_ips(service: &serde_json::Value) -> ServiceIps {
    let text = |p: &str| service.pointer(p).and_then(serde_json::Value::as_str);
    ServiceIps {
        name: format!(
            "{}/{}",
            text("/metadata/namespace").unwrap_or(""),
            text("/metadata/name").unwrap_or("")
        ),
        ips: kubelab::ingress_ips(service),
        shared: service
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(kubelab::SHARED_ANNOTATION))
            .and_then(serde_json::Value::as_str)
            .map(str::to_string),
    }
}

impl<T: Clone> Reader<T> {
    /// Stops reading and returns every read.
    pub(super) fn finish(mut self) -> Vec<(Instant, T)> {
        self.halt();
        self.snapshot()
    }

    pub(super) fn snapshot(&self) -> Vec<(Instant, T)> {
        self.log.lock().expect("reader log").clone()
    }
}

impl<T> Reader<T> {
    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl<T> Drop for Reader<T> {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The owner a `/status` body names for each of `vips` (`None` for the body: not the JSON
/// expected).
pub fn owners_named(status: &str, vips: &[Ipv4Addr]) -> Option<Vec<Option<String>>> {
    let v: serde_json::Value = serde_json::from_str(status).ok()?;
    let addresses = v["addresses"].as_array()?;
    Some(
        vips.iter()
            .map(|ip| {
                let ip = ip.to_string();
                addresses
                    .iter()
                    .find(|a| a["ip"] == ip.as_str())
                    .and_then(|a| a["owner"].as_str())
                    .map(str::to_string)
            })
            .collect(),
    )
}

/// Everything the observers recorded, as the checker reads it.
pub(super) fn observations(
    lab: &Lab,
    t0: Instant,
    probers: &[Prober],
    askers: &[(Instant, Vec<probe::ArpAnswers>)],
    polls: &[StatusRound],
    reads: &[RecordRound],
    horizon: Duration,
) -> Observations {
    let since = |at: Instant| at.saturating_duration_since(t0);
    let node_of = |mac: &[u8; 6]| {
        lab.nodes
            .iter()
            .find(|n| n.mac == *mac)
            .map_or(0, |n| n.index)
    };
    let vips = probers
        .iter()
        .zip(askers)
        .map(|(prober, (asked_from, answers))| VipObservations {
            probes: prober
                .snapshot()
                .iter()
                .filter(|r| r.sent >= t0)
                .map(|r| Probe {
                    sent: since(r.sent),
                    answered: r.answer.is_some(),
                })
                .collect(),
            arp: answers
                .iter()
                .map(|a| ArpSample {
                    at: since(*asked_from + a.at),
                    nodes: a.macs.iter().map(node_of).collect(),
                })
                .collect(),
        })
        .collect();
    Observations {
        vips,
        polls: polls
            .iter()
            .map(|(at, (owners, done))| Poll {
                at: since(*at),
                done: since(*done),
                owners: owners.clone(),
            })
            .collect(),
        records: reads
            .iter()
            .map(|(at, read)| RecordPoll {
                at: since(*at),
                read: read.clone(),
            })
            .collect(),
        horizon,
    }
}

/// The client's observers of every VIP over the run: a prober and an ARP asker each, and the
/// `/status` reader when the daemons have one. `t0` is the start of the run.
pub(super) struct Observers {
    pub(super) t0: Instant,
    probers: Vec<Prober>,
    askers: Vec<(Instant, ArpAsker)>,
    status: Option<StatusReader>,
    records: Option<RecordReader>,
}

impl Observers {
    pub(super) fn start(
        lab: &Lab,
        vips: &[Ipv4Addr],
        duration: Duration,
        status: bool,
        records: Option<kubelab::Records>,
    ) -> Result<Observers> {
        let t0 = Instant::now();
        let probers = vips
            .iter()
            .map(|ip| {
                Prober::start(
                    &lab.client_netns,
                    SocketAddr::from((*ip, PROBE_PORT)),
                    Duration::from_millis(10),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let requests = (duration.as_millis() / invariants::ARP_INTERVAL.as_millis()) as usize + 50;
        let askers = vips
            .iter()
            .map(|ip| {
                let from = Instant::now();
                Ok((
                    from,
                    ArpAsker::start(&lab.client_netns, *ip, invariants::ARP_INTERVAL, requests)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let status = if status {
            Some(StatusReader::start(lab, vips.to_vec())?)
        } else {
            None
        };
        Ok(Observers {
            t0,
            probers,
            askers,
            status,
            records: records.map(RecordReader::start),
        })
    }

    /// What they recorded so far, up to `horizon`.
    pub(super) fn snapshot(&self, lab: &Lab, horizon: Duration) -> Observations {
        let asked: Vec<(Instant, Vec<probe::ArpAnswers>)> = self
            .askers
            .iter()
            .map(|(from, a)| (*from, a.snapshot()))
            .collect();
        let polls = self
            .status
            .as_ref()
            .map(StatusReader::snapshot)
            .unwrap_or_default();
        let reads = self
            .records
            .as_ref()
            .map(RecordReader::snapshot)
            .unwrap_or_default();
        observations(lab, self.t0, &self.probers, &asked, &polls, &reads, horizon)
    }

    /// Stops them; everything they recorded up to `horizon`.
    pub(super) fn finish(self, lab: &Lab, horizon: Duration) -> Observations {
        let polls = self.status.map(StatusReader::finish).unwrap_or_default();
        let reads = self.records.map(RecordReader::finish).unwrap_or_default();
        let asked: Vec<(Instant, Vec<probe::ArpAnswers>)> = self
            .askers
            .into_iter()
            .map(|(from, a)| (from, a.stop()))
            .collect();
        let obs = observations(lab, self.t0, &self.probers, &asked, &polls, &reads, horizon);
        for p in self.probers {
            p.stop();
        }
        obs
    }
}
