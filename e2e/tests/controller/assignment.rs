//! Assignment: pools, Services, restarts, exhaustion, sharing keys, dual stack, invalid pools, metrics.

use super::*;

#[tokio::test]
async fn pools_and_services_go_in_and_addresses_events_pool_status_and_metrics_come_out() {
    let (api, client) = lab().await;
    create_pool(&client, "lab", json!({"addresses": ["192.0.2.8/29"]})).await;
    let ctl = Controller::start(&api, "c-0");
    for name in ["web", "api", "db"] {
        create_service(&client, &service(name, json!({}), json!({}))).await;
    }
    let mut seen = BTreeSet::new();
    for name in ["web", "api", "db"] {
        let ips = wait_assigned(&client, name).await;
        assert_eq!(ips.len(), 1, "{name}: {ips:?}");
        assert!(ips[0].starts_with("192.0.2."), "{ips:?}");
        let last: u8 = ips[0].rsplit('.').next().unwrap().parse().unwrap();
        assert!((8..16).contains(&last), "{ips:?} outside the pool");
        assert!(seen.insert(ips[0].clone()), "{} handed out twice", ips[0]);
        let note = wait_event(&client, "default", name, "IPAllocated").await;
        assert!(note.contains(&ips[0]) && note.contains("lab"), "{note}");
    }
    let pools: Api<IPAddressPool> = Api::namespaced(client.clone(), "swimlb-system");
    eventually("the pool status to count 3 assigned", || async {
        let status = pools.get("lab").await.ok()?.status?;
        (status.assigned_ipv4 == 3 && status.available_ipv4 == 5).then_some(())
    })
    .await;
    let (line, body) = eventually("/metrics", || ctl.get("/metrics")).await;
    assert!(line.contains("200"), "{line}");
    assert!(
        body.contains("swimlb_pool_addresses_in_use{pool=\"lab\",family=\"ipv4\"} 3"),
        "{body}"
    );
    let (line, _) = eventually("/readyz", || ctl.get("/readyz")).await;
    assert!(line.contains("200"), "{line}");

    // A deleted Service releases its address; the pool status follows.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .delete("web", &DeleteParams::default())
        .await
        .expect("deleted");
    eventually("the pool status to count 2 assigned", || async {
        let status = pools.get("lab").await.ok()?.status?;
        (status.assigned_ipv4 == 2).then_some(())
    })
    .await;
    assert_eq!(ctl.terminate().await, Some(0), "a clean exit on SIGTERM");
}

