//! Reconciler tests against a mocked API server (`tower_test::mock::pair`).

use super::*;
use hyper::{Method, Request, Response, StatusCode};
use kube::client::Body;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::store::Writer;
use prometheus_client::registry::Registry;
use swimlb_config::crd::{IPAddressPool, IPAddressPoolSpec};
use swimlb_config::pools::validate;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn service(value: serde_json::Value) -> Service {
    serde_json::from_value(value).expect("test service is valid")
}

fn lb(name: &str, extra_spec: serde_json::Value) -> Service {
    let mut spec = json!({"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        spec.extend(extra.clone());
    }
    service(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "uid": "u-1"},
        "spec": spec,
    }))
}

fn reporter() -> Reporter {
    Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some("test".into()),
    }
}

fn context(pools: &[&str]) -> (Arc<Context>, Handle, Registry) {
    let (mock, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(mock, "default");
    let pool = IPAddressPool::with_addresses("swimlb-system", "p", pools);
    let model = validate(&[pool], &[]).into_result().expect("valid pool");
    let mut registry = Registry::default();
    let mut allocator = Allocator::new(None, &model);
    allocator.load_existing(&[]);
    let ctx = Context {
        client: client.clone(),
        allocator: Arc::new(Mutex::new(allocator)),
        namespaces: Writer::<Namespace>::default().as_reader(),
        recorder: Recorder::new(client, reporter()),
        reporter: reporter(),
        metrics: ControllerMetrics::register(&mut registry),
    };
    (Arc::new(ctx), handle, registry)
}

async fn body_json(request: Request<Body>) -> serde_json::Value {
    let bytes = request
        .into_body()
        .collect_bytes()
        .await
        .expect("request body");
    serde_json::from_slice(&bytes).expect("request body is JSON")
}

/// Answers the next request, checking it is a status apply, and returns its body.
async fn expect_status_apply(
    handle: &mut Handle,
    service: &str,
    answer: StatusCode,
) -> serde_json::Value {
    let (request, send) = handle.next_request().await.expect("a status apply");
    assert_eq!(request.method(), Method::PATCH);
    let uri = request.uri().to_string();
    assert!(
        uri.starts_with(&format!(
            "/api/v1/namespaces/default/services/{service}/status?"
        )),
        "{uri}"
    );
    assert!(uri.contains("fieldManager=swimlb-controller"), "{uri}");
    assert!(uri.contains("force=true"), "{uri}");
    let body = body_json(request).await;
    let reply = if answer.is_success() {
        serde_json::to_vec(&lb(service, json!({}))).expect("serializable")
    } else {
        serde_json::to_vec(
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "boom", "reason": "InternalError", "code": answer.as_u16()}),
        )
        .expect("serializable")
    };
    let mut response = Response::new(Body::from(reply));
    *response.status_mut() = answer;
    send.send_response(response);
    body
}

/// Answers the next request, checking it creates an Event, and returns the Event.
async fn expect_event(handle: &mut Handle) -> serde_json::Value {
    let (request, send) = handle.next_request().await.expect("an event");
    assert_eq!(request.method(), Method::POST);
    assert!(
        request.uri().path().ends_with("/events"),
        "{}",
        request.uri()
    );
    let body = body_json(request).await;
    send.send_response(Response::new(Body::from(
        serde_json::to_vec(&body).expect("serializable"),
    )));
    body
}

fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encodes");
    text
}

#[test]
fn the_apply_body_sets_or_clears_the_ingress_list() {
    let ips: Vec<IpAddr> = vec![
        "192.0.2.1".parse().expect("ip"),
        "2001:db8::1".parse().expect("ip"),
    ];
    assert_eq!(
        ingress_apply_body(&ips),
        json!({"apiVersion": "v1", "kind": "Service", "status": {"loadBalancer": {"ingress": [
            {"ip": "192.0.2.1", "ipMode": "VIP"}, {"ip": "2001:db8::1", "ipMode": "VIP"}]}}})
    );
    assert_eq!(
        ingress_apply_body(&[])["status"]["loadBalancer"]["ingress"],
        json!([])
    );
}

