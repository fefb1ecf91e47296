//! `swimlb-echo`, the backend the lab's real nodes run behind LoadBalancer Services: an HTTP/1.1
//! server on port 8080 that answers every request with `200 OK` and the Pod's name (from
//! `$HOSTNAME`), keeping the connection open (keep-alive) unless the client asks to close it.
//! One file with no dependency, compiled by `rustc` alone for the musl target (static), so the
//! image is this program and nothing else (`e2e/src/realnode/image.rs`, `Builder::echo_image`).
//! Bad input closes the connection; nothing panics.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};

/// The largest request head read before the connection is closed.
const MAX_HEAD: usize = 8192;

fn main() {
    let port = std::env::var("PORT").unwrap_or_else(|_| "8080".into());
    let listener = match TcpListener::bind(format!("0.0.0.0:{port}")) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("swimlb-echo: binding port {port}: {e}");
            std::process::exit(1);
        }
    };
    let name = std::env::var("HOSTNAME").unwrap_or_else(|_| "swimlb-echo".into());
    eprintln!("swimlb-echo: {name} listening on port {port}");
    for stream in listener.incoming().flatten() {
        let name = name.clone();
        std::thread::spawn(move || serve(stream, &name));
    }
}

/// Answers the requests of one connection until it closes or asks to.
fn serve(stream: TcpStream, name: &str) {
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let body = format!("{name}\n");
    loop {
        let mut head = 0;
        let mut close = false;
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(n) => head += n,
            }
            if head > MAX_HEAD {
                return;
            }
            let lower = line.to_ascii_lowercase();
            if lower.starts_with("connection:") && lower.contains("close") {
                close = true;
            }
            if line == "\r\n" || line == "\n" {
                break;
            }
        }
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{}\r\n{body}",
            body.len(),
            if close { "Connection: close\r\n" } else { "" }
        );
        if writer.write_all(answer.as_bytes()).is_err() || close {
            return;
        }
    }
}
