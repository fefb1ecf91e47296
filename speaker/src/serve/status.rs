//! What this node reports about the IPs and the members: `/status` and the owner metrics,
//! updated from the engine's deltas, never rebuilt.
//!
//! [`StatusBoard`] holds the `/status` channel. Each
//! [`Action::Status`](crate::model::engine::Action::Status) changes one IP's entry in place. The gauges
//! `swimlb_owner` (this node's view of every IP's owner) and `swimlb_announced` (the IPs this
//! node answers for) are written from those entries at scrape time ([`OwnerGauges`]), under
//! the channel's lock, so a scrape never sees an IP half moved and the speaker keeps no second
//! copy of 10,000 label sets.

use std::net::IpAddr;

use std::fmt::Write as _;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use smol_str::SmolStr;
use tokio::sync::watch;

use crate::model::engine::AddressView;
use crate::model::membership::MemberMeta;
use crate::serve::http::{AddressStatus, ListenerMetrics, MemberStatus, Status};

// The label sets are made at scrape time from `/status`'s entries: the IP as an address and
// the names as `SmolStr`s shared with the engine's views (inline up to 23 bytes, a shared
// `Arc` beyond). Kept in two metric families, they were a sixth of a Kubernetes speaker's heap
// at 10,000 IPs as owned strings, and still 3 MB of label sets and gauges as shared ones.

/// An IP as a label value.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
struct IpLabel(IpAddr);

impl EncodeLabelValue for IpLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        write!(encoder, "{}", self.0)
    }
}

/// A name as a label value.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct Text(SmolStr);

impl EncodeLabelValue for Text {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        encoder.write_str(&self.0)
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AnnouncedLabels {
    ip: IpLabel,
    group_or_service: Text,
    node: Text,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OwnerLabels {
    ip: IpLabel,
    group_or_service: Text,
    owner: Text,
}

/// `/status` and the owner gauges of one speaker.
#[derive(Debug)]
pub struct StatusBoard {
    status: watch::Sender<Status>,
    listener: ListenerMetrics,
}

/// `swimlb_announced` and `swimlb_owner`, written from `/status` at scrape time.
#[derive(Debug)]
struct OwnerGauges {
    node: SmolStr,
    status: watch::Receiver<Status>,
}

impl Collector for OwnerGauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let status = self.status.borrow();
        let mut announced = encoder.encode_descriptor(
            "swimlb_announced",
            "1 while this node answers for the IP",
            None,
            MetricType::Gauge,
        )?;
        for entry in status.addresses.values().filter(|e| answers(e)) {
            let labels = AnnouncedLabels {
                ip: IpLabel(entry.ip),
                group_or_service: Text(entry.group.clone()),
                node: Text(self.node.clone()),
            };
            announced.encode_family(&labels)?.encode_gauge(&1_i64)?;
        }
        let mut owner = encoder.encode_descriptor(
            "swimlb_owner",
            "1 for the owner this node elected for each IP",
            None,
            MetricType::Gauge,
        )?;
        for entry in status.addresses.values() {
            if let Some(name) = &entry.owner {
                let labels = OwnerLabels {
                    ip: IpLabel(entry.ip),
                    group_or_service: Text(entry.group.clone()),
                    owner: Text(name.clone()),
                };
                owner.encode_family(&labels)?.encode_gauge(&1_i64)?;
            }
        }
        Ok(())
    }
}

impl StatusBoard {
    /// A board for `node`, registering its gauges and the HTTP listener's counters in
    /// `registry`.
    pub fn new(node: &str, registry: &mut Registry) -> StatusBoard {
        let board = StatusBoard {
            status: watch::Sender::new(Status {
                node: node.to_string(),
                ..Status::default()
            }),
            listener: ListenerMetrics::register(registry),
        };
        registry.register_collector(Box::new(OwnerGauges {
            node: SmolStr::from(node),
            status: board.status.subscribe(),
        }));
        board
    }

