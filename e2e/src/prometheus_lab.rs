//! A real Prometheus server (Debian's `prometheus`) in the lab's client namespace, for the tests
//! that evaluate the Grafana dashboard's queries against a running lab (standalone and
//! Kubernetes).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::lab::HTTP_PORT;
use crate::netns::{self, Lab};

/// The `namespace` label the second scrape job of [`LabPrometheus`] adds, as Kubernetes
/// service discovery would.
pub const LAB_NAMESPACE: &str = "swimlb-system";

/// A Prometheus server (Debian's `prometheus`) running in the lab's client namespace, scraping
/// the three speakers over the lab network every second, twice: as standalone speakers are
/// scraped (no `namespace` label) and as Kubernetes ones are (`namespace` [`LAB_NAMESPACE`]).
/// Dropping it kills the server and removes its configuration and data directory.
#[derive(Debug)]
pub struct LabPrometheus {
    child: std::process::Child,
    dir: PathBuf,
    netns: String,
    addr: SocketAddr,
}

impl LabPrometheus {
    /// Where it listens: the client's lab address, so every byte stays inside the lab.
    pub const PORT: u16 = 9090;

    /// Starts the server scraping the lab's speakers, and `more` targets (the Kubernetes lab's
    /// controller) in both jobs.
    pub fn start(lab: &Lab, more: &[SocketAddr]) -> LabPrometheus {
        let program = std::env::var("SWIMLB_PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
        let dir = std::env::temp_dir().join(format!(
            "swimlb-prometheus-{}-{}",
            std::process::id(),
            lab.run_id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).expect("the server's directory");
        let targets: Vec<String> = lab
            .nodes
            .iter()
            .map(|n| format!("'{}:{HTTP_PORT}'", n.v4))
            .chain(more.iter().map(|a| format!("'{a}'")))
            .collect();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 500ms\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: swimlb-speaker\n    static_configs:\n      - targets: [{t}]\n  - job_name: swimlb-speaker-in-{LAB_NAMESPACE}\n    static_configs:\n      - targets: [{t}]\n        labels: {{namespace: {LAB_NAMESPACE}}}\n",
                t = targets.join(", ")
            ),
        )
        .expect("writing prometheus.yml");
        let addr = SocketAddr::from((netns::CLIENT_V4, Self::PORT));
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("the server's log");
        // `ip netns exec` execs the program: the child's pid is the server's.
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &lab.client_netns, &program])
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("the log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("running {program} (apt-get install prometheus; test.sh installs it): {e}")
            });
        LabPrometheus {
            child,
            dir,
            netns: lab.client_netns.clone(),
            addr,
        }
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path` of the server's HTTP API, as JSON (`None`: no answer or not JSON). HTTP/1.0,
    /// so that the answer is never chunked.
    pub fn get(&self, path: &str) -> Option<serde_json::Value> {
        let (addr, path) = (self.addr, path.to_string());
        crate::probe::in_netns(&self.netns, move || {
            use std::io::{Read as _, Write as _};
            let mut s =
                std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            write!(s, "GET {path} HTTP/1.0\r\nHost: lab\r\n\r\n").ok()?;
            let mut text = String::new();
            s.read_to_string(&mut text).ok()?;
            let (_, body) = text.split_once("\r\n\r\n")?;
            serde_json::from_str(body).ok()
        })
        .ok()
        .flatten()
    }

    /// The result vector of an instant query (`Err`: the server's error, or no answer).
    pub fn query(&self, promql: &str) -> Result<Vec<serde_json::Value>, String> {
        let mut encoded = String::new();
        for b in promql.bytes() {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                encoded.push(b as char);
            } else {
                encoded.push_str(&format!("%{b:02X}"));
            }
        }
        let answer = self
            .get(&format!("/api/v1/query?query={encoded}"))
            .ok_or_else(|| format!("no answer to {promql}"))?;
        if answer["status"] != "success" {
            return Err(format!("{promql}: {answer}"));
        }
        match &answer["data"]["result"] {
            serde_json::Value::Array(v) => Ok(v.clone()),
            // A scalar or string result is one value.
            other => Ok(vec![other.clone()]),
        }
    }

    /// How many scrape targets are up.
    pub fn targets_up(&self) -> usize {
        self.get("/api/v1/targets")
            .and_then(|v| {
                Some(
                    v["data"]["activeTargets"]
                        .as_array()?
                        .iter()
                        .filter(|t| t["health"] == "up")
                        .count(),
                )
            })
            .unwrap_or(0)
    }
}

impl Drop for LabPrometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
