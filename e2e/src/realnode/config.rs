//! The configuration files of one real node, as text (pure: no I/O): containerd's, the
//! kubelet's, kube-proxy's and the CNI network's. Every path is under the node's own folder, so
//! nodes of one machine share nothing but the kernel; [`crate::realnode`] writes them.
//!
//! Why each kubelet setting is what it is (the lab's book page, "Real nodes", says the same):
//! - `failCgroupV1: false`: these machines have every controller on cgroup v1 (an empty cgroup2
//!   hierarchy mounted beside them at /sys/fs/cgroup/unified). The kubelet refuses cgroup v1
//!   unless told otherwise; its support is deprecated, not gone.
//! - `cgroupDriver: cgroupfs`: no systemd runs here (PID 1 is not systemd), so the kubelet and
//!   runc write the cgroup files themselves; containerd's runc options say the same
//!   (`SystemdCgroup = false`), as the two must agree.
//! - `cgroupsPerQOS: true` with `cgroupRoot: /<node>`: each node's Pods live under a cgroup
//!   subtree of their own (`/<node>/kubepods/...` in every v1 hierarchy), so two nodes on one
//!   machine neither see nor evict each other's Pods, and teardown removes one subtree. The
//!   kubelet refuses a `cgroupRoot` that does not exist: the lab makes it first.
//! - `enforceNodeAllocatable: [pods]`: the default; only the Pods' cgroup gets limits, not the
//!   machine's system or kubelet cgroups, which the lab does not own.
//! - `podLogsDir`, `volumePluginDir`, `resolvConf` and `--root-dir`: the node's own folder,
//!   not the machine's /var/log/pods, /usr/libexec/kubernetes and /var/lib/kubelet.
//! - `imageGCHighThresholdPercent: 100`: the images were imported, not pulled (no registry is
//!   reachable): a garbage collection would delete what no pull could bring back.
//! - `evictionHard` at 256 MiB of disk: the default (10 %) evicts Pods of a node whose folder
//!   sits on a developer's nearly full disk, which has nothing to do with what the lab tests; 1 %
//!   was still too much on a shared 252 GB disk with 1.4 GB free (the nodes under DiskPressure
//!   admitted no Pod). A share of a large disk says little; what the node needs is a margin.
//! - `authentication.x509` with the cluster's CA, webhooks off, `authorization: AlwaysAllow`:
//!   the API server reaches the kubelet (logs, exec) with its client certificate; no other
//!   client is on the lab's network.
//! - `failSwapOn: false`: a developer's machine may have swap; the lab's Pods do not care.
//! - `syncFrequency: 10s` (default 1 minute): the kubelet rewrites a mounted Secret only at its
//!   next sync of the Pod, so the gossip key rotation's three steps waited 66-88 s each with the
//!   default, 3-4 minutes of every CI run. Nothing else the lab tests depends on it (probes,
//!   status and the Pod lifecycle are not on this timer).

use std::net::Ipv4Addr;
use std::path::Path;

/// The paths and addresses one node's files name.
#[derive(Debug, Clone)]
pub struct NodeFiles<'a> {
    /// The node's folder (everything it writes is under it).
    pub dir: &'a Path,
    /// The node's name (the Node object's, the kubelet's `--hostname-override`).
    pub name: &'a str,
    /// The node's address on the lab's network.
    pub ip: Ipv4Addr,
    /// The Pods' subnet on this node (`203.0.113.0/27` for the first).
    pub pod_cidr: &'a str,
    /// The cgroup subtree of the node (`/swimlb-node-...`), in every hierarchy.
    pub cgroup_root: &'a str,
    /// The folder of the CNI plugins.
    pub cni_bin: &'a Path,
    /// The cluster's CA certificate.
    pub ca: &'a Path,
}

