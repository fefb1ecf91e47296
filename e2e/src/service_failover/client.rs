//! The client of `service-failover`: a thread in the lab's client namespace (moved there with
//! `setns`, so its clock is the lab's) with a runtime of its own that, against one LoadBalancer
//! IP, opens a new TCP connection and sends one HTTP request every [`PERIOD`], and keeps
//! [`LONG_LIVED`] connections open with a request on each every [`PERIOD`]. Every request is
//! recorded with the time it was sent, when it ended and whether it got `200 OK`; a long-lived
//! connection that fails is opened again (the next request on it is a new connection's).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context as _, Result};
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

/// One request.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// When it was sent (the connection opened, for a new one).
    pub sent: Instant,
    /// When it ended (answered, refused, reset or timed out).
    pub done: Instant,
    /// Whether it got `200 OK`.
    pub ok: bool,
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
            let ok = tokio::time::timeout(REQUEST_LIMIT, one_request(addr))
                .await
                .is_ok_and(|r| r.unwrap_or(false));
            let done = Instant::now();
            let request = Request {
                sent,
                done,
                ok,
                reopened: false,
            };
            record
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .new
                .push(request);
        }));
        tasks.retain(|t| !t.is_finished());
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// A new connection, one request, `Connection: close`.
async fn one_request(addr: SocketAddr) -> std::io::Result<bool> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")
        .await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    Ok(answer.starts_with(b"HTTP/1.1 200"))
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
        let ok = matches!(result, Ok(Ok(true)));
        if ok {
            opened_before = true;
        } else {
            conn = None;
        }
        let request = Request {
            sent,
            done: Instant::now(),
            ok,
            reopened,
        };
        record.lock().unwrap_or_else(|e| e.into_inner()).long[index].push(request);
    }
}

/// One request on an open connection; reads the answer's head and its body.
async fn keep_alive_request(stream: &mut BufReader<TcpStream>) -> std::io::Result<bool> {
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
    Ok(status_ok == Some(true))
}