#[tokio::test]
async fn the_leader_creates_the_gossip_key_secret_once_and_never_changes_it() {
    let (api, client) = lab().await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "default");
    let first = Controller::start(&api, "c-0");
    let secret = eventually("the gossip key Secret", || async {
        secrets.get_opt("swimlb-gossip-key").await.ok().flatten()
    })
    .await;
    let keys = secret
        .data
        .as_ref()
        .and_then(|d| d.get("keys"))
        .map(|b| String::from_utf8(b.0.clone()).unwrap())
        .expect("the key file");
    assert_eq!(
        swimlb_config::keyfile::parse_key_file(&keys).map(|k| k.len()),
        Ok(1),
        "one key in the speakers' key file format: {keys:?}"
    );
    let version = secret.metadata.resource_version.clone();
    assert_eq!(first.terminate().await, Some(0));
    // A new leader finds it and leaves it alone (rotation is the operator's).
    let second = Controller::start(&api, "c-1");
    eventually("the second leader", || async {
        (lease_holder(&client).await.as_deref() == Some("c-1")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = secrets.get("swimlb-gossip-key").await.unwrap();
    assert_eq!(
        again.metadata.resource_version,
        version,
        "{}",
        second.log_text()
    );
    assert_eq!(second.terminate().await, Some(0));
}

#[tokio::test]
async fn a_restart_keeps_every_address_and_a_service_created_meanwhile_gets_a_free_one() {
    let (api, client) = lab().await;
    create_pool(&client, "lab", json!({"addresses": ["192.0.2.16/29"]})).await;
    let first = Controller::start(&api, "c-0");
    let names = ["m1", "m2", "m3", "m4"];
    for name in names {
        create_service(&client, &service(name, json!({}), json!({}))).await;
    }
    let mut before = Vec::new();
    for name in names {
        before.push(wait_assigned(&client, name).await);
    }
    assert_eq!(first.terminate().await, Some(0));
    // Created while no controller runs; sorts before the others, so a controller that assigned
    // before loading the existing statuses would hand it the lowest address, already in use.
    create_service(&client, &service("a-late", json!({}), json!({}))).await;
    let second = Controller::start(&api, "c-1");
    let late = wait_assigned(&client, "a-late").await;
    let mut after = Vec::new();
    for name in names {
        after.push(ips_of(&client, name).await);
    }
    assert_eq!(before, after, "every address survives the restart");
    assert!(
        !after.iter().flatten().any(|ip| late.contains(ip)),
        "{late:?} is already held: {after:?}\n{}",
        second.log_text()
    );
    assert_eq!(second.terminate().await, Some(0));
}

#[tokio::test]
async fn a_restart_while_a_pool_is_invalid_keeps_the_addresses_of_its_services() {
    let (api, client) = lab().await;
    create_pool(&client, "a", json!({"addresses": ["192.0.2.112/31"]})).await;
    create_pool(&client, "b", json!({"addresses": ["192.0.2.120/30"]})).await;
    let first = Controller::start(&api, "c-0");
    // n1 and n2 fill pool a, n3 gets b's first address, pinned names pool b.
    let names = ["n1", "n2", "n3", "pinned"];
    for name in names {
        let annotations = if name == "pinned" {
            json!({"swimlb.io/address-pool": "b"})
        } else {
            json!({})
        };
        create_service(&client, &service(name, annotations, json!({}))).await;
        wait_assigned(&client, name).await;
    }
    let mut before = Vec::new();
    for name in names {
        before.push(ips_of(&client, name).await);
    }
    assert_eq!(before[2], vec!["192.0.2.120"], "{before:?}");
    assert_eq!(first.terminate().await, Some(0));

    // While no controller runs, pool b is made to overlap a: rejected at the next start.
    let pools: Api<IPAddressPool> = Api::namespaced(client.clone(), "swimlb-system");
    pools
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"addresses": ["192.0.2.112/30"]}})),
        )
        .await
        .expect("pool b patched");
    let second = Controller::start(&api, "c-1");
    let note = wait_event(&client, "swimlb-system", "b", "InvalidConfiguration").await;
    assert!(note.contains("overlaps"), "{note}");
    for (name, ips) in names.iter().zip(&before).skip(2) {
        let note = wait_event(&client, "default", name, "AddressOutsidePools").await;
        assert!(note.contains(&ips[0]), "{name}: {note}");
    }
    eventually("a Valid=False condition on pool b", || async {
        let status = pools.get("b").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Valid" && c.status == "False")
    })
    .await;
    // A Service created now cannot get an address: a is full and b is not in force.
    create_service(&client, &service("late", json!({}), json!({}))).await;
    let note = wait_event(&client, "default", "late", "AllocationFailed").await;
    assert!(note.contains("no free"), "{note}");
    let (_, body) = eventually("/metrics", || second.get("/metrics")).await;
    assert!(body.contains("swimlb_addresses_outside_pools 2"), "{body}");
    let mut after = Vec::new();
    for name in names {
        after.push(ips_of(&client, name).await);
    }
    assert_eq!(
        before,
        after,
        "a restart never changes an address\n{}",
        second.log_text()
    );

    // Pool b is repaired: its Services stay, and the new one gets b's next free address.
    pools
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"addresses": ["192.0.2.120/30"]}})),
        )
        .await
        .expect("pool b repaired");
    let late = wait_assigned(&client, "late").await;
    assert!(
        late[0].starts_with("192.0.2.12") && !before.iter().flatten().any(|ip| late.contains(ip)),
        "{late:?} vs {before:?}"
    );
    let mut repaired = Vec::new();
    for name in names {
        repaired.push(ips_of(&client, name).await);
    }
    assert_eq!(before, repaired);
    assert_eq!(second.terminate().await, Some(0));
}

