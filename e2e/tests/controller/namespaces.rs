//! Pools outside the speakers' namespace, and namespace selectors.

use super::*;

/// The reasons of the Events written in `namespace`.
async fn reasons_in(client: &Client, namespace: &str) -> Vec<String> {
    events(client, namespace)
        .await
        .into_iter()
        .filter_map(|e| e.reason)
        .collect()
}

#[tokio::test]
async fn a_pool_in_another_namespace_hands_out_nothing_and_gets_a_warning_event() {
    let (api, client) = lab().await;
    api.create_namespace("a-team").expect("namespace a-team");
    create_pool_in(
        &client,
        "a-team",
        "cheap",
        json!({"addresses": ["198.51.100.0/30"]}),
    )
    .await;
    let ctl = Controller::start(&api, "c-0");
    create_service(&client, &service("web", json!({}), json!({}))).await;
    let note = wait_event(&client, "a-team", "cheap", "IgnoredOutsideNamespace").await;
    assert!(
        note.contains("cheap") && note.contains("swimlb-system"),
        "{note}"
    );
    // No pool in force: the Service waits with a Warning, and the pool elsewhere gets no status.
    let note = wait_event(&client, "default", "web", "AllocationFailed").await;
    assert!(!note.contains("198.51.100"), "{note}");
    assert_eq!(ips_of(&client, "web").await, Vec::<String>::new());
    let strays: Api<IPAddressPool> = Api::namespaced(client.clone(), "a-team");
    let stray = strays.get("cheap").await.expect("the pool elsewhere");
    assert!(stray.status.is_none(), "{:?}", stray.status);
    // A pool where the speakers read theirs serves it.
    create_pool(&client, "lab", json!({"addresses": ["192.0.2.48/30"]})).await;
    let ips = wait_assigned(&client, "web").await;
    assert!(ips[0].starts_with("192.0.2.4"), "{ips:?}");
    // The pool elsewhere is reported once, not at every change of it.
    strays
        .patch(
            "cheap",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .expect("labelled");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reported = reasons_in(&client, "a-team")
        .await
        .iter()
        .filter(|r| *r == "IgnoredOutsideNamespace")
        .count();
    assert_eq!(reported, 1, "{}", ctl.log_text());
    assert_eq!(ctl.terminate().await, Some(0));
}

#[tokio::test]
async fn an_overlapping_pool_in_a_namespace_that_sorts_first_does_not_reject_the_real_one() {
    let (api, client) = lab().await;
    api.create_namespace("a-team").expect("namespace a-team");
    create_pool_in(
        &client,
        "a-team",
        "a-lab",
        json!({"addresses": ["192.0.2.56/29"]}),
    )
    .await;
    create_pool(&client, "lab", json!({"addresses": ["192.0.2.60/30"]})).await;
    let ctl = Controller::start(&api, "c-0");
    create_service(&client, &service("web", json!({}), json!({}))).await;
    let ips = wait_assigned(&client, "web").await;
    let last: u8 = ips[0].rsplit('.').next().unwrap().parse().unwrap();
    assert!((60..64).contains(&last), "{ips:?} is not lab's");
    let pools: Api<IPAddressPool> = Api::namespaced(client.clone(), "swimlb-system");
    eventually("a Valid=True condition on the real pool", || async {
        let status = pools.get("lab").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Valid" && c.status == "True")
    })
    .await;
    wait_event(&client, "a-team", "a-lab", "IgnoredOutsideNamespace").await;
    let reasons = reasons_in(&client, "swimlb-system").await;
    assert!(
        !reasons.iter().any(|r| r == "InvalidConfiguration"),
        "{reasons:?}\n{}",
        ctl.log_text()
    );
    assert_eq!(ctl.terminate().await, Some(0));
}

#[tokio::test]
async fn an_invalid_pool_in_another_namespace_does_not_freeze_pool_changes() {
    let (api, client) = lab().await;
    api.create_namespace("a-team").expect("namespace a-team");
    create_pool(&client, "first", json!({"addresses": ["192.0.2.64/32"]})).await;
    let ctl = Controller::start(&api, "c-0");
    create_service(&client, &service("one", json!({}), json!({}))).await;
    assert_eq!(wait_assigned(&client, "one").await, vec!["192.0.2.64"]);
    // The API server accepts a backwards range; swimlb would refuse it, were it read.
    create_pool_in(
        &client,
        "a-team",
        "broken",
        json!({"addresses": ["192.0.2.9-192.0.2.8"]}),
    )
    .await;
    wait_event(&client, "a-team", "broken", "IgnoredOutsideNamespace").await;
    // A pool change in swimlb-system after it still comes into force.
    create_pool(&client, "second", json!({"addresses": ["192.0.2.72/32"]})).await;
    create_service(&client, &service("two", json!({}), json!({}))).await;
    assert_eq!(
        wait_assigned(&client, "two").await,
        vec!["192.0.2.72"],
        "{}",
        ctl.log_text()
    );
    let reasons = reasons_in(&client, "a-team").await;
    assert!(
        !reasons.iter().any(|r| r == "InvalidConfiguration"),
        "{reasons:?}"
    );
    assert_eq!(ctl.terminate().await, Some(0));
}
