//! Exit codes of the command line.

use super::*;

#[tokio::test]
async fn a_bad_flag_exits_64_and_an_unreadable_kubeconfig_exits_69() {
    let run = |args: &'static [&'static str]| async move {
        Command::new(env!("CARGO_BIN_EXE_swimlb-lab"))
            .arg("controller")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .expect("runs")
            .code()
    };
    assert_eq!(
        bounded("a bad flag", run(&["--no-such-flag"])).await,
        Some(64)
    );
    assert_eq!(
        bounded(
            "a missing kubeconfig",
            run(&[
                "--kubeconfig",
                "/nonexistent/swimlb.kubeconfig",
                "--listen",
                "127.0.0.1:0"
            ])
        )
        .await,
        Some(69)
    );
}
