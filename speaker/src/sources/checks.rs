//! Health checks of the standalone mode: `http`/`https`, `tcp` and `exec`, with keepalived's
//! rise/fall hysteresis.
//!
//! [`Hysteresis`] is the pure part: consecutive results in, a state change out. [`probe`] runs one
//! check once, bounded by its timeout, and returns a typed [`Outcome`]. [`spawn`] runs a check on
//! its interval and reports every state change on a channel; the speaker folds those into the
//! metadata it gossips ([`crate::model::membership::CheckResult`]). [`CheckTasks`] owns the running
//! checks of a configuration.
//!
//! On a reload ([`CheckTasks::reload`]) a check keeps running, with its hysteresis state, when
//! its group and name are the same and its probe is the same ([`unchanged_checks`], pure; the
//! weight only matters to the election). Every other check starts again *failing*, as at start-up,
//! and the caller resets what it gossips for it to match
//! ([`crate::model::local::LocalState::reload`]): a fresh task and a kept `passing = true` would
//! disagree, and the task would swallow the first failure. Events carry the id of the task that
//! sent them, so an event still queued from a stopped task is recognised and dropped.
//!
//! A check starts *failing*: a node does not claim a VIP for a service it has not yet seen
//! healthy `rise` times in a row. (keepalived starts scripts as passing unless `init_fail`; for a
//! VIP in front of an API server the cautious start is the better default, and a healthy node
//! becomes eligible after `rise x interval`.)

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use swimlb_config::standalone::{Check, CheckKind, Standalone};
use tokio::sync::mpsc;

use crate::model::local::CheckKey;
use crate::sources::scripts::{self, Ran};

/// Consecutive-result hysteresis: `rise` passes to become passing, `fall` failures to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hysteresis {
    rise: u32,
    fall: u32,
    passing: bool,
    streak: u32,
}

impl Hysteresis {
    /// Starts failing.
    pub fn new(rise: u32, fall: u32) -> Hysteresis {
        Hysteresis {
            rise: rise.max(1),
            fall: fall.max(1),
            passing: false,
            streak: 0,
        }
    }

    /// The current state.
    pub fn passing(&self) -> bool {
        self.passing
    }

    /// Records one result; returns the new state when it changed.
    pub fn observe(&mut self, ok: bool) -> Option<bool> {
        if ok == self.passing {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        let needed = if ok { self.rise } else { self.fall };
        if self.streak >= needed {
            self.passing = ok;
            self.streak = 0;
            Some(ok)
        } else {
            None
        }
    }
}

/// The result of running a check once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The check passed.
    Pass,
    /// It did not answer within its timeout.
    Timeout,
    /// The connection was not established (refused, unreachable, DNS).
    Connect,
    /// TLS handshake failed (certificate, protocol).
    Tls,
    /// HTTP answered with an unexpected status.
    Status(u16),
    /// The HTTP exchange failed after connecting.
    Http,
    /// The program exited with a non-zero status (or a signal: `-1`).
    Exit(i32),
    /// The program could not be started.
    Spawn,
    /// The program was not started: its path became writable by another user, or its user is
    /// gone ([`crate::sources::scripts::run`]).
    Refused,
}

impl Outcome {
    /// Whether this counts as a pass.
    pub fn ok(&self) -> bool {
        matches!(self, Outcome::Pass)
    }

    /// A stable label for logs and metrics.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Timeout => "timeout",
            Outcome::Connect => "connect",
            Outcome::Tls => "tls",
            Outcome::Status(_) => "status",
            Outcome::Http => "http",
            Outcome::Exit(_) => "exit",
            Outcome::Spawn => "spawn",
            Outcome::Refused => "refused",
        }
    }
}

