//! `swimlb-lab demo`: three nodes, one VIP, the owner powered off, and the timeline of the
//! failover as the network saw it.
//!
//! Three observers run in the client's namespace, each a thread on the lab's clock:
//! - the prober (who answers the VIP, every 10 ms);
//! - an announcement watcher: a filtered packet socket that records every gratuitous ARP and
//!   unsolicited neighbor advertisement for the VIP;
//! - a membership watcher that polls every survivor's `/status` and records when the old owner
//!   left its member list (the gossip's detection).
//!
//! With `--kubernetes` the daemons run on real nodes ([`RealDaemons`]: swimlb from its manifest,
//! or MetalLB from its images, by a real kubelet and containerd, the probes through kube-proxy).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use swimlb_proto::ethernet::MacAddr;
use tokio::time::Instant;

use crate::daemons::{self, Daemons as _, SwimlbDaemons};
use crate::kubelab;
use crate::lab::HTTP_PORT;
pub use crate::lab::{Announcement, AnnouncementWatcher, http_get};
use crate::netns::{self, Lab, Node};
use crate::probe::{self, PROBE_PORT, Prober, enter_netns};
use crate::realnode::daemons::RealDaemons;
use crate::realnode::metallb;
use crate::trial;

/// Polls `/status` of `nodes` from `netns` until each has dropped `gone` from its members;
/// returns when each did (or `None` within `limit`).
pub fn watch_member_gone(
    netns: &str,
    nodes: Vec<(String, SocketAddr)>,
    gone: String,
    limit: Duration,
) -> std::thread::JoinHandle<Vec<(String, Option<Instant>)>> {
    let ns = netns.to_string();
    std::thread::spawn(move || {
        if enter_netns(&ns).is_err() {
            return nodes.into_iter().map(|(n, _)| (n, None)).collect();
        }
        let deadline = Instant::now() + limit;
        let mut result: Vec<(String, Option<Instant>)> =
            nodes.iter().map(|(n, _)| (n.clone(), None)).collect();
        while Instant::now() < deadline && result.iter().any(|(_, t)| t.is_none()) {
            for (i, (_, addr)) in nodes.iter().enumerate() {
                if result[i].1.is_some() {
                    continue;
                }
                if let Some(body) = http_get(*addr, "/status")
                    && let Ok(v) = serde_json::from_str::<serde_json::Value>(&body)
                {
                    let members = v["members"].as_array().cloned().unwrap_or_default();
                    if !members.iter().any(|m| m["node"] == gone.as_str()) {
                        result[i].1 = Some(Instant::now());
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        result
    })
}

/// Polls the logs of MetalLB's speakers on `nodes` (node, its kubelet's Pod log folder) until
/// each one's memberlist has dropped `gone` ([`metallb::members`]); returns when each did (or
/// `None` within `limit`).
fn watch_metallb_member_gone(
    nodes: Vec<(String, PathBuf)>,
    gone: String,
    limit: Duration,
) -> std::thread::JoinHandle<Vec<(String, Option<Instant>)>> {
    std::thread::spawn(move || {
        let deadline = Instant::now() + limit;
        let mut result: Vec<(String, Option<Instant>)> =
            nodes.iter().map(|(n, _)| (n.clone(), None)).collect();
        while Instant::now() < deadline && result.iter().any(|(_, t)| t.is_none()) {
            for (i, (_, pod_logs)) in nodes.iter().enumerate() {
                let log = || metallb::pod_log(pod_logs, metallb::NAMESPACE, "speaker-", "speaker");
                if result[i].1.is_none() && !metallb::members(&log()).contains(&gone) {
                    result[i].1 = Some(Instant::now());
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        result
    })
}

/// Which lab the demo runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DemoLab {
    /// swimlb's standalone speakers.
    Standalone,
    /// swimlb's controller and speakers from `deploy/swimlb.yaml` on real nodes (the real
    /// control plane; a real kubelet, containerd and kube-proxy in each node namespace:
    /// [`RealDaemons`]).
    Kubernetes,
    /// MetalLB from its own images and manifest on the same real nodes
    /// ([`crate::realnode::metallb`]).
    Metallb,
}

/// The demo's daemons, started on every node.
struct Started {
    daemons: Box<dyn daemons::Daemons>,
    /// Where their logs go.
    dir: PathBuf,
    /// Whether they run on the real nodes.
    kubernetes: bool,
    /// MetalLB's speakers tell their memberlist only in their logs: (node, its Pod log folder).
    metallb_logs: Option<Vec<(String, PathBuf)>>,
}

/// Starts the real-node cluster of `which` on `lab` and says what it runs: the API server's
/// version, and each node's kubelet and container runtime as its Node's `nodeInfo` reports them.
fn start_real(lab: &mut Lab, which: DemoLab, out: &mut dyn FnMut(&str)) -> Result<Started> {
    let implementation = match which {
        DemoLab::Metallb => daemons::Implementation::Metallb,
        _ => daemons::Implementation::SwimlbKubernetes,
    };
    let daemons = RealDaemons::start(lab, implementation, &mut |line| out(line))?;
    let cluster = daemons.cluster();
    let server = daemons.server_version().unwrap_or_else(|| "?".into());
    out(&format!(
        "Kubernetes on real nodes: kube-apiserver {server} with etcd, kube-controller-manager and kube-scheduler on {}",
        cluster.plane.api_addr
    ));
    for info in daemons.node_info() {
        out(&format!(
            "  {}: kubelet {}, {}, kube-proxy, each in the node's namespace",
            info.node, info.kubelet_version, info.container_runtime
        ));
    }
    let metallb_logs = if which == DemoLab::Metallb {
        let dir = metallb::locate()?;
        let version =
            metallb::manifest_version(&std::fs::read_to_string(dir.join(metallb::MANIFEST))?)?;
        out(&format!(
            "MetalLB {version} from its {} (kubectl apply --server-side, its images built from its programs and imported into every node's containerd, webhook off), its controller assigning the Service default/web 198.51.100.100; kube-proxy carries the probes to each node's responder",
            metallb::MANIFEST
        ));
        let logs = cluster
            .real
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.dir().join("pod-logs")));
        Some(logs.collect())
    } else {
        out(
            "swimlb from deploy/swimlb.yaml (kubectl apply --server-side, the project's image imported into every node's containerd), the controller assigning the Service default/web 198.51.100.100, a speaker Pod on every node; kube-proxy carries the probes to each node's responder",
        );
        None
    };
    let dir = lab.work_dir().to_path_buf();
    Ok(Started {
        daemons: Box::new(daemons),
        dir,
        kubernetes: true,
        metallb_logs,
    })
}

/// Starts `which` lab's daemons on the three nodes, saying what the lab is.
fn start_daemons(
    lab: &mut Lab,
    program: PathBuf,
    which: DemoLab,
    out: &mut dyn FnMut(&str),
) -> Result<Started> {
    let mut started = match which {
        DemoLab::Kubernetes | DemoLab::Metallb => start_real(lab, which, out)?,
        DemoLab::Standalone => {
            let daemons = SwimlbDaemons::new(lab, program)?;
            let dir = daemons.dir().to_path_buf();
            Started {
                daemons: Box::new(daemons),
                dir,
                kubernetes: false,
                metallb_logs: None,
            }
        }
    };
    for i in 1..=3 {
        started.daemons.start(lab, i)?;
    }
    Ok(started)
}

/// The owner to fault, from a converged lab, and the watch of its status record (Kubernetes
/// lab); an error when the lab cannot be measured.
fn settle_owner(
    lab: &Lab,
    started: &mut Started,
    prober: &Prober,
    out: &mut dyn FnMut(&str),
) -> Result<(String, Node, Option<kubelab::RecordChange>)> {
    let dir = started.dir.display();
    // Measure only from a converged lab, and fault the node that owns the VIP at fault time.
    let settled = match trial::settle(lab, started.daemons.as_mut(), prober, out)? {
        Ok(settled) => settled,
        Err(reason) => bail!(
            "not measured: the lab did not converge within {:?} ({reason}); see the speaker logs in {dir}",
            trial::CONVERGE_LIMIT,
        ),
    };
    let owner = settled.owner;
    let old = lab.node(settled.index).clone();
    let record = match started.daemons.before_fault(&owner, false)? {
        Ok(record) => record,
        Err(reason) => bail!("not measured: {reason}; see the speaker logs in {dir}"),
    };
    Ok((owner, old, record))
}

/// Watches the survivors drop `owner` from their members: `/status` for swimlb, the logs for
/// MetalLB.
fn watch_detections(
    lab: &Lab,
    metallb_logs: Option<Vec<(String, PathBuf)>>,
    owner: &str,
) -> std::thread::JoinHandle<Vec<(String, Option<Instant>)>> {
    let survivors: Vec<(String, SocketAddr)> = lab
        .nodes
        .iter()
        .filter(|n| n.name != owner)
        .map(|n| (n.name.clone(), SocketAddr::from((n.v4, HTTP_PORT))))
        .collect();
    match metallb_logs {
        Some(logs) => watch_metallb_member_gone(
            logs.into_iter().filter(|(n, _)| *n != owner).collect(),
            owner.to_string(),
            Duration::from_secs(20),
        ),
        None => watch_member_gone(
            &lab.client_netns,
            survivors,
            owner.to_string(),
            Duration::from_secs(20),
        ),
    }
}

/// What the observers saw of one failover.
struct Seen {
    fault: Instant,
    sample: Option<probe::FailoverSample>,
    records: Vec<probe::ProbeRecord>,
    detections: Vec<(String, Option<Instant>)>,
    /// Kubernetes lab: when the status record named another node (`Some(None)`: it did not).
    record: Option<Option<(String, Instant)>>,
    announcements: Vec<crate::lab::Announcement>,
}

/// The events after the fault in the order they happened (ms after it), and the lines for those
/// that never came.
fn timeline(
    lab: &Lab,
    which: DemoLab,
    owner: &str,
    old: &Node,
    seen: &Seen,
) -> (Vec<(f64, String)>, Vec<String>) {
    let fault = seen.fault;
    let ms = |t: Instant| t.duration_since(fault).as_secs_f64() * 1e3;
    // The detection threads report in node order; the sort below puts them in time order.
    let mut timeline: Vec<(f64, String)> = vec![(0.0, format!("fault: {owner}'s link down"))];
    let mut missed = Vec::new();
    for (node, at) in &seen.detections {
        match at {
            Some(t) => timeline.push((
                ms(*t),
                if which == DemoLab::Metallb {
                    format!("{node}'s memberlist drops {owner} (its log)")
                } else {
                    format!("{node} declares {owner} down (gossip)")
                },
            )),
            None => missed.push(format!(
                "     ---   {node} never declared {owner} down within 20 s"
            )),
        }
    }
    if let Some(a) = seen
        .announcements
        .iter()
        .filter(|a| a.at >= fault && a.mac != mac(old.mac))
        .min_by_key(|a| a.at)
    {
        let from = lab
            .nodes
            .iter()
            .find(|n| mac(n.mac) == a.mac)
            .map(|n| n.name.clone())
            .unwrap_or_else(|| a.mac.to_string());
        timeline.push((
            ms(a.at),
            format!(
                "first gratuitous ARP / unsolicited NA for {} from {from}",
                a.ip
            ),
        ));
    }
    if let Some(s) = &seen.sample {
        let first = trial::first_other_answer(&seen.records, fault, owner).unwrap_or_default();
        timeline.push((s.failover_ms, format!("first answer from {first}")));
    }
    match &seen.record {
        Some(Some((node, at))) => timeline.push((
            ms(*at),
            format!("the ServiceL2Status record of default/web names {node}"),
        )),
        Some(None) => missed.push(
            "     ---   the ServiceL2Status record did not name another node within 30 s".into(),
        ),
        None => {}
    }
    timeline.sort_by(|a, b| a.0.total_cmp(&b.0));
    (timeline, missed)
}

/// Runs the demo; prints as it goes. `program` is the lab binary (for the speakers).
pub fn run(program: PathBuf, which: DemoLab, out: &mut dyn FnMut(&str)) -> Result<Option<f64>> {
    let product = if which == DemoLab::Metallb {
        "MetalLB"
    } else {
        "swimlb"
    };
    out(&format!(
        "{product} demo: 3 nodes in network namespaces, one VIP (198.51.100.100), a client probing it every 10 ms"
    ));
    if which != DemoLab::Standalone {
        crate::realnode::cleanup_stale();
    }
    let mut lab = Lab::create(3).context("building the lab (needs root)")?;
    let mut workers = Vec::new();
    for node in lab.nodes.clone() {
        workers.extend(probe::spawn_responder(&node.netns, &node.name)?);
    }
    let mut started = start_daemons(&mut lab, program, which, out)?;
    let vip = netns::vip_v4(0);
    let prober = Prober::start(
        &lab.client_netns,
        SocketAddr::from((vip, PROBE_PORT)),
        Duration::from_millis(10),
    )?;
    let watcher = AnnouncementWatcher::start(
        &lab.client_netns,
        vec![IpAddr::V4(vip), IpAddr::V6(netns::vip_v6(0))],
    )?;
    let (owner, old, record) = settle_owner(&lab, &mut started, &prober, out)?;
    out(&format!(
        "{owner} owns 198.51.100.100 (MAC {}): {}, and it alone answers ARP and the probes",
        netns::mac_text(old.mac),
        if which == DemoLab::Metallb {
            "it alone announces it, every speaker's memberlist holds every node"
        } else {
            "every speaker names it"
        }
    ));
    let members = watch_detections(&lab, started.metallb_logs.take(), &owner);
    if started.kubernetes && which != DemoLab::Metallb {
        out(&format!(
            "the ServiceL2Status record of default/web names {owner}"
        ));
    }
    out(&format!("powering {owner} off (its link goes down)"));
    let fault = Instant::now();
    lab.set_link(old.index, false)?;

    let sample = trial::wait_failover(&prober, fault, &owner, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(200));
    let seen = Seen {
        fault,
        sample,
        records: prober.stop(),
        detections: members.join().unwrap_or_default(),
        record: record.map(kubelab::RecordChange::join),
        announcements: watcher.seen(),
    };
    let (timeline, missed) = timeline(&lab, which, &owner, &old, &seen);
    out("timeline (ms after the fault):");
    for (at, what) in &timeline {
        out(&format!("  {at:>7.1}  {what}"));
    }
    for line in &missed {
        out(line);
    }
    let failover_ms = match seen.sample {
        Some(s) => {
            out(&format!(
                "failover: {:.0} ms, {} probes lost",
                s.failover_ms, s.lost_probes
            ));
            Some(s.failover_ms)
        }
        None => {
            out("failover: no other node answered within 20 s");
            None
        }
    };
    out(
        "(keepalived with its defaults takes about 3 s here: swimlb-lab failover --impl keepalived)",
    );
    drop(started);
    drop(workers);
    lab.teardown();
    Ok(failover_ms)
}

fn mac(m: [u8; 6]) -> MacAddr {
    MacAddr(m[0], m[1], m[2], m[3], m[4], m[5])
}
