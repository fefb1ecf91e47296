//! The fake API server, driven through real `kube::Client`s built from its kubeconfig and through
//! `kube::runtime` watchers, reflectors and a controller.
//!
//! These tests use real time, not `start_paused`: they talk over real sockets, and paused time
//! would auto-advance while the runtime waits on I/O and fire every timeout. No test asserts on
//! speed; every wait is bounded (`WAIT`) so a broken server fails the test instead of hanging it.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, WatchStreamExt, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use swimlb_fake_api::{FakeApi, FakeApiConfig};

const WAIT: Duration = Duration::from_secs(15);

async fn bounded<F: std::future::Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(WAIT, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

async fn start(config: FakeApiConfig) -> (FakeApi, Client) {
    let api = FakeApi::start_with(config)
        .await
        .expect("fake API server starts");
    let client = api
        .client()
        .await
        .expect("client from the generated kubeconfig");
    (api, client)
}

fn quick() -> FakeApiConfig {
    FakeApiConfig {
        history_capacity: 1000,
        bookmark_interval: Duration::from_millis(100),
        default_watch_timeout: Duration::from_secs(60),
        ..FakeApiConfig::default()
    }
}

fn service(name: &str, labels: Value) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": 80}]}
    }))
    .expect("valid service")
}

fn api_error(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(status) => (status.code, status.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn pool_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("swimlb.io", "v1beta1", "IPAddressPool"),
        "ipaddresspools",
    )
}

/// Sends a raw request (for content types kube's typed API does not produce).
async fn raw(
    client: &Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: Value,
) -> Result<Value, kube::Error> {
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(serde_json::to_vec(&body).expect("json"))
        .expect("request");
    client.request::<Value>(req).await
}

#[tokio::test]
async fn create_get_list_work_and_a_replace_with_a_stale_resource_version_is_a_conflict() {
    let (_server, client) = start(quick()).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let created = services
        .create(
            &PostParams::default(),
            &service("web", json!({"app": "web"})),
        )
        .await
        .unwrap();
    assert!(created.uid().is_some());
    assert_eq!(created.metadata.generation, Some(1));
    let spec = created.spec.clone().unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("192.0.2.1"));
    assert!(
        spec.ports.unwrap()[0]
            .node_port
            .is_some_and(|p| (30000..=32767).contains(&p))
    );

    let fetched = services.get("web").await.unwrap();
    assert_eq!(fetched.resource_version(), created.resource_version());
    let all: Api<Service> = Api::all(client.clone());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );

    let mut first = fetched.clone();
    first.labels_mut().insert("tier".into(), "front".into());
    let updated = services
        .replace("web", &PostParams::default(), &first)
        .await
        .unwrap();
    assert_ne!(updated.resource_version(), fetched.resource_version());
    assert_eq!(
        updated.metadata.generation,
        Some(1),
        "a label change is not a spec change"
    );

    let mut stale = fetched.clone();
    stale.labels_mut().insert("tier".into(), "back".into());
    let err = services
        .replace("web", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (409, "Conflict".into()));

    let again = services
        .create(&PostParams::default(), &service("web", json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_error(again), (409, "AlreadyExists".into()));
    let missing = services.get("nope").await.unwrap_err();
    assert_eq!(api_error(missing), (404, "NotFound".into()));
}