/// TLS client configurations for `https` checks, built once.
#[derive(Clone)]
pub struct Tls {
    verified: Arc<rustls::ClientConfig>,
    insecure: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

impl Tls {
    /// Loads the system's root certificates (missing ones only weaken verified checks).
    pub fn new() -> Tls {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        let verified = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map(|b| b.with_root_certificates(roots).with_no_client_auth())
            .expect("ring supports the default protocol versions");
        let insecure = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map(|b| {
                b.dangerous()
                    .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
                    .with_no_client_auth()
            })
            .expect("ring supports the default protocol versions");
        Tls {
            verified: Arc::new(verified),
            insecure: Arc::new(insecure),
        }
    }
}

impl Default for Tls {
    fn default() -> Self {
        Tls::new()
    }
}

/// `insecure: true`: any certificate, but the handshake signatures are still checked.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Runs `kind` once, bounded by `timeout`. An exec check runs as [`scripts::run`] runs programs
/// (its process group killed on the timeout).
pub async fn probe(kind: &CheckKind, timeout: Duration, tls: &Tls) -> Outcome {
    if let CheckKind::Exec { argv, user } = kind {
        let Some((program, args)) = argv.split_first() else {
            return Outcome::Spawn;
        };
        return match scripts::run(program, args, user.as_ref(), timeout).await {
            Ran::Exited(status) if status.success() => Outcome::Pass,
            Ran::Exited(status) => Outcome::Exit(status.code().unwrap_or(-1)),
            Ran::Timeout => Outcome::Timeout,
            Ran::Spawn(_) => Outcome::Spawn,
            Ran::Refused(error) => {
                tracing::warn!(%program, %error, "exec check not run");
                Outcome::Refused
            }
        };
    }
    match tokio::time::timeout(timeout, probe_unbounded(kind, tls)).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::Timeout,
    }
}

async fn probe_unbounded(kind: &CheckKind, tls: &Tls) -> Outcome {
    match kind {
        CheckKind::Tcp { target } => match tokio::net::TcpStream::connect(target.as_str()).await {
            Ok(_) => Outcome::Pass,
            Err(_) => Outcome::Connect,
        },
        // Run by `probe`, which bounds it itself.
        CheckKind::Exec { .. } => Outcome::Spawn,
        CheckKind::Http {
            url,
            insecure,
            expect_status,
        } => http_get(url, *insecure, *expect_status, tls).await,
    }
}

/// Splits `http(s)://host[:port]/path` into (tls, host, port, path).
fn split_url(url: &str) -> Option<(bool, &str, u16, &str)> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else {
        (false, url.strip_prefix("http://")?)
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let default_port = if tls { 443 } else { 80 };
    let (host, port) = if let Some(stripped) = authority.strip_prefix('[') {
        let end = stripped.find(']')?;
        let host = &stripped[..end];
        let port = match &stripped[end + 1..] {
            "" => default_port,
            p => p.strip_prefix(':')?.parse().ok()?,
        };
        (host, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().ok()?),
            None => (authority, default_port),
        }
    };
    if host.is_empty() {
        return None;
    }
    Some((tls, host, port, path))
}

async fn http_get(url: &str, insecure: bool, expect: Option<u16>, tls: &Tls) -> Outcome {
    use http_body_util::Empty;
    use hyper_util::rt::TokioIo;

    let Some((use_tls, host, port, path)) = split_url(url) else {
        return Outcome::Http;
    };
    let Ok(tcp) = tokio::net::TcpStream::connect((host, port)).await else {
        return Outcome::Connect;
    };
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .header(hyper::header::USER_AGENT, "swimlb-speaker")
        .body(Empty::<bytes::Bytes>::new());
    let Ok(request) = request else {
        return Outcome::Http;
    };
    let status = if use_tls {
        let config = if insecure {
            tls.insecure.clone()
        } else {
            tls.verified.clone()
        };
        let Ok(name) = rustls::pki_types::ServerName::try_from(host.to_string()) else {
            return Outcome::Tls;
        };
        let Ok(stream) = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
        else {
            return Outcome::Tls;
        };
        send(TokioIo::new(stream), request).await
    } else {
        send(TokioIo::new(tcp), request).await
    };
    match status {
        Some(code) if expect.map_or((200..300).contains(&code), |e| e == code) => Outcome::Pass,
        Some(code) => Outcome::Status(code),
        None => Outcome::Http,
    }
}

