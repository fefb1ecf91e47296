//! Two replicas and the lease, and fields written by another manager.

use super::*;

#[tokio::test]
async fn of_two_replicas_only_the_leader_writes_and_the_standby_takes_over_on_sigterm() {
    let (api, client) = lab().await;
    create_pool(&client, "lab", json!({"addresses": ["192.0.2.96/29"]})).await;
    let a = Controller::start_as_user(&api, "replica-a");
    eventually("replica-a to hold the lease", || async {
        (lease_holder(&client).await.as_deref() == Some("replica-a")).then_some(())
    })
    .await;
    let b = Controller::start_as_user(&api, "replica-b");
    let (line, body) = eventually("the standby's /readyz", || b.get("/readyz")).await;
    assert!(
        line.contains("200") && body.contains("standby"),
        "{line} {body}"
    );
    for name in ["s1", "s2"] {
        create_service(&client, &service(name, json!({}), json!({}))).await;
        wait_assigned(&client, name).await;
    }
    let instances = |events: Vec<Event>| -> BTreeSet<String> {
        events
            .into_iter()
            .filter_map(|e| e.reporting_instance)
            .collect()
    };
    assert_eq!(
        instances(events(&client, "default").await),
        BTreeSet::from(["replica-a".to_string()]),
        "only the leader publishes"
    );
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let managers: BTreeSet<String> = services
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .iter()
        .flat_map(|s| s.managed_fields().iter().filter_map(|m| m.manager.clone()))
        .collect();
    assert!(managers.contains("swimlb-controller"), "{managers:?}");
    // Both replicas write with the same field manager: the audit log tells them apart.
    let by = |user: &str| -> Vec<AuditRecord> {
        api.requests()
            .into_iter()
            .filter(|r| r.user == user)
            .collect()
    };
    let is_write =
        |r: &AuditRecord| matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete");
    let standby = by("replica-b");
    assert!(
        standby.iter().any(|r| r.resource == "leases"),
        "the standby tries the Lease: {standby:?}"
    );
    let beyond_lease: Vec<&AuditRecord> =
        standby.iter().filter(|r| r.resource != "leases").collect();
    assert!(
        beyond_lease.is_empty(),
        "the standby touched nothing but its Lease: {beyond_lease:?}"
    );
    assert!(
        by("replica-a")
            .iter()
            .any(|r| is_write(r) && r.resource == "services/status" && r.name == "s1"),
        "the leader's writes are seen"
    );

    assert_eq!(a.terminate().await, Some(0));
    eventually("replica-b to take the lease", || async {
        (lease_holder(&client).await.as_deref() == Some("replica-b")).then_some(())
    })
    .await;
    create_service(&client, &service("s3", json!({}), json!({}))).await;
    let s3 = wait_assigned(&client, "s3").await;
    let held: Vec<String> = [ips_of(&client, "s1").await, ips_of(&client, "s2").await].concat();
    assert!(!held.iter().any(|ip| s3.contains(ip)), "{s3:?} vs {held:?}");
    let note = wait_event(&client, "default", "s3", "IPAllocated").await;
    assert!(note.contains(&s3[0]), "{note}");
    assert!(
        instances(events(&client, "default").await).contains("replica-b"),
        "the new leader publishes\n{}",
        b.log_text()
    );
    assert!(
        by("replica-b")
            .iter()
            .any(|r| is_write(r) && r.resource == "services/status" && r.name == "s3"),
        "the new leader writes under its own name"
    );
    drop(b);
}

