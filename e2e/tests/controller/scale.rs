//! The `measure_*` figures: Services assigned per second and the controller's memory.

use super::*;

/// How the measured Services come in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arrival {
    /// Seeded into the store before the controller starts: measures the controller's throughput
    /// (start, list, load, assign and write every status).
    BeforeStart,
    /// POSTed through the API, 50 at a time, while the controller runs.
    Posted,
}

/// An IPv6 LoadBalancer Service without nodePorts (a cluster's 2,768 nodePorts would not reach
/// 10,000 Services).
fn bench_service(i: usize) -> Service {
    service(
        &format!("svc-{i:05}"),
        json!({}),
        json!({"ipFamilies": ["IPv6"], "allocateLoadBalancerNodePorts": false}),
    )
}

/// Every Service of the `default` namespace, as JSON.
/// The LoadBalancer Services of `default` (the API server's own `kubernetes` Service is not one).
async fn all_services(client: &Client) -> Vec<Value> {
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .list(&ListParams::default())
        .await
        .expect("list Services")
        .items
        .into_iter()
        .filter(|s| s.spec.as_ref().and_then(|spec| spec.type_.as_deref()) == Some("LoadBalancer"))
        .map(|s| serde_json::to_value(s).expect("json"))
        .collect()
}

fn own_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let tick = |n: usize| {
        fields
            .get(n)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (tick(11) + tick(12)) as f64 / 100.0
}

/// Creates `count` IPv6 Services, runs one controller and prints how long until every one has
/// an address, the controller's RSS and CPU time, and the CPU time of this process. Prints;
/// never fails on a figure.
async fn measure(count: usize, arrival: Arrival) {
    let (api, client) = lab().await;
    create_pool(&client, "big", json!({"addresses": ["2001:db8:1::/112"]})).await;
    let seed_start = tokio::time::Instant::now();
    if arrival == Arrival::BeforeStart {
        for i in 0..count {
            create_service(&client, &bench_service(i)).await;
        }
    }
    let seeded = seed_start.elapsed();
    let cpu_before = own_cpu_seconds();
    let start = tokio::time::Instant::now();
    let ctl = Controller::start(&api, "bench");
    if arrival == Arrival::Posted {
        eventually("the controller to be ready", || async {
            let (line, _) = ctl.get("/readyz").await?;
            line.contains("200").then_some(())
        })
        .await;
    }
    let rss_before = ctl.rss_kib();
    let posting = tokio::time::Instant::now();
    if arrival == Arrival::Posted {
        let indexes: Vec<usize> = (0..count).collect();
        for chunk in indexes.chunks(50) {
            let mut tasks = Vec::new();
            for &i in chunk {
                let client = client.clone();
                tasks.push(tokio::spawn(async move {
                    create_service(&client, &bench_service(i)).await;
                }));
            }
            for t in tasks {
                t.await.expect("create task");
            }
        }
    }
    let posted = posting.elapsed();
    let done = tokio::time::timeout(Duration::from_secs(900), async {
        loop {
            let assigned = all_services(&client)
                .await
                .iter()
                .filter(|s| s.pointer("/status/loadBalancer/ingress/0/ip").is_some())
                .count();
            if assigned == count {
                break;
            }
            // Each poll lists every Service: not too often.
            let pause = if count > 1_000 { 1_000 } else { 250 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    })
    .await;
    let elapsed = start.elapsed();
    let cpu_api = own_cpu_seconds() - cpu_before;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let services: Vec<Value> = all_services(&client).await;
    let distinct: BTreeSet<&str> = services
        .iter()
        .filter_map(|s| s.pointer("/status/loadBalancer/ingress/0/ip")?.as_str())
        .collect();
    println!(
        "{count} Services, {arrival:?} (seeding {:.2} s, posting {:.2} s): all assigned: {} ({} distinct addresses) {:.2} s after the controller started; controller RSS {} KiB before, {} KiB after (peak {} KiB), CPU {:.2} s; test process CPU {:.2} s",
        seeded.as_secs_f64(),
        posted.as_secs_f64(),
        done.is_ok(),
        distinct.len(),
        elapsed.as_secs_f64(),
        rss_before.unwrap_or(0),
        ctl.rss_kib().unwrap_or(0),
        ctl.peak_rss_kib().unwrap_or(0),
        ctl.cpu_seconds().unwrap_or(0.0),
        cpu_api,
    );
    // Counts only, never a time: every Service has an address, and no two share one.
    let assigned = services
        .iter()
        .filter(|s| s.pointer("/status/loadBalancer/ingress/0/ip").is_some())
        .count();
    assert_eq!(
        (services.len(), assigned, distinct.len()),
        (count, count, count),
        "(Services, assigned, distinct addresses)\n{}",
        ctl.log_text()
    );
    drop(ctl);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: prints time to assign 1,000 existing Services and the controller's RSS"]
async fn measure_one_thousand_services() {
    measure(1_000, Arrival::BeforeStart).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: prints time to assign 1,000 POSTed Services and the controller's RSS"]
async fn measure_one_thousand_services_posted_through_the_api() {
    measure(1_000, Arrival::Posted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: prints time to assign 10,000 existing Services and the controller's RSS"]
async fn measure_ten_thousand_services() {
    // SWIMLB_MEASURE_SERVICES overrides the count.
    let count = std::env::var("SWIMLB_MEASURE_SERVICES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    measure(count, Arrival::BeforeStart).await;
}