async fn send<T>(io: T, request: hyper::Request<http_body_util::Empty<bytes::Bytes>>) -> Option<u16>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.ok()?;
    let driver = tokio::spawn(conn);
    let response = sender.send_request(request).await.ok();
    driver.abort();
    Some(response?.status().as_u16())
}

/// Whether a check defined as `next` may go on from the state of one defined as `previous`:
/// same name and same probe (what runs, how often, its timeout, rise and fall). The weight only
/// changes what a result is worth, not the result.
pub fn same_probe(previous: &Check, next: &Check) -> bool {
    previous.name == next.name
        && previous.kind == next.kind
        && previous.interval == next.interval
        && previous.timeout == next.timeout
        && previous.rise == next.rise
        && previous.fall == next.fall
}

/// The checks of `next` that keep the running state of their namesake in `previous` (same group
/// name, [`same_probe`]); every other check of `next` starts again, failing.
pub fn unchanged_checks(previous: &Standalone, next: &Standalone) -> BTreeSet<CheckKey> {
    let before: BTreeMap<CheckKey, &Check> = keyed(previous).collect();
    keyed(next)
        .filter(|(key, check)| before.get(key).is_some_and(|old| same_probe(old, check)))
        .map(|(key, _)| key)
        .collect()
}

fn keyed(config: &Standalone) -> impl Iterator<Item = (CheckKey, &Check)> {
    config.groups.iter().flat_map(|g| {
        g.checks
            .iter()
            .map(move |c| (CheckKey::new(&g.name, &c.name), c))
    })
}

/// A check's state changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckEvent {
    /// The task that ran the check (see [`CheckTasks::is_current`]).
    pub task: u64,
    /// The check.
    pub key: CheckKey,
    /// New state.
    pub passing: bool,
    /// The outcome of the run that caused the change.
    pub outcome: Outcome,
}

/// Runs `check` every `interval` until the receiver of `events` is dropped, sending an event on
/// every state change. It starts failing ([`Hysteresis::new`]).
pub fn spawn(
    task: u64,
    key: CheckKey,
    check: Check,
    tls: Tls,
    events: mpsc::Sender<CheckEvent>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut state = Hysteresis::new(check.rise.get(), check.fall.get());
        let mut ticker = tokio::time::interval(check.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let outcome = probe(&check.kind, check.timeout, &tls).await;
            if let Some(passing) = state.observe(outcome.ok()) {
                let event = CheckEvent {
                    task,
                    key: key.clone(),
                    passing,
                    outcome,
                };
                if events.send(event).await.is_err() {
                    return;
                }
            } else if events.is_closed() {
                return;
            }
        }
    })
}

/// One running check.
#[derive(Debug)]
struct Running {
    task: u64,
    check: Check,
    handle: tokio::task::JoinHandle<()>,
}

/// The running checks of a configuration, one task each.
#[derive(Debug)]
pub struct CheckTasks {
    running: BTreeMap<CheckKey, Running>,
    next_task: u64,
    tls: Tls,
    events: mpsc::Sender<CheckEvent>,
}

impl CheckTasks {
    /// Starts every check of `config`; each reports on `events`.
    pub fn start(config: &Standalone, tls: Tls, events: mpsc::Sender<CheckEvent>) -> CheckTasks {
        let mut tasks = CheckTasks {
            running: BTreeMap::new(),
            next_task: 0,
            tls,
            events,
        };
        for (key, check) in keyed(config) {
            tasks.spawn(key, check.clone());
        }
        tasks
    }