#[tokio::test]
async fn an_ingress_written_by_another_field_manager_is_taken_back_by_the_controller() {
    let (api, client) = lab().await;
    create_pool(&client, "lab", json!({"addresses": ["192.0.2.24/30"]})).await;
    let ctl = Controller::start(&api, "ssa");
    create_service(&client, &service("web", json!({}), json!({}))).await;
    let ips = wait_assigned(&client, "web").await;
    // Another load balancer implementation server-side applies its own address, forcing the
    // field away from the controller (a conflict the real API server arbitrates).
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let foreign = if ips[0] == "192.0.2.27" {
        "192.0.2.26"
    } else {
        "192.0.2.27"
    };
    let status = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "status": {"loadBalancer": {"ingress": [{"ip": foreign}]}}});
    services
        .patch_status(
            "web",
            &PatchParams::apply("other-lb").force(),
            &Patch::Apply(&status),
        )
        .await
        .expect("the other manager's apply");
    eventually("the controller to write its address back", || async {
        (ips_of(&client, "web").await == ips).then_some(())
    })
    .await;
    let web = services.get("web").await.expect("web");
    let owners: Vec<String> = web
        .managed_fields()
        .iter()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:status/f:loadBalancer/f:ingress").is_some())
        })
        .filter_map(|m| m.manager.clone())
        .collect();
    assert_eq!(
        owners,
        vec!["swimlb-controller".to_string()],
        "the controller owns the ingress again\n{}",
        ctl.log_text()
    );
    drop(ctl);
}

#[tokio::test]
async fn a_service_gets_an_address_once_its_namespace_gets_the_label_a_pool_selects() {
    let (api, client) = lab().await;
    api.admin()
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}))
        .expect("namespace team-a");
    create_pool(
        &client,
        "team",
        json!({
            "addresses": ["192.0.2.112/29"],
            "serviceAllocation": {"namespaceSelectors": [{"matchLabels": {"team": "a"}}]},
        }),
    )
    .await;
    let ctl = Controller::start(&api, "c-0");
    let mut svc = service("web", json!({}), json!({}));
    svc.metadata.namespace = Some("team-a".into());
    let services: Api<Service> = Api::namespaced(client.clone(), "team-a");
    services
        .create(&PostParams::default(), &svc)
        .await
        .expect("service created");
    // Not served yet: the pool only serves namespaces labelled team=a.
    wait_event(&client, "team-a", "web", "AllocationFailed").await;
    let ips = |svc: Option<Service>| svc.map(|s| ingress(&s)).unwrap_or_default();
    assert!(
        ips(services.get("web").await.ok()).is_empty(),
        "an address before the label"
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            "team-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .expect("namespace labelled");
    // The retry of an unassigned Service comes only after a minute, longer than WAIT: the
    // address must come from the label change itself.
    let got = eventually("web to get an address after the label", || async {
        let got = ips(services.get("web").await.ok());
        (!got.is_empty()).then_some(got)
    })
    .await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].starts_with("192.0.2.11"), "{got:?} outside the pool");
    assert_eq!(ctl.terminate().await, Some(0));
}

/// A controller started while the API server is down (a Pod started before its node's service
/// rules, or during an outage) waits for it, saying so, and leads once it answers: it does not
/// exit into the kubelet's restart backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_started_while_the_api_server_is_down_waits_and_then_leads() {
    let (mut api, client) = lab().await;
    create_pool(&client, "lab", json!({"addresses": ["192.0.2.104/30"]})).await;
    let kubeconfig = api
        .user_kubeconfig("early")
        .expect("a kubeconfig for the replica");
    tokio::task::block_in_place(|| api.stop_apiserver()).expect("the API server stops");
    let mut early = Controller::start_with_kubeconfig(&kubeconfig, "early");
    eventually(
        "the controller's warning that the API server does not answer",
        || {
            let warned = early
                .log_text()
                .contains("cannot start the lease manager yet");
            std::future::ready(warned.then_some(()))
        },
    )
    .await;
    assert!(
        early.child.try_wait().expect("try_wait").is_none(),
        "the controller exited while the API server was down: {}",
        early.log_text()
    );
    tokio::task::block_in_place(|| api.start_apiserver()).expect("the API server starts");
    eventually("the early replica to hold the lease", || async {
        (lease_holder(&client).await.as_deref() == Some("early")).then_some(())
    })
    .await;
    create_service(&client, &service("after-outage", json!({}), json!({}))).await;
    wait_assigned(&client, "after-outage").await;
    assert_eq!(
        early.terminate().await,
        Some(0),
        "a clean stop after leading"
    );
}
