//! `swimlb-speaker status [ADDR] [--watch]`: a running speaker's `/status` as terminal tables,
//! the way `kubectl get` prints: every VIP with its owner, interface and verdict, the members
//! with their state, this node's checks.
//!
//! [`render`] is the pure part (a parsed [`StatusView`] and the time in, text out). [`fetch`]
//! is one plain HTTP/1.1 `GET /status`; [`run`] prints once or, with `--watch`, redraws every
//! second until Ctrl-C. The view types accept what any speaker version serves: missing fields
//! take their defaults and unknown ones are ignored.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs as _};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use serde::Deserialize;

/// The port of a speaker's HTTP listener when ADDR names none.
pub const DEFAULT_PORT: u16 = 7572;
/// The address `status` asks when given none.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7572";
/// How long one request may take, connection included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How often `--watch` redraws.
pub const WATCH_PERIOD: Duration = Duration::from_secs(1);

/// What `/status` serves ([`crate::serve::http::Status`]), as read back.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct StatusView {
    /// The speaker's node.
    pub node: String,
    /// Joined the mesh (or alone by configuration).
    pub ready: bool,
    /// Shutting down.
    pub draining: bool,
    /// Alive members.
    pub members: Vec<MemberView>,
    /// Every VIP.
    pub addresses: Vec<AddressView>,
    /// This node's checks.
    pub checks: Vec<CheckView>,
}

/// One alive member.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct MemberView {
    /// Node name.
    pub node: String,
    /// Up for at least its preemption delay.
    pub settled: bool,
    /// Shutting down.
    pub draining: bool,
}

/// One VIP.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct AddressView {
    /// The address.
    pub ip: String,
    /// Group (standalone) or `namespace/service`.
    pub group: String,
    /// The owner this node elected.
    pub owner: Option<String>,
    /// This node's verdict.
    pub verdict: String,
    /// The interfaces this node answers for it on.
    pub interfaces: Vec<String>,
    /// When this node last saw the owner change, in seconds since the Unix epoch. `/status`
    /// does not serve it yet; the SINCE column shows `-` until it does.
    pub owner_since: Option<f64>,
}

/// One health check.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct CheckView {
    /// Group.
    pub group: String,
    /// Check.
    pub check: String,
    /// Passing after hysteresis.
    pub passing: bool,
    /// The last outcome.
    pub last: String,
}

/// Why `/status` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// ADDR is neither `host:port`, `host` nor an `http://` URL of one.
    #[error("{0:?} is not an address (host:port, host, or http://host:port)")]
    BadAddress(String),
    /// ADDR's host did not resolve.
    #[error("{addr}: cannot resolve: {source}")]
    Resolve {
        /// ADDR.
        addr: String,
        /// The resolver's error.
        source: std::io::Error,
    },
    /// Nothing answered at the address.
    #[error("cannot reach the speaker at {addr}: {source} (is it running, and listening there?)")]
    Connect {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The request did not complete in time.
    #[error("the speaker at {0} did not answer within {REQUEST_TIMEOUT:?}")]
    Timeout(SocketAddr),
    /// The HTTP exchange failed.
    #[error("the speaker at {addr}: HTTP: {source}")]
    Http {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: hyper::Error,
    },
    /// `/status` answered something else than 200.
    #[error("the speaker at {addr} answered {code} to GET /status")]
    Status {
        /// The address.
        addr: SocketAddr,
        /// The status code.
        code: hyper::StatusCode,
    },
    /// The body is not the JSON of `/status`.
    #[error("the speaker at {addr} sent a /status that is not its JSON: {source}")]
    Json {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: serde_json::Error,
    },
}