#[tokio::test]
async fn exhaustion_and_bad_requests_produce_warning_events_and_no_address() {
    let (api, client) = lab().await;
    create_pool(&client, "one", json!({"addresses": ["192.0.2.40/32"]})).await;
    let ctl = Controller::start(&api, "c-0");
    create_service(&client, &service("first", json!({}), json!({}))).await;
    assert_eq!(wait_assigned(&client, "first").await, vec!["192.0.2.40"]);
    let bad = [
        service("second", json!({}), json!({})),
        service(
            "outside",
            json!({"swimlb.io/loadBalancerIPs": "203.0.113.5"}),
            json!({}),
        ),
        service(
            "taken",
            json!({"swimlb.io/loadBalancerIPs": "192.0.2.40"}),
            json!({}),
        ),
        service(
            "conflicting",
            json!({"swimlb.io/address-pool": "one", "metallb.io/address-pool": "other"}),
            json!({}),
        ),
        service(
            "unparsable",
            json!({"metallb.universe.tf/loadBalancerIPs": "192.0.2.x"}),
            json!({}),
        ),
    ];
    for svc in &bad {
        create_service(&client, svc).await;
    }
    // Each note names its cause.
    let causes: [&[&str]; 5] = [
        &["no free ipv4 address", "\"one\""],
        &["203.0.113.5", "not in any usable address pool"],
        &["192.0.2.40", "in use by default/first"],
        &[
            "swimlb.io/address-pool",
            "metallb.io/address-pool",
            "disagree",
        ],
        &["loadBalancerIPs", "192.0.2.x"],
    ];
    for (svc, cause) in bad.iter().zip(causes) {
        let name = svc.name_any();
        let note = wait_event(&client, "default", &name, "AllocationFailed").await;
        assert!(
            cause.iter().all(|c| note.contains(c)),
            "{name}: the Event names its cause {cause:?}: {note}"
        );
        assert!(
            ips_of(&client, &name).await.is_empty(),
            "{name} got an address\n{}",
            ctl.log_text()
        );
    }
    let (_, body) = eventually("/metrics", || ctl.get("/metrics")).await;
    for reason in [
        "pool_exhausted",
        "ip_not_in_pool",
        "ip_in_use",
        "conflicting_annotations",
    ] {
        assert!(
            body.contains(&format!(
                "swimlb_allocation_errors_total{{reason=\"{reason}\"}}"
            )),
            "{reason}: {body}"
        );
    }
    drop(ctl);
}

/// Issue 14: `/metrics`, read as curl reads it, passes `promtool check metrics` and exposes
/// exactly the controller metrics of the book's metrics reference (an exhausted pool gives the
/// error counter a series).
#[tokio::test]
async fn metrics_pass_promtool_and_are_the_metrics_reference() {
    use swimlb_e2e::metrics_doc;
    let (api, client) = lab().await;
    create_pool(&client, "one", json!({"addresses": ["192.0.2.40/32"]})).await;
    let ctl = Controller::start(&api, "c-0");
    create_service(&client, &service("first", json!({}), json!({}))).await;
    assert_eq!(wait_assigned(&client, "first").await, vec!["192.0.2.40"]);
    create_service(&client, &service("second", json!({}), json!({}))).await;
    wait_event(&client, "default", "second", "AllocationFailed").await;
    let (line, body) = eventually("/metrics with the allocation error", || async {
        let (line, body) = ctl.get("/metrics").await?;
        body.contains("swimlb_allocation_errors_total{")
            .then_some((line, body))
    })
    .await;
    assert!(line.contains("200"), "{line}");
    if let Err(e) = swimlb_e2e::promtool::check_metrics(&body) {
        panic!("{e}\n{body}");
    }
    let rows = metrics_doc::documented_rows().unwrap_or_else(|e| panic!("{e:#}"));
    if let Err(e) = metrics_doc::compare(&rows, "controller", &metrics_doc::families(&body)) {
        panic!(
            "the metrics reference ({}) and the controller's /metrics differ:\n{e}\n{body}",
            metrics_doc::PAGE
        );
    }
    drop(ctl);
}