#[tokio::test]
async fn a_new_service_gets_its_address_written_by_server_side_apply_and_an_event() {
    let (ctx, mut handle, registry) = context(&["192.0.2.0/30"]);
    let svc = Arc::new(lb("web", json!({})));
    let task = tokio::spawn(reconcile(svc, ctx.clone()));
    let body = expect_status_apply(&mut handle, "web", StatusCode::OK).await;
    assert_eq!(
        body,
        ingress_apply_body(&["192.0.2.0".parse().expect("ip")])
    );
    let event = expect_event(&mut handle).await;
    assert_eq!(event["reason"], "IPAllocated");
    assert_eq!(event["note"], "Assigned 192.0.2.0 from pool p");
    assert_eq!(event["type"], "Normal");
    let action = task.await.expect("joins").expect("reconciles");
    assert_eq!(action, Action::await_change());
    assert!(
        encode(&registry).contains("swimlb_pool_addresses_in_use{pool=\"p\",family=\"ipv4\"} 1")
    );
}

#[tokio::test]
async fn a_service_that_already_shows_its_address_causes_no_api_call() {
    let (ctx, handle, _registry) = context(&["192.0.2.0/30"]);
    drop(handle); // any request now fails, and so would the reconcile
    let mut svc = lb("web", json!({}));
    svc.status = Some(
        serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.2"}]}}))
            .expect("status"),
    );
    let action = reconcile(Arc::new(svc), ctx.clone())
        .await
        .expect("reconciles");
    assert_eq!(action, Action::await_change());
    let key = ServiceKey::new("default", "web");
    let held = ctx
        .allocator
        .lock()
        .expect("lock")
        .holding(&key)
        .map(|(p, ips)| (p.map(str::to_string), ips.to_vec()));
    assert_eq!(
        held,
        Some((
            Some("p".to_string()),
            vec!["192.0.2.2".parse().expect("ip")]
        ))
    );
}

#[tokio::test]
async fn a_service_of_another_class_is_never_written() {
    let (ctx, handle, _registry) = context(&["192.0.2.0/30"]);
    drop(handle);
    let svc = lb("other", json!({"loadBalancerClass": "vendor.example/lb"}));
    let action = reconcile(Arc::new(svc), ctx.clone())
        .await
        .expect("no API call, so no error");
    assert_eq!(action, Action::await_change());
    // The check has teeth: a Service of ours needs the (closed) API and fails.
    let mine = reconcile(Arc::new(lb("mine", json!({}))), ctx).await;
    assert!(mine.is_err(), "{mine:?}");
}

#[tokio::test]
async fn a_refused_service_gets_a_warning_event_a_counted_error_and_a_retry() {
    let (ctx, mut handle, registry) = context(&["192.0.2.0/30"]);
    let mut svc = lb("web", json!({"loadBalancerIP": "203.0.113.7"}));
    svc.status = Some(
        serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}))
            .expect("status"),
    );
    let task = tokio::spawn(reconcile(Arc::new(svc), ctx));
    // The stale status is cleared first.
    let body = expect_status_apply(&mut handle, "web", StatusCode::OK).await;
    assert_eq!(body, ingress_apply_body(&[]));
    let event = expect_event(&mut handle).await;
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reason"], "AllocationFailed");
    assert_eq!(
        event["note"],
        "203.0.113.7 is not in any usable address pool"
    );
    assert_eq!(
        task.await.expect("joins").expect("reconciles"),
        Action::requeue(RETRY_UNASSIGNED)
    );
    assert!(
        encode(&registry).contains("swimlb_allocation_errors_total{reason=\"ip_not_in_pool\"} 1")
    );
}

#[tokio::test]
async fn a_failed_apply_is_an_error_retried_by_the_error_policy() {
    let (ctx, mut handle, _registry) = context(&["192.0.2.0/30"]);
    let svc = Arc::new(lb("web", json!({})));
    let task = tokio::spawn(reconcile(svc.clone(), ctx.clone()));
    expect_status_apply(&mut handle, "web", StatusCode::INTERNAL_SERVER_ERROR).await;
    let error = task.await.expect("joins").expect_err("the apply failed");
    assert_eq!(error.as_str(), "apply_status");
    assert!(
        error
            .to_string()
            .starts_with("Service default/web: status.loadBalancer.ingress: apply failed"),
        "{error}"
    );
    assert_eq!(
        error_policy(svc, &error, ctx),
        Action::requeue(RETRY_AFTER_ERROR)
    );
}