#[tokio::test]
async fn merge_json_and_strategic_patches_change_what_they_say_and_bump_generation_on_spec_changes()
{
    let (_server, client) = start(quick()).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &service("web", json!({"app": "web"})),
        )
        .await
        .unwrap();

    let merged = services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": null, "team": "net"}}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.labels().get("team").map(String::as_str), Some("net"));
    assert!(!merged.labels().contains_key("app"));
    assert_eq!(merged.metadata.generation, Some(1));

    let path = "/api/v1/namespaces/default/services/web";
    let patched = raw(
        &client,
        "PATCH",
        path,
        "application/json-patch+json",
        json!([
            {"op": "test", "path": "/metadata/labels/team", "value": "net"},
            {"op": "add", "path": "/spec/ports/-", "value": {"name": "https", "port": 443}},
        ]),
    )
    .await
    .unwrap();
    assert_eq!(patched["spec"]["ports"].as_array().map(Vec::len), Some(2));
    assert_eq!(patched["metadata"]["generation"], 2);

    let failed = raw(
        &client,
        "PATCH",
        path,
        "application/json-patch+json",
        json!([{"op": "test", "path": "/metadata/labels/team", "value": "other"}]),
    )
    .await;
    assert_eq!(api_error(failed.unwrap_err()).0, 422);

    let strategic = services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"ports": [{"port": 443, "name": "tls"}]}})),
        )
        .await
        .unwrap();
    let names: Vec<String> = strategic
        .spec
        .unwrap()
        .ports
        .unwrap()
        .into_iter()
        .filter_map(|p| p.name)
        .collect();
    assert_eq!(
        names,
        vec!["http".to_string(), "tls".to_string()],
        "ports merge by port"
    );

    let unsupported = raw(&client, "PATCH", path, "application/x-yaml", json!({})).await;
    assert_eq!(
        api_error(unsupported.unwrap_err()),
        (415, "UnsupportedMediaType".into())
    );
    let malformed = hyper::Request::builder()
        .method("PATCH")
        .uri(path)
        .header("content-type", "application/merge-patch+json")
        .body(b"{not json".to_vec())
        .unwrap();
    assert_eq!(
        api_error(client.request::<Value>(malformed).await.unwrap_err()),
        (400, "BadRequest".into())
    );
}

#[tokio::test]
async fn apply_creates_records_owners_conflicts_between_managers_and_force_takes_over() {
    let (_server, client) = start(quick()).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let doc = |holder: &str, extra: Value| {
        let mut v = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "leader"}, "spec": {"holderIdentity": holder}});
        if let (Some(spec), Some(extra)) = (v["spec"].as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        v
    };
    let created = leases
        .patch(
            "leader",
            &PatchParams::apply("alpha"),
            &Patch::Apply(doc("a", json!({"leaseDurationSeconds": 15}))),
        )
        .await
        .unwrap();
    assert_eq!(
        created.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("a")
    );
    let managers: Vec<String> = created
        .metadata
        .managed_fields
        .clone()
        .unwrap()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, vec!["alpha".to_string()]);

    let conflict = leases
        .patch(
            "leader",
            &PatchParams::apply("beta"),
            &Patch::Apply(doc("b", json!({}))),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(conflict), (409, "Conflict".into()));

    let same = leases
        .patch(
            "leader",
            &PatchParams::apply("beta"),
            &Patch::Apply(doc("a", json!({}))),
        )
        .await
        .unwrap();
    assert_ne!(
        same.resource_version(),
        created.resource_version(),
        "beta now co-owns the field"
    );
    assert_eq!(same.metadata.managed_fields.map(|m| m.len()), Some(2));

    let forced = leases
        .patch(
            "leader",
            &PatchParams::apply("beta").force(),
            &Patch::Apply(doc("b", json!({}))),
        )
        .await
        .unwrap();
    assert_eq!(
        forced.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("b")
    );

    let dropped = leases.patch("leader", &PatchParams::apply("alpha"), &Patch::Apply(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "leader"}}))).await.unwrap();
    let spec = dropped.spec.unwrap();
    assert_eq!(
        spec.lease_duration_seconds, None,
        "a field alpha stopped applying is removed"
    );
    assert_eq!(
        spec.holder_identity.as_deref(),
        Some("b"),
        "a field beta owns stays"
    );

    let no_manager = raw(
        &client,
        "PATCH",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/leader",
        "application/apply-patch+yaml",
        doc("c", json!({})),
    )
    .await;
    assert_eq!(api_error(no_manager.unwrap_err()).0, 422);
}

