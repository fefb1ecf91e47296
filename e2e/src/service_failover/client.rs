//! The client of `service-failover`: a thread in the lab's client namespace (moved there with
//! `setns`, so its clock is the lab's) with a runtime of its own that, against one LoadBalancer
//! IP, opens a new TCP connection and sends one HTTP request every [`PERIOD`], and keeps
//! [`LONG_LIVED`] connections open with a request on each every [`PERIOD`]. Every request is
//! recorded with the time it was sent, when it ended, how it ended ([`Outcome`]), its
//! connection's local port and, when answered, the Pod that answered (`swimlb-echo` answers with
//! its name); a long-lived connection that fails is opened again (the next request on it is a
//! new connection's).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How often a new connection is opened, and a request sent on each long-lived one.
pub const PERIOD: Duration = Duration::from_millis(10);
/// The long-lived connections.
pub const LONG_LIVED: usize = 3;
/// How long a request may take before it counts as failed.
pub const REQUEST_LIMIT: Duration = Duration::from_secs(1);
/// The Services' port.
pub const PORT: u16 = 80;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// `200 OK`.
    Ok,
    /// The connection was not established within [`REQUEST_LIMIT`] (no SYN-ACK).
    ConnectTimeout,
    /// Refused (a reset answering the SYN).
    Refused,
    /// An ICMP error: host or network unreachable.
    Unreachable,
    /// Established, then reset.
    Reset,
    /// Established, but no whole answer within [`REQUEST_LIMIT`].
    AnswerTimeout,
    /// Established, then closed without a `200 OK`.
    Closed,
    /// Any other error.
    Other,
}

impl Outcome {
    /// The outcome of an I/O error; `connected`: whether the connection was established.
    pub fn of_error(e: &std::io::Error, connected: bool) -> Outcome {
        use std::io::ErrorKind as K;
        match e.kind() {
            K::ConnectionRefused => Outcome::Refused,
            K::HostUnreachable | K::NetworkUnreachable => Outcome::Unreachable,
            K::ConnectionReset | K::BrokenPipe | K::ConnectionAborted => Outcome::Reset,
            K::UnexpectedEof => Outcome::Closed,
            K::TimedOut if connected => Outcome::AnswerTimeout,
            K::TimedOut => Outcome::ConnectTimeout,
            _ => Outcome::Other,
        }
    }
}

/// One request.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// When it was sent (the connection opened, for a new one).
    pub sent: Instant,
    /// When it ended (answered, refused, reset or timed out).
    pub done: Instant,
    /// Whether it got `200 OK`.
    pub ok: bool,
    /// How it ended.
    pub outcome: Outcome,
    /// Its connection's local port (0 when the kernel gave none).
    pub port: u16,
    /// The Pod that answered: an index into [`Record::backends`].
    pub backend: Option<usize>,
    /// On a long-lived connection: whether it was the first on a connection opened again.
    pub reopened: bool,
}

/// What the client recorded.
#[derive(Debug, Default)]
pub struct Record {
    /// Each request on a new connection.
    pub new: Vec<Request>,
    /// Each long-lived connection's requests.
    pub long: Vec<Vec<Request>>,
    /// The names of the Pods that answered, in the order first seen.
    pub backends: Vec<String>,
}

impl Record {
    /// The index of backend `name`, added when new.
    fn backend(&mut self, name: Option<String>) -> Option<usize> {
        let name = name?;
        match self.backends.iter().position(|b| *b == name) {
            Some(i) => Some(i),
            None => {
                self.backends.push(name);
                Some(self.backends.len() - 1)
            }
        }
    }
}

/// What one exchange gave: how it ended, the local port, the answering Pod's name.
struct Answer {
    outcome: Outcome,
    port: u16,
    backend: Option<String>,
}

/// A running client; [`Client::stop`] ends it and gives the record.
#[derive(Debug)]
pub struct Client {
    stop: Arc<AtomicBool>,
    record: Arc<Mutex<Record>>,
    thread: Option<JoinHandle<()>>,
}