    fn spawn(&mut self, key: CheckKey, check: Check) {
        let task = self.next_task;
        self.next_task += 1;
        let handle = spawn(
            task,
            key.clone(),
            check.clone(),
            self.tls.clone(),
            self.events.clone(),
        );
        self.running.insert(
            key,
            Running {
                task,
                check,
                handle,
            },
        );
    }

    /// Moves to `next`: unchanged checks keep running untouched, removed and changed ones stop,
    /// changed and new ones start (failing). Returns the unchanged ones.
    pub fn reload(&mut self, next: &Standalone) -> BTreeSet<CheckKey> {
        let wanted: BTreeMap<CheckKey, &Check> = keyed(next).collect();
        let mut kept = BTreeSet::new();
        let keys: Vec<CheckKey> = self.running.keys().cloned().collect();
        for key in keys {
            let unchanged = wanted
                .get(&key)
                .zip(self.running.get(&key))
                .is_some_and(|(check, running)| same_probe(&running.check, check));
            if unchanged {
                kept.insert(key);
            } else if let Some(running) = self.running.remove(&key) {
                running.handle.abort();
            }
        }
        for (key, check) in wanted {
            match self.running.get_mut(&key) {
                // Same probe: only the weight may differ; the task does not use it.
                Some(running) => running.check = check.clone(),
                None => self.spawn(key, check.clone()),
            }
        }
        kept
    }

    /// Whether `event` comes from the task now running its check (not one stopped by a reload
    /// after it sent the event).
    pub fn is_current(&self, event: &CheckEvent) -> bool {
        self.running
            .get(&event.key)
            .is_some_and(|r| r.task == event.task)
    }