#[tokio::test]
async fn the_status_subresource_ignores_spec_and_the_main_resource_ignores_status() {
    let (_server, client) = start(quick()).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(&PostParams::default(), &service("web", json!({})))
        .await
        .unwrap();
    let status_patch = json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"type": "NodePort"},
        "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.10"}]}}
    });
    let after = services
        .patch_status(
            "web",
            &PatchParams::apply("swimlb-controller"),
            &Patch::Apply(&status_patch),
        )
        .await
        .unwrap();
    assert_eq!(
        after.spec.as_ref().unwrap().type_.as_deref(),
        Some("LoadBalancer")
    );
    assert_eq!(
        after
            .status
            .as_ref()
            .unwrap()
            .load_balancer
            .as_ref()
            .unwrap()
            .ingress
            .as_ref()
            .unwrap()[0]
            .ip
            .as_deref(),
        Some("198.51.100.10")
    );
    let ingress = after
        .status
        .as_ref()
        .unwrap()
        .load_balancer
        .as_ref()
        .unwrap()
        .ingress
        .as_ref()
        .unwrap()[0]
        .clone();
    assert_eq!(
        ingress.ip_mode.as_deref(),
        Some("VIP"),
        "ipMode is defaulted as by Kubernetes 1.32+"
    );
    let again = services
        .patch_status(
            "web",
            &PatchParams::apply("swimlb-controller"),
            &Patch::Apply(&status_patch),
        )
        .await
        .unwrap();
    assert_eq!(
        again.resource_version(),
        after.resource_version(),
        "re-applying the same status is a no-op"
    );
    let bad_ip = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "status": {"loadBalancer": {"ingress": [{"ip": "not-an-ip"}]}}});
    let rejected = services
        .patch_status(
            "web",
            &PatchParams::apply("swimlb-controller"),
            &Patch::Apply(&bad_ip),
        )
        .await;
    assert_eq!(api_error(rejected.unwrap_err()).0, 422);
    assert_eq!(after.metadata.generation, Some(1));

    let main = services
        .patch("web", &PatchParams::default(), &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": []}}, "metadata": {"labels": {"x": "y"}}})))
        .await
        .unwrap();
    assert_eq!(
        main.status
            .clone()
            .unwrap()
            .load_balancer
            .unwrap()
            .ingress
            .unwrap()
            .len(),
        1,
        "status is unchanged through the main resource"
    );
    assert_eq!(main.labels().get("x").map(String::as_str), Some("y"));

    let pools = Api::<DynamicObject>::namespaced_with(client.clone(), "default", &pool_resource());
    let pool: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "lab"},
        "spec": {"addresses": ["198.51.100.0/24"]}, "status": {"ignored": true}
    }))
    .unwrap();
    let created = pools.create(&PostParams::default(), &pool).await.unwrap();
    assert!(
        created.data.get("status").is_none(),
        "status is dropped on create of a custom resource"
    );
    let replaced = pools
        .replace_status(
            "lab",
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
                "metadata": {"name": "lab", "resourceVersion": created.resource_version()},
                "spec": {"addresses": ["203.0.113.0/24"]}, "status": {"assignedIPv4": 3}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(replaced.data["spec"]["addresses"][0], "198.51.100.0/24");
    assert_eq!(replaced.data["status"]["assignedIPv4"], 3);
}

#[tokio::test]
async fn a_watcher_sees_added_modified_and_deleted_in_order() {
    let (_server, client) = start(quick()).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let start_rv = services
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = services
        .watch(&WatchParams::default().disable_bookmarks(), &start_rv)
        .await
        .unwrap()
        .boxed();
    services
        .create(&PostParams::default(), &service("web", json!({})))
        .await
        .unwrap();
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut last_rv = 0u64;
    while seen.len() < 3 {
        let event = bounded("watch events", stream.try_next())
            .await
            .unwrap()
            .expect("stream open");
        let (kind, obj) = match event {
            WatchEvent::Added(o) => ("ADDED", o),
            WatchEvent::Modified(o) => ("MODIFIED", o),
            WatchEvent::Deleted(o) => ("DELETED", o),
            other => panic!("unexpected {other:?}"),
        };
        let rv: u64 = obj.resource_version().unwrap().parse().unwrap();
        assert!(rv > last_rv, "resourceVersions grow");
        last_rv = rv;
        seen.push(kind);
    }
    assert_eq!(seen, ["ADDED", "MODIFIED", "DELETED"]);
}