impl NodeFiles<'_> {
    fn path(&self, rest: &str) -> String {
        self.dir.join(rest).display().to_string()
    }

    /// containerd's socket.
    pub fn containerd_socket(&self) -> String {
        self.path("containerd.sock")
    }

    /// containerd's configuration (version 3): its own root, state, sockets and plugin folder;
    /// the CRI with runc from the machine (cgroupfs, its own state folder), the node's CNI
    /// folders and the pause image the lab imports, the Pods' network namespaces under its
    /// state folder (not the machine's /run/netns); NRI off (its socket is one per machine).
    /// `restrict_oom_score_adj`: root here lacks CAP_SYS_RESOURCE, so no process may lower
    /// its `oom_score_adj` below containerd's; the kubelet asks -998 for every Pod sandbox, and
    /// runc failed each with "can't get final child's PID from pipe: EOF" until containerd
    /// raised it to its own score.
    pub fn containerd_toml(&self, runc: &Path, sandbox_image: &str) -> String {
        format!(
            r#"version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{sandbox_image}"

[plugins."io.containerd.cri.v1.runtime"]
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{runc_root}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"
"#,
            root = self.path("containerd/root"),
            state = self.path("containerd/state"),
            socket = self.containerd_socket(),
            opt = self.path("containerd/opt"),
            runc = runc.display(),
            runc_root = self.path("containerd/runc"),
            cni_bin = self.cni_bin.display(),
            cni_conf = self.path("cni/net.d"),
        )
    }

    /// The CNI network of the node's Pods: a bridge `cni0` that is their gateway, addresses from
    /// [`NodeFiles::pod_cidr`] kept in the node's folder, and port mappings.
    pub fn cni_conflist(&self) -> String {
        serde_json::to_string_pretty(&serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "swimlb-lab",
            "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
                 "hairpinMode": true,
                 "ipam": {"type": "host-local", "dataDir": self.path("cni/ipam"),
                          "ranges": [[{"subnet": self.pod_cidr}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        }))
        .unwrap_or_default()
    }

    /// The KubeletConfiguration (see the module's documentation for each setting).
    pub fn kubelet_yaml(&self) -> String {
        format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: true
cgroupRoot: {cgroup_root}
enforceNodeAllocatable: [pods]
containerRuntimeEndpoint: unix://{socket}
imageServiceEndpoint: unix://{socket}
address: {ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
clusterDomain: cluster.local
resolvConf: {resolv}
podLogsDir: {logs}
volumePluginDir: {plugins}
failSwapOn: false
syncFrequency: 10s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 256Mi
  nodefs.inodesFree: 1%
  imagefs.available: 256Mi
"#,
            cgroup_root = self.cgroup_root,
            socket = self.containerd_socket(),
            ip = self.ip,
            ca = self.ca.display(),
            resolv = self.path("resolv.conf"),
            logs = self.path("pod-logs"),
            plugins = self.path("volume-plugins"),
        )
    }

    /// kube-proxy's configuration in `mode` (`nftables` or `iptables`), with kube-proxy's
    /// ServiceAccount kubeconfig at `kubeconfig`. `conntrack.maxPerCore: 0`: the conntrack
    /// table's size is a machine-wide setting that a network namespace cannot write.
    pub fn kube_proxy_yaml(&self, mode: &str, kubeconfig: &Path, cluster_cidr: &str) -> String {
        format!(
            r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
hostnameOverride: {name}
bindAddress: {ip}
mode: {mode}
clusterCIDR: {cluster_cidr}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
"#,
            kubeconfig = kubeconfig.display(),
            name = self.name,
            ip = self.ip,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path) -> NodeFiles<'_> {
        NodeFiles {
            dir,
            name: "node1",
            ip: Ipv4Addr::new(198, 51, 100, 11),
            pod_cidr: "203.0.113.0/27",
            cgroup_root: "/swimlb-node-1-node1",
            cni_bin: Path::new("/cache/cni"),
            ca: Path::new("/k8s/ca.crt"),
        }
    }

    #[test]
    fn every_path_of_a_node_is_under_its_folder_or_names_a_shared_program() {
        let dir = Path::new("/tmp/swimlb-node-1-node1");
        let f = files(dir);
        let texts = [
            f.containerd_toml(Path::new("/usr/sbin/runc"), "localhost/pause:1"),
            f.kubelet_yaml(),
            f.cni_conflist(),
            f.kube_proxy_yaml(
                "nftables",
                &dir.join("kube-proxy.kubeconfig"),
                "203.0.113.0/24",
            ),
        ];
        let shared = ["/usr/sbin/runc", "/cache/cni", "/k8s/ca.crt"];
        for text in texts {
            for word in text.split(['"', ' ', '\n', ',', '[', ']', '{', '}']) {
                let word = word.trim_start_matches("unix://");
                if word.starts_with('/') && !word.starts_with("/swimlb-node-") {
                    assert!(
                        word.starts_with(dir.to_str().unwrap()) || shared.contains(&word),
                        "{word} is outside the node's folder in:\n{text}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_cni_network_is_valid_json_on_the_nodes_pod_subnet() {
        let dir = Path::new("/tmp/n");
        let net: serde_json::Value = serde_json::from_str(&files(dir).cni_conflist()).unwrap();
        assert_eq!(net["plugins"][0]["type"], "bridge");
        assert_eq!(
            net["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "203.0.113.0/27"
        );
        assert_eq!(net["plugins"][0]["ipam"]["dataDir"], "/tmp/n/cni/ipam");
    }

    #[test]
    fn the_kubelet_configuration_parses_as_yaml_with_the_settings_this_machine_needs() {
        let dir = Path::new("/tmp/n");
        let yaml: serde_json::Value = serde_saphyr::from_str(&files(dir).kubelet_yaml()).unwrap();
        assert_eq!(yaml["failCgroupV1"], false);
        assert_eq!(yaml["cgroupDriver"], "cgroupfs");
        assert_eq!(yaml["cgroupRoot"], "/swimlb-node-1-node1");
        assert_eq!(
            yaml["containerRuntimeEndpoint"],
            "unix:///tmp/n/containerd.sock"
        );
        assert_eq!(yaml["authentication"]["anonymous"]["enabled"], false);
        let proxy: serde_json::Value = serde_saphyr::from_str(&files(dir).kube_proxy_yaml(
            "iptables",
            Path::new("/tmp/n/kp"),
            "203.0.113.0/24",
        ))
        .unwrap();
        assert_eq!(proxy["mode"], "iptables");
        assert_eq!(proxy["conntrack"]["maxPerCore"], 0);
    }
}