#[tokio::test]
async fn a_deleted_service_releases_its_address() {
    let (ctx, mut handle, _registry) = context(&["192.0.2.0/31"]);
    let task = tokio::spawn(reconcile(Arc::new(lb("a", json!({}))), ctx.clone()));
    expect_status_apply(&mut handle, "a", StatusCode::OK).await;
    expect_event(&mut handle).await;
    task.await.expect("joins").expect("reconciles");
    let mut deleted = lb("a", json!({}));
    deleted.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().expect("timestamp"),
        ));
    reconcile(Arc::new(deleted), ctx.clone())
        .await
        .expect("reconciles");
    assert!(
        ctx.allocator
            .lock()
            .expect("lock")
            .holders("192.0.2.0".parse().expect("ip"))
            .is_empty()
    );
    assert!(!ctx.forget(&ServiceKey::new("default", "a")).expect("lock"));
}

#[tokio::test]
async fn loading_existing_services_reports_conflicts_and_forget_missing_releases_the_gone() {
    let (ctx, _handle, _registry) = context(&["192.0.2.0/30"]);
    let with_status = |name: &str, ip: &str| {
        let mut s = lb(name, json!({}));
        s.status = Some(
            serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": ip}]}}))
                .expect("status"),
        );
        s
    };
    let conflicts = ctx
        .load_existing(&[with_status("a", "192.0.2.1"), with_status("b", "192.0.2.1")])
        .expect("lock");
    assert_eq!(conflicts.len(), 1);
    assert_eq!(conflicts[0].service, ServiceKey::new("default", "b"));
    let store = Writer::<Service>::default().as_reader();
    let gone = ctx.forget_missing(&store).expect("lock");
    assert_eq!(gone, vec![ServiceKey::new("default", "a")]);
}

#[test]
fn pool_statuses_count_assigned_and_available_per_family() {
    let usage = vec![
        PoolUsage {
            pool: "a".into(),
            family: Family::V4,
            size: 254,
            in_use: 4,
        },
        PoolUsage {
            pool: "a".into(),
            family: Family::V6,
            size: u128::MAX,
            in_use: 1,
        },
        PoolUsage {
            pool: "b".into(),
            family: Family::V4,
            size: 0,
            in_use: 0,
        },
    ];
    let statuses = pool_statuses(&usage);
    assert_eq!(
        statuses["a"],
        IPAddressPoolStatus {
            assigned_ipv4: 4,
            available_ipv4: 250,
            assigned_ipv6: 1,
            available_ipv6: i64::MAX,
            conditions: Vec::new(),
        }
    );
    assert_eq!(statuses["b"], IPAddressPoolStatus::default());
}

#[tokio::test]
async fn a_pool_status_is_written_by_server_side_apply() {
    let (ctx, mut handle, _registry) = context(&["192.0.2.0/30"]);
    let status = IPAddressPoolStatus {
        assigned_ipv4: 1,
        available_ipv4: 3,
        ..Default::default()
    };
    let client = ctx.client.clone();
    let task =
        tokio::spawn(
            async move { apply_pool_status(&client, "swimlb-system", "p", &status).await },
        );
    let (request, send) = handle.next_request().await.expect("a pool status apply");
    assert_eq!(request.method(), Method::PATCH);
    let uri = request.uri().to_string();
    assert!(
        uri.starts_with(
            "/apis/swimlb.io/v1beta1/namespaces/swimlb-system/ipaddresspools/p/status?"
        ),
        "{uri}"
    );
    assert!(uri.contains("fieldManager=swimlb-controller"), "{uri}");
    let body = body_json(request).await;
    assert_eq!(
        body["status"],
        json!({"assignedIPv4": 1, "assignedIPv6": 0, "availableIPv4": 3, "availableIPv6": 0})
    );
    let mut pool = IPAddressPool::new("p", IPAddressPoolSpec::default());
    pool.metadata.namespace = Some("swimlb-system".into());
    send.send_response(Response::new(Body::from(
        serde_json::to_vec(&pool).expect("serializable"),
    )));
    task.await.expect("joins").expect("applied");
}

#[tokio::test]
async fn before_the_load_a_service_is_retried_without_any_api_call() {
    let (ctx, handle, _registry) = context(&["192.0.2.0/30"]);
    drop(handle);
    let model = validate(&[], &[]).into_result().expect("valid");
    *ctx.allocator.lock().expect("lock") = Allocator::new(None, &model);
    let action = reconcile(Arc::new(lb("web", json!({}))), ctx)
        .await
        .expect("no API call");
    assert_eq!(action, Action::requeue(RETRY_AFTER_ERROR));
}