#[tokio::test]
async fn a_reflector_store_converges_to_the_server_state() {
    let (_server, client) = start(quick()).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(&PostParams::default(), &service("before", json!({})))
        .await
        .unwrap();
    let (reader, writer) = reflector::store::<Service>();
    let stream = reflector(
        writer,
        watcher(services.clone(), watcher::Config::default()),
    );
    let task = tokio::spawn(stream.applied_objects().for_each(|_| async {}));
    bounded("the store to be ready", reader.wait_until_ready())
        .await
        .unwrap();
    for name in ["a", "b", "c"] {
        services
            .create(&PostParams::default(), &service(name, json!({})))
            .await
            .unwrap();
    }
    services
        .delete("b", &DeleteParams::default())
        .await
        .unwrap();
    services
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"v": "2"}}})),
        )
        .await
        .unwrap();
    bounded("convergence", async {
        loop {
            let mut names: Vec<(String, Option<String>)> = reader
                .state()
                .iter()
                .map(|s| (s.name_any(), s.labels().get("v").cloned()))
                .collect();
            names.sort();
            if names
                == [
                    ("a".into(), None),
                    ("before".into(), None),
                    ("c".into(), Some("2".into())),
                ]
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    task.abort();
}

#[tokio::test]
async fn a_watch_from_a_too_old_resource_version_gets_410_and_the_kube_watcher_relists() {
    let config = FakeApiConfig {
        history_capacity: 4,
        ..quick()
    };
    let (_server, client) = start(config).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap(),
        )
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let others: Api<Service> = Api::namespaced(client.clone(), "other");
    services
        .create(&PostParams::default(), &service("web", json!({})))
        .await
        .unwrap();
    let old_rv = services
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    for i in 0..6 {
        others
            .create(
                &PostParams::default(),
                &service(&format!("s{i}"), json!({})),
            )
            .await
            .unwrap();
    }
    let mut raw_watch = services
        .watch(&WatchParams::default(), &old_rv)
        .await
        .unwrap()
        .boxed();
    match bounded("the expiry event", raw_watch.try_next())
        .await
        .unwrap()
    {
        Some(WatchEvent::Error(status)) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }

    // The kube watcher: its watch ends after 1 s; meanwhile writes it cannot see push its
    // resourceVersion out of the history, so its next watch gets 410 and it lists again.
    let mut events = watcher(
        services.clone(),
        watcher::Config::default().timeout(1).disable_bookmarks(),
    )
    .boxed();
    let mut init_done = 0;
    while init_done == 0 {
        if let watcher::Event::InitDone = bounded("the first list", events.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            init_done += 1;
        }
    }
    for i in 6..12 {
        others
            .create(
                &PostParams::default(),
                &service(&format!("s{i}"), json!({})),
            )
            .await
            .unwrap();
    }
    let mut saw_gone = false;
    bounded("a relist after 410", async {
        loop {
            match events.next().await {
                Some(Err(watcher::Error::WatchError(status))) if status.code == 410 => {
                    saw_gone = true
                }
                Some(Ok(watcher::Event::InitDone)) if saw_gone => break,
                Some(_) => {}
                None => panic!("watcher stream ended"),
            }
        }
    })
    .await;
    assert!(saw_gone);
}

#[tokio::test]
async fn label_selectors_filter_lists_and_watches() {
    let (_server, client) = start(quick()).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &service("web", json!({"app": "web", "tier": "front"})),
        )
        .await
        .unwrap();
    services
        .create(&PostParams::default(), &service("db", json!({"app": "db"})))
        .await
        .unwrap();
    services
        .create(&PostParams::default(), &service("bare", json!({})))
        .await
        .unwrap();
    let names = |list: kube::core::ObjectList<Service>| {
        list.items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            services
                .list(&ListParams::default().labels("app=web"))
                .await
                .unwrap()
        ),
        ["web"]
    );
    assert_eq!(
        names(
            services
                .list(&ListParams::default().labels("app in (web,db),tier!=front"))
                .await
                .unwrap()
        ),
        ["db"]
    );
    assert_eq!(
        names(
            services
                .list(&ListParams::default().labels("!app"))
                .await
                .unwrap()
        ),
        ["bare"]
    );
    assert_eq!(
        names(
            services
                .list(&ListParams::default().fields("metadata.name=db"))
                .await
                .unwrap()
        ),
        ["db"]
    );
    let bad = services
        .list(&ListParams::default().labels("app in web"))
        .await
        .unwrap_err();
    assert_eq!(api_error(bad).0, 400);

    let rv = services
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = services
        .watch(
            &WatchParams::default().labels("app=web").disable_bookmarks(),
            &rv,
        )
        .await
        .unwrap()
        .boxed();
    services
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
        )
        .await
        .unwrap();
    services
        .patch(
            "bare",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
        )
        .await
        .unwrap();
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "old"}}})),
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match bounded("selected events", stream.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(o) => seen.push(format!("ADDED {}", o.name_any())),
            WatchEvent::Modified(o) => seen.push(format!("MODIFIED {}", o.name_any())),
            WatchEvent::Deleted(o) => seen.push(format!("DELETED {}", o.name_any())),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        seen,
        ["ADDED bare", "DELETED web"],
        "entering and leaving the selection"
    );
}