/// The socket address `addr` names: `host:port`, `[v6]:port`, a bare host or IP (port
/// [`DEFAULT_PORT`]), or any of these after `http://` and before a `/`.
pub fn resolve(addr: &str) -> Result<SocketAddr, StatusError> {
    let bare = addr.strip_prefix("http://").unwrap_or(addr);
    let bare = bare.split('/').next().unwrap_or_default();
    if bare.is_empty() {
        return Err(StatusError::BadAddress(addr.to_string()));
    }
    if let Ok(socket) = bare.parse::<SocketAddr>() {
        return Ok(socket);
    }
    let unbracketed = bare.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = unbracketed.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, DEFAULT_PORT));
    }
    let with_port = match bare.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => bare.to_string(),
        Some(_) => return Err(StatusError::BadAddress(addr.to_string())),
        None => format!("{bare}:{DEFAULT_PORT}"),
    };
    let resolve_error = |source| StatusError::Resolve {
        addr: addr.to_string(),
        source,
    };
    with_port
        .to_socket_addrs()
        .map_err(resolve_error)?
        .next()
        .ok_or_else(|| resolve_error(std::io::Error::other("no address")))
}

/// `GET /status` from the speaker at `addr`, within [`REQUEST_TIMEOUT`].
pub async fn fetch(addr: SocketAddr) -> Result<StatusView, StatusError> {
    tokio::time::timeout(REQUEST_TIMEOUT, fetch_unbounded(addr))
        .await
        .unwrap_or(Err(StatusError::Timeout(addr)))
}

async fn fetch_unbounded(addr: SocketAddr) -> Result<StatusView, StatusError> {
    let http = |source| StatusError::Http { addr, source };
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|source| StatusError::Connect { addr, source })?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(http)?;
    let driver = tokio::spawn(connection);
    let request = hyper::Request::get("/status")
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .unwrap_or_default();
    let response = sender.send_request(request).await.map_err(http)?;
    let code = response.status();
    let body = response.into_body().collect().await.map_err(http)?;
    driver.abort();
    if code != hyper::StatusCode::OK {
        return Err(StatusError::Status { addr, code });
    }
    serde_json::from_slice(&body.to_bytes()).map_err(|source| StatusError::Json { addr, source })
}

/// The tables for `status`, with ages relative to `now`.
pub fn render(status: &StatusView, now: SystemTime) -> String {
    let now = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let state = if status.draining {
        "draining"
    } else if status.ready {
        "ready"
    } else {
        "joining"
    };
    let mut out = table(
        &["NODE", "STATE"],
        vec![vec![status.node.clone(), state.into()]],
    );
    out.push('\n');
    if status.addresses.is_empty() {
        out.push_str("No VIPs.\n");
    } else {
        let rows = status
            .addresses
            .iter()
            .map(|a| {
                vec![
                    a.ip.clone(),
                    a.group.clone(),
                    a.owner.clone().unwrap_or_else(|| "<none>".into()),
                    dash_if_empty(a.interfaces.join(",")),
                    a.verdict.clone(),
                    a.owner_since.map_or_else(|| "-".into(), |t| age(now - t)),
                ]
            })
            .collect();
        out.push_str(&table(
            &["VIP", "GROUP", "OWNER", "INTERFACE", "VERDICT", "SINCE"],
            rows,
        ));
    }
    out.push('\n');
    if status.members.is_empty() {
        out.push_str("No members.\n");
    } else {
        let rows = status
            .members
            .iter()
            .map(|m| {
                let state = if m.draining { "draining" } else { "alive" };
                let settled = if m.settled { "yes" } else { "no" };
                vec![m.node.clone(), state.into(), settled.into()]
            })
            .collect();
        out.push_str(&table(&["MEMBER", "STATE", "SETTLED"], rows));
    }
    out.push('\n');
    if status.checks.is_empty() {
        out.push_str("No checks.\n");
    } else {
        let rows = status
            .checks
            .iter()
            .map(|c| {
                let state = if c.passing { "passing" } else { "failing" };
                vec![
                    c.group.clone(),
                    c.check.clone(),
                    state.into(),
                    dash_if_empty(c.last.clone()),
                ]
            })
            .collect();
        out.push_str(&table(&["GROUP", "CHECK", "STATE", "LAST"], rows));
    }
    out
}