    /// A receiver of `/status` (for the HTTP listener).
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.status.subscribe()
    }

    /// The HTTP listener's counters, registered with the board's gauges (for
    /// [`http::spawn`](crate::serve::http::spawn)).
    pub fn listener_metrics(&self) -> ListenerMetrics {
        self.listener.clone()
    }

    /// The current status.
    pub fn current(&self) -> Status {
        self.status.borrow().clone()
    }

    /// `ip`'s entry changed (`None`: no longer served).
    pub fn address(&self, ip: IpAddr, view: Option<&AddressView>) {
        self.status.send_modify(|status| match view {
            Some(view) => {
                let mut entry = entry(ip, view);
                entry.owner_since = match status.addresses.get(&ip) {
                    Some(held) if held.owner == entry.owner => held.owner_since,
                    _ => unix_now(),
                };
                status.addresses.insert(ip, entry);
            }
            None => {
                status.addresses.remove(&ip);
            }
        });
    }

    /// One member's record changed (`None`: down or left).
    pub fn member(&self, node: &str, record: Option<&MemberMeta>) {
        self.status.send_modify(|status| match record {
            Some(m) => {
                status.members.insert(
                    node.to_string(),
                    MemberStatus {
                        node: m.node.clone(),
                        settled: m.settled,
                        draining: m.draining,
                    },
                );
            }
            None => {
                status.members.remove(node);
            }
        });
    }

    /// Every member at once (start, resynchronisation).
    pub fn members<'a>(&self, records: impl Iterator<Item = &'a MemberMeta>) {
        let members = records
            .map(|m| {
                (
                    m.node.clone(),
                    MemberStatus {
                        node: m.node.clone(),
                        settled: m.settled,
                        draining: m.draining,
                    },
                )
            })
            .collect();
        self.status.send_modify(|status| status.members = members);
    }

    /// Sets the other fields (readiness, draining, checks) through `f`.
    pub fn update(&self, f: impl FnOnce(&mut Status)) {
        self.status.send_modify(f);
    }
}

fn entry(ip: IpAddr, view: &AddressView) -> AddressStatus {
    AddressStatus {
        ip,
        group: view.belongs_to.to_smol_str(),
        owner: view.owner.clone(),
        verdict: view.verdict,
        interfaces: view.links.clone(),
        owner_since: None,
    }
}

/// Whether this node answers for the entry's IP on some link.
fn answers(entry: &AddressStatus) -> bool {
    entry
        .interfaces
        .as_ref()
        .is_some_and(|links| !links.is_empty())
}

/// Seconds since the Unix epoch (the wall clock: `/status` is read by people and other hosts).
fn unix_now() -> Option<f64> {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::snapshot::Owner;

    use crate::serve::http::metrics_text as encode;

    #[test]
    fn a_delta_moves_one_label_set_and_one_entry() {
        let mut registry = Registry::default();
        let board = StatusBoard::new("n1", &mut registry);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        let view = |owner: &str, links: &[&str]| AddressView {
            belongs_to: Owner::group("api"),
            owner: Some(owner.into()),
            verdict: if owner == "n1" {
                crate::model::election::VerdictKind::Owner
            } else {
                crate::model::election::VerdictKind::NotOwner
            },
            links: (!links.is_empty())
                .then(|| std::sync::Arc::new(links.iter().map(|s| s.to_string()).collect())),
        };
        board.address(ip, Some(&view("n1", &["eth0"])));
        board.address(other, Some(&view("n2", &[])));
        let text = encode(&registry);
        assert!(
            text.contains(r#"swimlb_announced{ip="192.0.2.1",group_or_service="api",node="n1"} 1"#)
        );
        assert!(
            text.contains(r#"swimlb_owner{ip="192.0.2.2",group_or_service="api",owner="n2"} 1"#)
        );
        // 192.0.2.1 moves to n3: n1 no longer announces it, and only its owner label changes.
        board.address(ip, Some(&view("n3", &[])));
        let text = encode(&registry);
        assert!(!text.contains("swimlb_announced{"), "{text}");
        assert!(!text.contains(r#"owner="n1""#), "{text}");
        assert!(
            text.contains(r#"swimlb_owner{ip="192.0.2.1",group_or_service="api",owner="n3"} 1"#)
        );
        assert!(
            text.contains(r#"swimlb_owner{ip="192.0.2.2",group_or_service="api",owner="n2"} 1"#)
        );
        let status = board.current();
        assert_eq!(status.addresses[&ip].owner.as_deref(), Some("n3"));
        let since = status.addresses[&ip].owner_since;
        assert!(since.is_some());
        // A delta that keeps the owner keeps the time.
        board.address(ip, Some(&view("n3", &[])));
        assert_eq!(board.current().addresses[&ip].owner_since, since);
        board.address(other, None);
        assert_eq!(board.current().addresses.len(), 1);
        assert!(!encode(&registry).contains(r#"ip="192.0.2.2""#));
    }
}
