//! The standalone speaker given bad input on reload, against a real kernel: a running speaker
//! (`standalone::run`, alone, one VIP on a veth in namespace A) is reloaded with a file that
//! does not validate, then with its key file rotated to garbage. It keeps answering ARP for its
//! VIP from namespace B, logs `reload refused` with the reason, counts each refusal in
//! `/metrics`, and a good reload clears the failure gauge. Root only (see `netns/mod.rs`).

mod netns;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use netns::{Lab, arp_answered, require_root};
use swimlb_config::keyfile::{encode_key, write_key_file};
use swimlb_config::standalone::Standalone;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const VIP: &str = "198.51.100.10";
const LISTEN: &str = "198.51.100.1:7572";

/// A log sink the test reads back.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn config_text(keys: &Path, interface: &str) -> String {
    format!(
        "cluster: reload-lab\nnode: a\nbind: 198.51.100.1:7946\nkeyFile: {}\nlisten: {LISTEN}\ngroups:\n  - name: vip\n    addresses: [{VIP}]\n    interface: {interface}\n",
        keys.display()
    )
}

async fn metrics() -> String {
    let mut stream = tokio::net::TcpStream::connect(LISTEN)
        .await
        .expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response");
    response
}

/// Whether namespace B gets an ARP answer for the VIP (arping blocks: off the runtime thread).
async fn answered(b: &str, veth_b: &str) -> bool {
    let (b, vb) = (b.to_string(), veth_b.to_string());
    tokio::task::spawn_blocking(move || arp_answered(&b, &vb, VIP))
        .await
        .expect("arping thread")
}

#[test]
#[ignore = "needs root: network namespaces"]
fn a_broken_file_or_garbage_keys_on_reload_are_refused_counted_and_logged_while_the_vip_is_served()
{
    require_root();
    let lab = Lab::new('r');
    let dir: PathBuf =
        std::env::temp_dir().join(format!("swimlb-reload-lab-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys");
    write_key_file(&keys, &format!("{}\n", encode_key(&[9; 32]))).unwrap();
    let path = dir.join("speaker.yaml");
    let good = config_text(&keys, &lab.veth_a);
    std::fs::write(&path, &good).unwrap();
    let config = Standalone::parse(&good).unwrap();
    let (b, vb) = (lab.b.clone(), lab.veth_b.clone());
    let log = Log::default();
    let sink = log.clone();
    let (paths, dir_for_test) = ((path.clone(), keys.clone()), dir.clone());
    lab.run_in_a(move || async move {
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let (path, keys) = paths;
        let (reload_tx, reload_rx) = tokio::sync::mpsc::channel(1);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let shutdown = Box::pin(async move {
            let _ = stop_rx.await;
        });
        let speaker = tokio::spawn(swimlb_speaker::sources::standalone::run(
            config,
            path.clone(),
            shutdown,
            reload_rx,
        ));
        // Alone, the speaker answers once its start-up hold (3 s) is over.
        let mut serving = false;
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if answered(&b, &vb).await {
                serving = true;
                break;
            }
        }
        assert!(serving, "the VIP was never answered:\n{}", log.text());

        let reload = |expect: &'static str| {
            let tx = reload_tx.clone();
            async move {
                tx.send(()).await.expect("speaker running");
                for _ in 0..50 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if metrics().await.contains(expect) {
                        return;
                    }
                }
                panic!("no `{expect}` in /metrics:\n{}", metrics().await);
            }
        };
        std::fs::write(&path, "cluster: reload-lab\nbind: [198.51.100.1\n").unwrap();
        reload("swimlb_config_reload_failures_total{reason=\"invalid\"} 1").await;
        assert!(
            metrics()
                .await
                .contains("swimlb_config_last_reload_successful 0")
        );
        assert!(answered(&b, &vb).await, "a broken file stopped the VIP");

        std::fs::write(&path, &good).unwrap();
        let mut garbage = std::fs::File::create(&keys).unwrap();
        garbage.write_all(b"\x00\xffnot a key at all\n").unwrap();
        drop(garbage);
        reload("swimlb_config_reload_failures_total{reason=\"keys\"} 1").await;
        assert!(answered(&b, &vb).await, "garbage keys stopped the VIP");

        write_key_file(&keys, &format!("{}\n", encode_key(&[10; 32]))).unwrap();
        reload("swimlb_config_last_reload_successful 1").await;
        assert!(answered(&b, &vb).await, "a good reload stopped the VIP");

        let _ = stop_tx.send(());
        let stopped = tokio::time::timeout(Duration::from_secs(15), speaker).await;
        assert!(
            matches!(stopped, Ok(Ok(Ok(())))),
            "the speaker did not stop cleanly: {stopped:?}"
        );
        let text = log.text();
        for expected in [
            "reload refused: serving the configuration already running reason=\"invalid\"",
            "reload refused: serving the configuration already running reason=\"keys\"",
            "configuration reloaded",
        ] {
            assert!(
                text.contains(expected),
                "no `{expected}` in the log:\n{text}"
            );
        }
    });
    let _ = std::fs::remove_dir_all(&dir_for_test);
}