#[tokio::test]
async fn services_with_the_same_sharing_key_share_an_address_and_others_may_not() {
    let (api, client) = lab().await;
    create_pool(&client, "lab", json!({"addresses": ["192.0.2.48/29"]})).await;
    let ctl = Controller::start(&api, "c-0");
    let shared = |name: &str, key: &str, port: i32| {
        service(
            name,
            json!({"swimlb.io/allow-shared-ip": key, "swimlb.io/loadBalancerIPs": "192.0.2.50"}),
            json!({"ports": [{"name": "p", "port": port, "protocol": "TCP"}]}),
        )
    };
    create_service(&client, &shared("dns-tcp", "k", 53)).await;
    create_service(&client, &shared("dns-web", "k", 80)).await;
    assert_eq!(wait_assigned(&client, "dns-tcp").await, vec!["192.0.2.50"]);
    assert_eq!(wait_assigned(&client, "dns-web").await, vec!["192.0.2.50"]);
    create_service(&client, &shared("intruder", "other", 443)).await;
    wait_event(&client, "default", "intruder", "AllocationFailed").await;
    assert!(ips_of(&client, "intruder").await.is_empty());
    drop(ctl);
}

#[tokio::test]
async fn a_dual_stack_service_gets_one_address_per_family() {
    let (api, client) = lab().await;
    create_pool(
        &client,
        "dual",
        json!({"addresses": ["192.0.2.64/30", "2001:db8::10-2001:db8::1f"]}),
    )
    .await;
    let ctl = Controller::start(&api, "c-0");
    create_service(
        &client,
        &service(
            "both",
            json!({}),
            json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"]}),
        ),
    )
    .await;
    let ips = wait_assigned(&client, "both").await;
    assert_eq!(ips.len(), 2, "{ips:?}");
    assert!(ips.iter().any(|ip| ip.starts_with("192.0.2.")), "{ips:?}");
    assert!(ips.iter().any(|ip| ip.starts_with("2001:db8::")), "{ips:?}");
    create_service(
        &client,
        &service("v6", json!({}), json!({"ipFamilies": ["IPv6"]})),
    )
    .await;
    let v6 = wait_assigned(&client, "v6").await;
    assert_eq!(v6.len(), 1);
    assert!(v6[0].starts_with("2001:db8::"), "{v6:?}");
    drop(ctl);
}

#[tokio::test]
async fn an_invalid_pool_gets_a_warning_event_and_the_valid_configuration_stays_in_force() {
    let (api, client) = lab().await;
    create_pool(&client, "good", json!({"addresses": ["192.0.2.80/30"]})).await;
    let ctl = Controller::start(&api, "c-0");
    create_service(&client, &service("one", json!({}), json!({}))).await;
    wait_assigned(&client, "one").await;
    // Overlaps "good": rejected, and "good" keeps serving.
    create_pool(&client, "overlap", json!({"addresses": ["192.0.2.82/31"]})).await;
    let note = wait_event(&client, "swimlb-system", "overlap", "InvalidConfiguration").await;
    assert!(note.contains("overlaps"), "{note}");
    let pools: Api<IPAddressPool> = Api::namespaced(client.clone(), "swimlb-system");
    let condition = eventually("a Valid=False condition on the rejected pool", || async {
        let status = pools.get("overlap").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Valid" && c.status == "False")
    })
    .await;
    assert_eq!(condition.reason, "InvalidConfiguration");
    assert!(
        condition.message.contains("overlaps"),
        "{}",
        condition.message
    );
    create_service(&client, &service("two", json!({}), json!({}))).await;
    let ips = wait_assigned(&client, "two").await;
    assert!(ips[0].starts_with("192.0.2.8"), "{ips:?}");
    drop(ctl);
}