impl Client {
    /// Starts the client in `netns` against `ip`.
    pub fn start(netns: &str, ip: Ipv4Addr) -> Result<Client> {
        let stop = Arc::new(AtomicBool::new(false));
        let record = Arc::new(Mutex::new(Record {
            new: Vec::new(),
            long: vec![Vec::new(); LONG_LIVED],
            backends: Vec::new(),
        }));
        let (s, r) = (stop.clone(), record.clone());
        let addr = SocketAddr::from((ip, PORT));
        let thread = crate::probe::spawn_in(
            netns,
            "service-client",
            || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("the client's runtime")
            },
            move |rt| rt.block_on(run(addr, s, r)),
        )?;
        Ok(Client {
            stop,
            record,
            thread: Some(thread),
        })
    }

    /// Stops the client (after the requests in flight end) and returns what it recorded.
    pub fn stop(mut self) -> Record {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.record.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

async fn run(addr: SocketAddr, stop: Arc<AtomicBool>, record: Arc<Mutex<Record>>) {
    let mut tasks = Vec::new();
    for i in 0..LONG_LIVED {
        tasks.push(tokio::spawn(long_lived(
            addr,
            i,
            stop.clone(),
            record.clone(),
        )));
    }
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let record = record.clone();
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let answer = one_request(addr, sent + REQUEST_LIMIT).await;
            let done = Instant::now();
            let mut record = record.lock().unwrap_or_else(|e| e.into_inner());
            let request = Request {
                sent,
                done,
                ok: answer.outcome == Outcome::Ok,
                outcome: answer.outcome,
                port: answer.port,
                backend: record.backend(answer.backend),
                reopened: false,
            };
            record.new.push(request);
        }));
        tasks.retain(|t| !t.is_finished());
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// A new connection, one request, `Connection: close`, everything by `deadline`. The socket is
/// connected without a `bind` (as `TcpStream::connect` does, so the kernel picks the port the
/// same way), its port read while the handshake is in flight.
async fn one_request(addr: SocketAddr, deadline: Instant) -> Answer {
    let mut port = 0;
    let mut connected = false;
    let result = tokio::time::timeout_at(deadline, async {
        let (stream, p) = start_connect(addr)?;
        port = p;
        let mut stream = finish_connect(stream).await?;
        connected = true;
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    })
    .await;
    let (outcome, backend) = match result {
        Err(_) if connected => (Outcome::AnswerTimeout, None),
        Err(_) => (Outcome::ConnectTimeout, None),
        Ok(Err(e)) => (Outcome::of_error(&e, connected), None),
        Ok(Ok(answer)) if answer.starts_with(b"HTTP/1.1 200") => {
            (Outcome::Ok, Some(body_name(&answer)))
        }
        Ok(Ok(_)) => (Outcome::Closed, None),
    };
    Answer {
        outcome,
        port,
        backend,
    }
}

/// A non-blocking connect to `addr` started (the SYN sent): the socket and its local port.
fn start_connect(addr: SocketAddr) -> std::io::Result<(Socket, u16)> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_nonblocking(true)?;
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let port = socket.local_addr()?.as_socket().map_or(0, |a| a.port());
    Ok((socket, port))
}

/// The connection of [`start_connect`] once established (or its error).
async fn finish_connect(socket: Socket) -> std::io::Result<TcpStream> {
    let stream = TcpStream::from_std(std::net::TcpStream::from(socket))?;
    stream.writable().await?;
    if let Some(e) = stream.take_error()? {
        return Err(e);
    }
    Ok(stream)
}

/// The answer's body, trimmed: `swimlb-echo`'s Pod name.
fn body_name(answer: &[u8]) -> String {
    let text = String::from_utf8_lossy(answer);
    text.split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .trim()
        .to_string()
}