#[tokio::test]
async fn finalizers_delay_deletion_until_the_last_one_is_removed() {
    let (server, client) = start(quick()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "finalizers": ["swimlb.io/a", "swimlb.io/b"]},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.delete("p", &DeleteParams::default()).await.unwrap();
    let marked = pods.get("p").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    let add = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"finalizers": ["swimlb.io/a", "swimlb.io/b", "swimlb.io/c"]}}),
            ),
        )
        .await;
    assert_eq!(
        api_error(add.unwrap_err()).0,
        422,
        "no new finalizers on a deleting object"
    );
    pods.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["swimlb.io/b"]}})),
    )
    .await
    .unwrap();
    assert!(pods.get("p").await.is_ok());
    pods.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_error(pods.get("p").await.unwrap_err()).0, 404);
    assert!(server.objects("pods").unwrap().is_empty());
}

#[tokio::test]
async fn timeout_seconds_ends_the_watch_and_bookmarks_are_sent() {
    let (_server, client) = start(quick()).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let rv = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = nodes
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .unwrap()
        .boxed();
    let mut bookmarks = 0;
    bounded("the end of the watch", async {
        while let Some(event) = stream.try_next().await.unwrap() {
            match event {
                WatchEvent::Bookmark(b) => {
                    assert_eq!(b.metadata.resource_version, rv);
                    bookmarks += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await;
    assert!(bookmarks >= 1, "a bookmark arrives within the watch");

    let mut quiet = nodes
        .watch(&WatchParams::default().timeout(1).disable_bookmarks(), &rv)
        .await
        .unwrap()
        .boxed();
    let ended = bounded("the end of the quiet watch", quiet.try_next())
        .await
        .unwrap();
    assert!(ended.is_none(), "no bookmarks without allowWatchBookmarks");
}

#[tokio::test]
async fn invalid_names_are_422_and_a_namespace_mismatch_is_rejected() {
    let (_server, client) = start(quick()).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    for bad in ["Web", "1web", "web.svc", "-web"] {
        let err = services
            .create(&PostParams::default(), &service(bad, json!({})))
            .await
            .unwrap_err();
        assert_eq!(api_error(err), (422, "Invalid".into()), "{bad}");
    }
    let mut elsewhere = service("web", json!({}));
    elsewhere.metadata.namespace = Some("kube-system".into());
    let err = services
        .create(&PostParams::default(), &elsewhere)
        .await
        .unwrap_err();
    assert_eq!(
        api_error(err),
        (400, "BadRequest".into()),
        "the real server answers BadRequest"
    );
    let mut with_rv = service("rv", json!({}));
    with_rv.metadata.resource_version = Some("5".into());
    let err = services
        .create(&PostParams::default(), &with_rv)
        .await
        .unwrap_err();
    assert_eq!(
        api_error(err),
        (500, "Unknown".into()),
        "the real server's storage error for a create with a resourceVersion"
    );
    let in_missing_ns: Api<Service> = Api::namespaced(client.clone(), "nowhere");
    assert_eq!(
        api_error(
            in_missing_ns
                .create(&PostParams::default(), &service("web", json!({})))
                .await
                .unwrap_err()
        )
        .0,
        404
    );
    let bad_port: Service = serde_json::from_value(
        json!({"metadata": {"name": "p"}, "spec": {"ports": [{"port": 70000}]}}),
    )
    .unwrap();
    assert_eq!(
        api_error(
            services
                .create(&PostParams::default(), &bad_port)
                .await
                .unwrap_err()
        )
        .0,
        422
    );
    let bad_label = service("l", json!({"bad key": "x"}));
    assert_eq!(
        api_error(
            services
                .create(&PostParams::default(), &bad_label)
                .await
                .unwrap_err()
        )
        .0,
        422
    );
    let unknown = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        Value::Null,
    )
    .await;
    assert_eq!(api_error(unknown.unwrap_err()).0, 404);
}

#[tokio::test]
async fn custom_resources_are_served_as_dynamic_objects_and_need_a_resource_version_to_replace() {
    let (server, client) = start(quick()).await;
    let pools = Api::<DynamicObject>::namespaced_with(client.clone(), "default", &pool_resource());
    let pool: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "lab"},
        "spec": {"addresses": ["198.51.100.0/24"]}
    }))
    .unwrap();
    let created = pools.create(&PostParams::default(), &pool).await.unwrap();
    let mut unconditional = created.clone();
    unconditional.metadata.resource_version = None;
    assert_eq!(
        api_error(
            pools
                .replace("lab", &PostParams::default(), &unconditional)
                .await
                .unwrap_err()
        )
        .0,
        422
    );
    server
        .create(json!({"apiVersion": "swimlb.io/v1beta1", "kind": "L2Advertisement", "metadata": {"name": "all"}, "spec": {}}))
        .expect("seeding through the store");
    let ads = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "swimlb.io",
            "v1beta1",
            "L2Advertisement",
        )),
    );
    assert_eq!(
        ads.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    assert!(
        server
            .create(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}))
            .is_err()
    );
    let listed = pools.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(server.objects("ipaddresspools.swimlb.io").unwrap().len(), 1);
    let strategic = pools
        .patch(
            "lab",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {}})),
        )
        .await;
    assert_eq!(api_error(strategic.unwrap_err()).0, 415);
}