    /// Stops every check.
    pub fn stop(self) {
        for running in self.running.into_values() {
            running.handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rise_and_fall_need_consecutive_results() {
        let mut h = Hysteresis::new(3, 2);
        assert!(!h.passing());
        assert_eq!(h.observe(true), None);
        assert_eq!(h.observe(true), None);
        assert_eq!(h.observe(false), None, "a failure resets the rise streak");
        assert_eq!(h.observe(true), None);
        assert_eq!(h.observe(true), None);
        assert_eq!(h.observe(true), Some(true));
        assert_eq!(h.observe(false), None);
        assert_eq!(h.observe(true), None, "a pass resets the fall streak");
        assert_eq!(h.observe(false), None);
        assert_eq!(h.observe(false), Some(false));
    }

    #[test]
    fn rise_and_fall_of_one_follow_every_result() {
        let mut h = Hysteresis::new(1, 1);
        assert_eq!(h.observe(true), Some(true));
        assert_eq!(h.observe(true), None);
        assert_eq!(h.observe(false), Some(false));
    }

    #[test]
    fn urls_split_into_host_port_and_path() {
        assert_eq!(
            split_url("https://localhost:6443/readyz"),
            Some((true, "localhost", 6443, "/readyz"))
        );
        assert_eq!(
            split_url("http://192.0.2.1"),
            Some((false, "192.0.2.1", 80, "/"))
        );
        assert_eq!(
            split_url("https://[2001:db8::1]/x?y=1"),
            Some((true, "2001:db8::1", 443, "/x?y=1"))
        );
        assert_eq!(
            split_url("http://[2001:db8::1]:8080/"),
            Some((false, "2001:db8::1", 8080, "/"))
        );
        assert_eq!(split_url("ftp://x/"), None);
        assert_eq!(split_url("http://:80/"), None);
        assert_eq!(split_url("http://h:notaport/"), None);
    }

    fn tcp(target: String) -> CheckKind {
        CheckKind::Tcp { target }
    }

    #[tokio::test]
    async fn tcp_check_passes_on_a_listener_and_fails_without() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tls = Tls::new();
        assert_eq!(
            probe(&tcp(addr.to_string()), Duration::from_secs(2), &tls).await,
            Outcome::Pass
        );
        // A port bound but not listening refuses, and stays this test's: a port a dropped
        // listener freed may be taken meanwhile by a test running beside this one.
        let closed = tokio::net::TcpSocket::new_v4().unwrap();
        closed.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let closed_addr = closed.local_addr().unwrap();
        assert_eq!(
            probe(&tcp(closed_addr.to_string()), Duration::from_secs(2), &tls).await,
            Outcome::Connect
        );
        drop(listener);
    }

    #[tokio::test]
    async fn exec_check_reports_the_exit_status() {
        let tls = Tls::new();
        let run = |argv: &[&str]| CheckKind::Exec {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            user: None,
        };
        assert_eq!(
            probe(&run(&["true"]), Duration::from_secs(5), &tls).await,
            Outcome::Pass
        );
        assert_eq!(
            probe(&run(&["sh", "-c", "exit 3"]), Duration::from_secs(5), &tls).await,
            Outcome::Exit(3)
        );
        assert_eq!(
            probe(&run(&["/nonexistent/check"]), Duration::from_secs(5), &tls).await,
            Outcome::Spawn
        );
        assert_eq!(
            probe(&run(&["sleep", "5"]), Duration::from_millis(100), &tls).await,
            Outcome::Timeout
        );
    }

    /// A one-shot HTTP server answering every request with `status`.
    async fn http_server(status: u16) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = s.write_all(reply.as_bytes()).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn http_check_passes_on_2xx_and_names_other_statuses() {
        let tls = Tls::new();
        let ok = http_server(200).await;
        let down = http_server(503).await;
        let get = |addr: std::net::SocketAddr, expect| CheckKind::Http {
            url: format!("http://{addr}/readyz"),
            insecure: false,
            expect_status: expect,
        };
        assert_eq!(
            probe(&get(ok, None), Duration::from_secs(2), &tls).await,
            Outcome::Pass
        );
        assert_eq!(
            probe(&get(down, None), Duration::from_secs(2), &tls).await,
            Outcome::Status(503)
        );
        assert_eq!(
            probe(&get(down, Some(503)), Duration::from_secs(2), &tls).await,
            Outcome::Pass
        );
        assert_eq!(
            probe(&get(ok, Some(204)), Duration::from_secs(2), &tls).await,
            Outcome::Status(200)
        );
    }

    #[tokio::test]
    async fn https_check_against_a_plain_server_is_a_tls_failure() {
        let tls = Tls::new();
        let plain = http_server(200).await;
        let kind = CheckKind::Http {
            url: format!("https://{plain}/"),
            insecure: true,
            expect_status: None,
        };
        assert_eq!(
            probe(&kind, Duration::from_secs(2), &tls).await,
            Outcome::Tls
        );
    }

    fn two_groups(api_checks: &str, web_checks: &str, order_web_first: bool) -> Standalone {
        let api = format!("{{name: api, addresses: [192.0.2.100], checks: [{api_checks}]}}");
        let web = format!("{{name: web, addresses: [192.0.2.101], checks: [{web_checks}]}}");
        let groups = if order_web_first {
            format!("[{web}, {api}]")
        } else {
            format!("[{api}, {web}]")
        };
        Standalone::parse(&format!(
            "cluster: c\nbind: 192.0.2.10\ninsecure: true\ngroups: {groups}"
        ))
        .unwrap()
    }

    fn keys(list: &[(&str, &str)]) -> BTreeSet<CheckKey> {
        list.iter().map(|(g, c)| CheckKey::new(g, c)).collect()
    }

    #[test]
    fn a_reload_keeps_the_state_of_checks_whose_probe_is_unchanged_even_when_reordered() {
        let before = two_groups(
            "{name: lb, tcp: 'h:1', weight: 20}, {name: be, tcp: 'h:2'}",
            "{name: ok, exec: /bin/true}",
            false,
        );
        assert_eq!(
            unchanged_checks(&before, &before),
            keys(&[("api", "lb"), ("api", "be"), ("web", "ok")])
        );
        let reordered = two_groups(
            "{name: be, tcp: 'h:2'}, {name: lb, tcp: 'h:1', weight: 5}",
            "{name: ok, exec: /bin/true}",
            true,
        );
        assert_eq!(
            unchanged_checks(&before, &reordered),
            keys(&[("api", "lb"), ("api", "be"), ("web", "ok")]),
            "order and weight do not restart a check"
        );
    }

    #[test]
    fn a_reload_restarts_changed_new_and_renamed_checks() {
        let before = two_groups(
            "{name: lb, tcp: 'h:1'}, {name: be, tcp: 'h:2', interval: 1s}",
            "{name: ok, exec: /bin/true}",
            false,
        );
        let after = two_groups(
            "{name: lb, tcp: 'h:9'}, {name: be, tcp: 'h:2', interval: 2s}, {name: new, tcp: 'h:3'}",
            "{name: ok2, exec: /bin/true}",
            false,
        );
        assert_eq!(unchanged_checks(&before, &after), BTreeSet::new());
        let rise = two_groups(
            "{name: lb, tcp: 'h:1', rise: 2}, {name: be, tcp: 'h:2', interval: 1s}",
            "{name: ok, exec: /bin/true, fall: 5}",
            false,
        );
        assert_eq!(unchanged_checks(&before, &rise), keys(&[("api", "be")]));
    }

    /// Real time, but the only bound waited for is one that can only make the test pass
    /// wrongly on a slow machine, never fail: a restarted task reports at its first run.
    #[tokio::test]
    async fn reloaded_tasks_keep_their_state_and_restarted_ones_report_afresh() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap();
        let config = |interval: &str| {
            Standalone::parse(&format!(
                "cluster: c\nbind: 192.0.2.10\ninsecure: true\ngroups: [{{name: api, addresses: [192.0.2.100], checks: [{{name: lb, tcp: '{target}', interval: {interval}, timeout: 40ms}}]}}]"
            ))
            .unwrap()
        };
        let (tx, mut rx) = mpsc::channel(8);
        let mut tasks = CheckTasks::start(&config("50ms"), Tls::new(), tx);
        let first = rx.recv().await.unwrap();
        assert!(first.passing);
        assert!(tasks.is_current(&first));

        assert_eq!(tasks.reload(&config("50ms")), keys(&[("api", "lb")]));
        assert!(
            tasks.is_current(&first),
            "the unchanged check kept its task"
        );
        let quiet = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await;
        assert!(
            quiet.is_err(),
            "an unchanged check does not start again from failing: {quiet:?}"
        );

        assert_eq!(tasks.reload(&config("60ms")), BTreeSet::new());
        assert!(
            !tasks.is_current(&first),
            "events of the stopped task are recognised"
        );
        let again = rx.recv().await.unwrap();
        assert!(again.passing && tasks.is_current(&again));
        assert_ne!(again.task, first.task);
        tasks.stop();
    }

    #[tokio::test(start_paused = true)]
    async fn spawned_check_reports_rise_after_three_passes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let check = Check {
            name: "lb".into(),
            kind: tcp(listener.local_addr().unwrap().to_string()),
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            rise: std::num::NonZeroU32::new(3).unwrap(),
            fall: std::num::NonZeroU32::new(2).unwrap(),
            weight: 0,
        };
        let (tx, mut rx) = mpsc::channel(4);
        let start = tokio::time::Instant::now();
        let task = spawn(0, CheckKey::new("api", "lb"), check, Tls::new(), tx);
        let event = rx.recv().await.unwrap();
        assert_eq!(
            event,
            CheckEvent {
                task: 0,
                key: CheckKey::new("api", "lb"),
                passing: true,
                outcome: Outcome::Pass
            }
        );
        // Ticks at 0 s, 1 s and 2 s: the third pass makes it passing.
        assert_eq!(start.elapsed().as_secs(), 2);
        task.abort();
    }
}