/// One long-lived connection: a request every [`PERIOD`], opened again after a failure.
async fn long_lived(
    addr: SocketAddr,
    index: usize,
    stop: Arc<AtomicBool>,
    record: Arc<Mutex<Record>>,
) {
    let mut conn: Option<BufReader<TcpStream>> = None;
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut opened_before = false;
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let sent = Instant::now();
        let reopened = conn.is_none() && opened_before;
        let result = tokio::time::timeout(REQUEST_LIMIT, async {
            if conn.is_none() {
                conn = Some(BufReader::new(TcpStream::connect(addr).await?));
            }
            let stream = conn.as_mut().expect("opened above");
            keep_alive_request(stream).await
        })
        .await;
        let port = conn
            .as_ref()
            .and_then(|c| c.get_ref().local_addr().ok())
            .map_or(0, |a| a.port());
        let (outcome, backend) = match result {
            Ok(Ok(Some(name))) => (Outcome::Ok, Some(name)),
            Ok(Ok(None)) => (Outcome::Closed, None),
            Ok(Err(e)) => (Outcome::of_error(&e, conn.is_some()), None),
            Err(_) if conn.is_some() => (Outcome::AnswerTimeout, None),
            Err(_) => (Outcome::ConnectTimeout, None),
        };
        let ok = outcome == Outcome::Ok;
        if ok {
            opened_before = true;
        } else {
            conn = None;
        }
        let mut record = record.lock().unwrap_or_else(|e| e.into_inner());
        let request = Request {
            sent,
            done: Instant::now(),
            ok,
            outcome,
            port,
            backend: record.backend(backend),
            reopened,
        };
        record.long[index].push(request);
    }
}

/// One request on an open connection; reads the answer's head and its body: the answering Pod's
/// name after a `200 OK`, `None` after another status.
async fn keep_alive_request(stream: &mut BufReader<TcpStream>) -> std::io::Result<Option<String>> {
    stream
        .get_mut()
        .write_all(b"GET / HTTP/1.1\r\nHost: lb\r\n\r\n")
        .await?;
    let mut line = String::new();
    let mut length = 0usize;
    let mut status_ok = None;
    loop {
        line.clear();
        if stream.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if status_ok.is_none() {
            status_ok = Some(line.starts_with("HTTP/1.1 200"));
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length.min(4096)];
    stream.read_exact(&mut body).await?;
    Ok((status_ok == Some(true)).then(|| String::from_utf8_lossy(&body).trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    #[test]
    fn an_error_is_named_by_whether_the_connection_was_established() {
        let cases = [
            (ErrorKind::ConnectionRefused, false, Outcome::Refused),
            (ErrorKind::HostUnreachable, false, Outcome::Unreachable),
            (ErrorKind::ConnectionReset, true, Outcome::Reset),
            (ErrorKind::TimedOut, false, Outcome::ConnectTimeout),
            (ErrorKind::TimedOut, true, Outcome::AnswerTimeout),
            (ErrorKind::UnexpectedEof, true, Outcome::Closed),
            (ErrorKind::InvalidData, true, Outcome::Other),
        ];
        for (kind, established, outcome) in cases {
            assert_eq!(
                Outcome::of_error(&Error::from(kind), established),
                outcome,
                "{kind:?}, established: {established}"
            );
        }
    }

    #[test]
    fn the_backend_is_the_answers_body() {
        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\necho-abc\n";
        assert_eq!(body_name(answer), "echo-abc");
        assert_eq!(body_name(b"HTTP/1.1 200 OK\r\n"), "");
    }

    #[test]
    fn backends_are_numbered_in_the_order_first_seen() {
        let mut r = Record::default();
        assert_eq!(r.backend(Some("a".into())), Some(0));
        assert_eq!(r.backend(Some("b".into())), Some(1));
        assert_eq!(r.backend(Some("a".into())), Some(0));
        assert_eq!(r.backend(None), None);
        assert_eq!(r.backends, ["a", "b"]);
    }
}