#[tokio::test]
async fn custom_resources_are_checked_against_their_schema_on_every_write_and_unknown_fields_pruned()
 {
    let (_server, client) = start(quick()).await;
    let pools = Api::<DynamicObject>::namespaced_with(client.clone(), "default", &pool_resource());
    let pool = |spec: Value| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "lab"},
            "spec": spec
        }))
        .unwrap()
    };
    // Create: a wrong type is 422 Invalid with the field in the Status' causes.
    let err = pools
        .create(&PostParams::default(), &pool(json!({"addresses": 5})))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("an API error: {err:?}");
    };
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert!(
        status.message.contains("spec.addresses")
            && status.message.contains("must be of type array"),
        "{}",
        status.message
    );
    assert_eq!(
        status.details.as_ref().map(|d| d.causes[0].field.as_str()),
        Some("spec.addresses")
    );
    // Unknown fields are pruned and defaults applied, as by a real server.
    let created = pools
        .create(
            &PostParams::default(),
            &pool(json!({"addresses": ["198.51.100.0/24"], "colour": "blue"})),
        )
        .await
        .unwrap();
    assert_eq!(created.data["spec"].get("colour"), None);
    assert_eq!(created.data["spec"]["autoAssign"], json!(true));
    // Merge, JSON and apply patches, replace, and the status subresource are checked too.
    let merge = pools
        .patch(
            "lab",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"autoAssign": "yes"}})),
        )
        .await;
    assert_eq!(api_error(merge.unwrap_err()), (422, "Invalid".into()));
    let jp = raw(
        &client,
        "PATCH",
        "/apis/swimlb.io/v1beta1/namespaces/default/ipaddresspools/lab",
        "application/json-patch+json",
        json!([{"op": "replace", "path": "/spec/addresses/0", "value": 42}]),
    )
    .await;
    assert_eq!(api_error(jp.unwrap_err()), (422, "Invalid".into()));
    let apply = pools
        .patch(
            "lab",
            &PatchParams::apply("test").force(),
            &Patch::Apply(json!({
                "apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
                "spec": {"serviceAllocation": {"priority": "high"}}
            })),
        )
        .await;
    assert_eq!(api_error(apply.unwrap_err()), (422, "Invalid".into()));
    let mut replaced = created.clone();
    replaced.data["spec"]["avoidBuggyIPs"] = json!(1);
    let replace = pools
        .replace("lab", &PostParams::default(), &replaced)
        .await;
    assert_eq!(api_error(replace.unwrap_err()), (422, "Invalid".into()));
    let status = pools
        .patch_status(
            "lab",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"assignedIPv4": "three"}})),
        )
        .await;
    assert_eq!(api_error(status.unwrap_err()), (422, "Invalid".into()));
    let unchanged = pools.get("lab").await.unwrap();
    assert_eq!(unchanged.data["spec"], created.data["spec"]);
}

