//! A Pod's sandbox: its node's network namespace on the host network, else a namespace of its
//! own with a veth on the lab bridge, an address from [`POD_IPS`] and kube-proxy's DNAT of the
//! `kubernetes` Service.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::Ordering;

use anyhow::{Result, bail};
use serde_json::Value;

use super::spec::text;
use super::{POD_IPS, Shared, install_service_proxy, run};
use crate::netns::{self, Node};

/// Where a Pod's containers run and the addresses its status reports.
#[derive(Debug, Clone)]
pub(super) struct Sandbox {
    pub(super) netns: String,
    pub(super) pod_ip: IpAddr,
    pub(super) host_ip: IpAddr,
    pub(super) hostname: String,
    /// Made for the Pod (deleted with it), not its node's.
    own: bool,
}

impl Sandbox {
    /// The Pod's sandbox on `node`: its namespace, or a new one on the lab bridge.
    pub(super) fn make(shared: &Shared, node: &Node, pod: &Value) -> Result<Sandbox> {
        let name = text(pod, "/metadata/name").unwrap_or_default();
        if pod["spec"]["hostNetwork"] == true {
            return Ok(Sandbox {
                netns: node.netns.clone(),
                pod_ip: IpAddr::V4(node.v4),
                host_ip: IpAddr::V4(node.v4),
                hostname: node.name.clone(),
                own: false,
            });
        }
        let k = shared.next_pod_ip.fetch_add(1, Ordering::Relaxed);
        if k > POD_IPS.1 {
            bail!(
                "the lab has no Pod address left (198.51.100.{}-{})",
                POD_IPS.0,
                POD_IPS.1
            );
        }
        let ip = Ipv4Addr::new(198, 51, 100, k);
        let netns = format!("{}{}-p{k}", netns::PREFIX, shared.run_id);
        let port = format!("p{k}");
        let sw = shared.switch_netns.as_str();
        run("ip", &["netns", "add", &netns])?;
        let sandbox = Sandbox {
            netns: netns.clone(),
            pod_ip: IpAddr::V4(ip),
            host_ip: IpAddr::V4(node.v4),
            hostname: name.to_string(),
            own: true,
        };
        let mac = netns::mac_text([0x02, 0, 0, 0, 0x01, k]);
        let address = format!("{ip}/{}", netns::PREFIX_V4);
        let steps: [&[&str]; 6] = [
            &[
                "link", "add", "eth0", "netns", &netns, "address", &mac, "type", "veth", "peer",
                "name", &port, "netns", sw,
            ],
            &["-n", sw, "link", "set", &port, "master", "br0", "up"],
            &["-n", &netns, "link", "set", "lo", "up"],
            &["-n", &netns, "addr", "add", &address, "dev", "eth0"],
            &["-n", &netns, "link", "set", "eth0", "up"],
            &["-n", &netns, "route", "add", "default", "dev", "eth0"],
        ];
        for args in steps {
            if let Err(e) = run("ip", args) {
                sandbox.remove();
                return Err(e);
            }
        }
        install_service_proxy(&netns, shared.service, shared.api)
            .inspect_err(|_| sandbox.remove())?;
        Ok(sandbox)
    }

    /// Deletes the Pod's own namespace (its veth goes with it).
    pub(super) fn remove(&self) {
        if self.own {
            let _ = run("ip", &["netns", "del", &self.netns]);
        }
    }
}