fn dash_if_empty(s: String) -> String {
    if s.is_empty() { "-".into() } else { s }
}

/// Columns padded to their widest cell and three spaces apart, as `kubectl get` prints them.
fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}   ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A duration in seconds as `kubectl` shows ages: `45s`, `3m12s`, `5h3m`, `2d4h`.
fn age(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

/// Prints the tables of the speaker at `addr` once, or with `watch` every [`WATCH_PERIOD`]
/// until Ctrl-C (redrawn in place on a terminal, one after another otherwise). Once: an error
/// when the speaker cannot be read. Watching: a failed read is shown in its frame and the
/// command keeps trying.
pub async fn run(addr: SocketAddr, watch: bool, terminal: bool) -> Result<(), StatusError> {
    if !watch {
        let status = fetch(addr).await?;
        print!("{}", render(&status, SystemTime::now()));
        return Ok(());
    }
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut first = true;
    loop {
        let frame = match fetch(addr).await {
            Ok(status) => render(&status, SystemTime::now()),
            Err(e) => format!("swimlb-speaker: {e}\n"),
        };
        let mut stdout = std::io::stdout().lock();
        let separator = match (terminal, first) {
            // Cursor home, clear the screen.
            (true, _) => "\x1b[H\x1b[2J",
            (false, true) => "",
            (false, false) => "\n",
        };
        let _ = write!(
            stdout,
            "{separator}Every {}s: {addr}\n\n{frame}",
            WATCH_PERIOD.as_secs()
        );
        let _ = stdout.flush();
        drop(stdout);
        first = false;
        tokio::select! {
            _ = &mut interrupted => return Ok(()),
            _ = tokio::time::sleep(WATCH_PERIOD) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> StatusView {
        serde_json::from_value(serde_json::json!({
            "node": "node1",
            "ready": true,
            "draining": false,
            "members": [
                {"node": "node1", "settled": true, "draining": false},
                {"node": "node2", "settled": false, "draining": true},
            ],
            "addresses": [
                {"ip": "198.51.100.100", "group": "api", "owner": "node1", "verdict": "owner",
                 "interface": "eth0", "interfaces": ["eth0", "eth1"]},
                {"ip": "2001:db8:100::100", "group": "api", "owner": null,
                 "verdict": "no_candidates", "interface": null, "interfaces": []},
                {"ip": "198.51.100.101", "group": "ingress-long-name", "owner": "node2",
                 "verdict": "not_owner", "interfaces": [], "owner_since": 1000.0},
            ],
            "checks": [
                {"group": "api", "check": "healthz", "passing": true, "last": "pass"},
                {"group": "ingress-long-name", "check": "tcp", "passing": false, "last": "timeout"},
            ],
        }))
        .unwrap()
    }

    #[test]
    fn every_vip_member_and_check_gets_a_row_under_aligned_headers() {
        let now = UNIX_EPOCH + Duration::from_secs(1192);
        assert_eq!(
            render(&status(), now),
            "\
NODE    STATE
node1   ready

VIP                 GROUP               OWNER    INTERFACE   VERDICT         SINCE
198.51.100.100      api                 node1    eth0,eth1   owner           -
2001:db8:100::100   api                 <none>   -           no_candidates   -
198.51.100.101      ingress-long-name   node2    -           not_owner       3m12s

MEMBER   STATE      SETTLED
node1    alive      yes
node2    draining   no

GROUP               CHECK     STATE     LAST
api                 healthz   passing   pass
ingress-long-name   tcp       failing   timeout
"
        );
    }

    #[test]
    fn an_empty_speaker_says_so_instead_of_printing_bare_headers() {
        let status = StatusView {
            node: "n".into(),
            draining: true,
            ..StatusView::default()
        };
        assert_eq!(
            render(&status, UNIX_EPOCH),
            "NODE   STATE\nn      draining\n\nNo VIPs.\n\nNo members.\n\nNo checks.\n"
        );
    }

    #[test]
    fn what_the_speaker_serves_reads_back_into_the_view() {
        use crate::serve::http::{AddressStatus, CheckStatus, MemberStatus, Status};
        let ip: IpAddr = "198.51.100.100".parse().unwrap();
        let served = Status {
            node: "node1".into(),
            ready: false,
            draining: false,
            members: [(
                "node1".to_string(),
                MemberStatus {
                    node: "node1".into(),
                    settled: true,
                    draining: false,
                },
            )]
            .into(),
            addresses: [(
                ip,
                AddressStatus {
                    ip,
                    group: "vip".into(),
                    owner: Some("node1".into()),
                    verdict: crate::model::election::VerdictKind::Owner,
                    interfaces: Some(std::sync::Arc::new(["eth0".to_string()].into())),
                    owner_since: None,
                },
            )]
            .into(),
            checks: vec![CheckStatus {
                group: "vip".into(),
                check: "flag".into(),
                passing: true,
                last: "pass".into(),
            }],
        };
        let view: StatusView = serde_json::from_slice(&serde_json::to_vec(&served).unwrap())
            .expect("the view reads what /status serves");
        assert_eq!(view.node, "node1");
        assert_eq!(view.addresses[0].owner.as_deref(), Some("node1"));
        assert_eq!(view.addresses[0].interfaces, ["eth0"]);
        assert_eq!(view.members[0].node, "node1");
        assert!(view.checks[0].passing);
        assert!(render(&view, UNIX_EPOCH).contains("node1   joining"));
    }

    #[test]
    fn ages_read_like_kubectls() {
        assert_eq!(age(-3.0), "0s");
        assert_eq!(age(59.9), "59s");
        assert_eq!(age(192.0), "3m12s");
        assert_eq!(age(5.0 * 3600.0 + 180.0), "5h3m");
        assert_eq!(age(2.0 * 86400.0 + 4.0 * 3600.0), "2d4h");
    }

    #[test]
    fn addresses_take_the_default_port_and_an_optional_scheme() {
        let v4: SocketAddr = "127.0.0.1:7572".parse().unwrap();
        assert_eq!(resolve("127.0.0.1:7572").unwrap(), v4);
        assert_eq!(resolve("127.0.0.1").unwrap(), v4);
        assert_eq!(resolve("http://127.0.0.1:7572/status").unwrap(), v4);
        assert_eq!(
            resolve("[::1]").unwrap(),
            "[::1]:7572".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(
            resolve("[::1]:9000").unwrap(),
            "[::1]:9000".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(resolve("localhost:9000").unwrap().port(), 9000);
        assert!(matches!(resolve(""), Err(StatusError::BadAddress(_))));
        assert!(matches!(
            resolve("host:notaport"),
            Err(StatusError::BadAddress(_))
        ));
    }

    #[tokio::test]
    async fn fetch_reads_a_live_listener_and_names_the_address_it_cannot_reach() {
        use crate::serve::http::Status;
        let (_tx, rx) = tokio::sync::watch::channel(Status {
            node: "node7".into(),
            ready: true,
            ..Status::default()
        });
        let registry = std::sync::Arc::new(prometheus_client::registry::Registry::default());
        let (addr, task) = crate::serve::http::spawn(
            "127.0.0.1:0".parse().unwrap(),
            rx,
            registry,
            crate::serve::http::ListenerMetrics::default(),
        )
        .await
        .unwrap();
        let view = fetch(addr).await.expect("/status from the listener");
        assert_eq!((view.node.as_str(), view.ready), ("node7", true));
        task.abort();
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap();
        let err = fetch(closed).await.expect_err("nothing listens there");
        assert!(matches!(err, StatusError::Connect { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with(&format!("cannot reach the speaker at {closed}")),
            "{err}"
        );
    }
}