#[tokio::test]
async fn lists_paginate_and_streaming_list_watchers_get_the_initial_events() {
    let (_server, client) = start(quick()).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    for i in 0..5 {
        services
            .create(
                &PostParams::default(),
                &service(&format!("s{i}"), json!({})),
            )
            .await
            .unwrap();
    }
    let first = services
        .list(&ListParams::default().limit(2))
        .await
        .unwrap();
    assert_eq!(first.items.len(), 2);
    let token = first.metadata.continue_.clone().expect("a continue token");
    services
        .create(&PostParams::default(), &service("late", json!({})))
        .await
        .unwrap();
    let second = services
        .list(&ListParams::default().limit(10).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(
        second.items.len(),
        3,
        "pages come from the first page's snapshot"
    );
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );

    let mut events = watcher(
        services.clone(),
        watcher::Config::default().streaming_lists(),
    )
    .boxed();
    let mut initial = 0;
    bounded("the streaming list", async {
        loop {
            match events.try_next().await.unwrap().unwrap() {
                watcher::Event::InitApply(_) => initial += 1,
                watcher::Event::InitDone => break,
                _ => {}
            }
        }
    })
    .await;
    assert_eq!(initial, 6);
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct ReconcileError(#[from] kube::Error);

struct Context {
    client: Client,
}

async fn reconcile(service: Arc<Service>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let api: Api<Service> =
        Api::namespaced(ctx.client.clone(), &service.namespace().unwrap_or_default());
    let status = json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": service.name_any()},
        "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}
    });
    api.patch_status(
        &service.name_any(),
        &PatchParams::apply("swimlb-test").force(),
        &Patch::Apply(&status),
    )
    .await?;
    Ok(Action::await_change())
}

fn error_policy(_: Arc<Service>, _: &ReconcileError, _: Arc<Context>) -> Action {
    Action::requeue(Duration::from_millis(100))
}

#[tokio::test]
async fn a_kube_runtime_controller_reconciles_services_against_the_fake_server() {
    let (_server, client) = start(quick()).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let ctx = Arc::new(Context {
        client: client.clone(),
    });
    let controller = Controller::new(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .run(reconcile, error_policy, ctx)
    .for_each(|_| async {});
    let task = tokio::spawn(controller);
    services
        .create(&PostParams::default(), &service("web", json!({})))
        .await
        .unwrap();
    bounded("the controller to set the status", async {
        loop {
            let svc = services.get("web").await.unwrap();
            let ip = svc
                .status
                .and_then(|s| s.load_balancer)
                .and_then(|lb| lb.ingress)
                .and_then(|i| i.first().and_then(|x| x.ip.clone()));
            if ip.as_deref() == Some("198.51.100.7") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    task.abort();
}

#[tokio::test]
async fn the_kube_event_recorder_creates_and_then_patches_an_event_series() {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let (_server, client) = start(quick()).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = services
        .create(&PostParams::default(), &service("web", json!({})))
        .await
        .unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "swimlb-controller".into(),
            instance: Some("test-0".into()),
        },
    );
    let event = Event {
        type_: EventType::Normal,
        reason: "IPAllocated".into(),
        note: Some("198.51.100.7 from pool lab".into()),
        action: "Allocate".into(),
        secondary: None,
    };
    let reference = svc.object_ref(&());
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    let listed = events.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(listed[0].reason.as_deref(), Some("IPAllocated"));
}

#[tokio::test]
async fn kube_lease_manager_elects_one_holder_and_hands_over_on_release() {
    use kube_lease_manager::LeaseManagerBuilder;
    let (_server, client) = start(quick()).await;
    let build = |identity: &str| {
        LeaseManagerBuilder::new(client.clone(), "swimlb-controller")
            .with_namespace("default")
            .with_identity(identity)
            .with_duration(5)
            .with_grace(2)
            .build()
    };
    let a = build("a").await.unwrap();
    let b = build("b").await.unwrap();
    assert!(bounded("a to lead", a.changed()).await.unwrap());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let holder = |l: Lease| l.spec.and_then(|s| s.holder_identity);
    assert_eq!(
        holder(leases.get("swimlb-controller").await.unwrap()).as_deref(),
        Some("a")
    );
    a.release().await.unwrap();
    assert!(bounded("b to lead", b.changed()).await.unwrap());
    assert_eq!(
        holder(leases.get("swimlb-controller").await.unwrap()).as_deref(),
        Some("b")
    );
}

#[tokio::test]
async fn pods_keep_their_spec_and_endpoint_slices_need_valid_addresses() {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let (_server, client) = start(quick()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));
    let moved = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": "n1"}})),
        )
        .await;
    assert_eq!(
        api_error(moved.unwrap_err()).0,
        422,
        "a pod's spec is immutable"
    );
    let image = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}}),
            ),
        )
        .await;
    assert!(image.is_ok(), "container images may change: {image:?}");
    let ready = pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "podIP": "203.0.113.5"}})),
        )
        .await
        .unwrap();
    assert_eq!(ready.status.unwrap().pod_ip.as_deref(), Some("203.0.113.5"));
    let no_image: Pod = serde_json::from_value(
        json!({"metadata": {"name": "q"}, "spec": {"containers": [{"name": "c"}]}}),
    )
    .unwrap();
    assert_eq!(
        api_error(
            pods.create(&PostParams::default(), &no_image)
                .await
                .unwrap_err()
        )
        .0,
        422
    );

    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let slice = |addr: &str| -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "web-abc", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [addr], "conditions": {"ready": true}, "nodeName": "n1"}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        }))
        .unwrap()
    };
    assert_eq!(
        api_error(
            slices
                .create(&PostParams::default(), &slice("2001:db8::1"))
                .await
                .unwrap_err()
        )
        .0,
        422
    );
    let created = slices
        .create(&PostParams::default(), &slice("203.0.113.5"))
        .await
        .unwrap();
    let listed = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    let mut v6 = created.clone();
    v6.address_type = "IPv6".into();
    if let Some(eps) = v6.endpoints.as_mut() {
        eps[0].addresses = vec!["2001:db8::1".into()];
    }
    assert_eq!(
        api_error(
            slices
                .replace("web-abc", &PostParams::default(), &v6)
                .await
                .unwrap_err()
        )
        .0,
        422,
        "addressType is immutable"
    );
}

#[tokio::test]
async fn shutdown_ends_open_watches_and_an_any_semantic_watcher_lists_from_resource_version_zero() {
    let (server, client) = start(quick()).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(&PostParams::default(), &service("web", json!({})))
        .await
        .unwrap();
    let mut events = watcher(services.clone(), watcher::Config::default().any_semantic()).boxed();
    let mut applied = 0;
    bounded("the initial list", async {
        loop {
            match events.try_next().await.unwrap().unwrap() {
                watcher::Event::InitApply(_) => applied += 1,
                watcher::Event::InitDone => break,
                _ => {}
            }
        }
    })
    .await;
    assert_eq!(applied, 1);
    let rv = services
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = services
        .watch(&WatchParams::default().disable_bookmarks(), &rv)
        .await
        .unwrap()
        .boxed();
    server.shutdown().await;
    let end = bounded("the watch to end at shutdown", stream.next()).await;
    assert!(
        !matches!(end, Some(Ok(_))),
        "no more events after shutdown: {end:?}"
    );
}

#[tokio::test]
async fn discovery_finds_every_served_resource() {
    let (_server, client) = start(quick()).await;
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
    let discovery = bounded(
        "discovery",
        kube::discovery::Discovery::new(client.clone()).run(),
    )
    .await
    .unwrap();
    let gvk = GroupVersionKind::gvk("swimlb.io", "v1beta1", "ServiceL2Status");
    let (resource, caps) = discovery
        .resolve_gvk(&gvk)
        .expect("swimlb.io resources are discoverable");
    assert_eq!(resource.plural, "servicel2statuses");
    let subresources: Vec<String> = caps
        .subresources
        .iter()
        .map(|(r, _)| r.plural.clone())
        .collect();
    assert_eq!(subresources, ["status"]);
    for (group, version, kind) in [
        ("", "v1", "Service"),
        ("discovery.k8s.io", "v1", "EndpointSlice"),
        ("coordination.k8s.io", "v1", "Lease"),
        ("events.k8s.io", "v1", "Event"),
    ] {
        assert!(
            discovery
                .resolve_gvk(&GroupVersionKind::gvk(group, version, kind))
                .is_some(),
            "{kind}"
        );
    }
}
