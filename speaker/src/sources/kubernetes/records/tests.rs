use super::*;
use swimlb_control_plane::test_plane::TestPlane;

/// A real control plane with swimlb's CRDs and the speaker's namespace.
async fn api_with_namespace(test: &str) -> TestPlane {
    let api = TestPlane::start_async(&format!("records-{test}")).await;
    api.create_namespace("swimlb-system").unwrap();
    api
}

/// The writes of records so far (objects and their status), in order, from the audit log.
fn record_requests(api: &TestPlane) -> Vec<swimlb_control_plane::control_plane::AuditRecord> {
    api.requests()
        .into_iter()
        .filter(|r| r.resource.starts_with("servicel2statuses"))
        .filter(|r| matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete"))
        .collect()
}

fn svc(name: &str) -> ServiceKey {
    ServiceKey::new("default", name)
}

fn status(node: &str, name: &str) -> Option<ServiceL2StatusStatus> {
    Some(record_status(node, &svc(name), &["eth0".to_string()]))
}

/// Every record in the namespace: (name, node label, status node).
/// What `each` reads of every record, sorted.
fn sorted_records<T: Ord>(api: &TestPlane, each: impl Fn(&serde_json::Value) -> T) -> Vec<T> {
    let mut all: Vec<T> = api
        .admin()
        .list(
            "swimlb.io/v1beta1",
            "ServiceL2Status",
            Some("swimlb-system"),
        )
        .unwrap()
        .iter()
        .map(each)
        .collect();
    all.sort();
    all
}

fn text(value: &serde_json::Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

fn records(api: &TestPlane) -> Vec<(String, String, String)> {
    sorted_records(api, |o| {
        (
            text(&o["metadata"]["name"]),
            text(&o["metadata"]["labels"][NODE_LABEL]),
            text(&o["status"]["node"]),
        )
    })
}

fn facts(service: &str, links: Option<&[&str]>, unowned: bool) -> Option<IpFacts> {
    Some(IpFacts {
        service: svc(service),
        shared_with: None,
        links: links.map(|l| std::sync::Arc::new(l.iter().map(|s| s.to_string()).collect())),
        unowned,
    })
}

#[test]
fn holdings_say_which_records_change_and_what_they_hold() {
    let v4: IpAddr = "192.0.2.1".parse().unwrap();
    let v6: IpAddr = "2001:db8::1".parse().unwrap();
    let mut h = Holdings::new("n1");
    assert_eq!(
        h.set(v4, facts("web", Some(&["eth0"]), false)),
        vec![svc("web")]
    );
    assert!(
        h.set(v4, facts("web", Some(&["eth0"]), false)).is_empty(),
        "same facts"
    );
    assert_eq!(
        h.set(v6, facts("web", Some(&["eth1"]), false)),
        vec![svc("web")]
    );
    let (record, orphaned) = h.record(&svc("web"));
    let record = record.expect("announced");
    assert_eq!(record.node, "n1");
    let links: Vec<&str> = record.interfaces.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(links, ["eth0", "eth1"], "the links of every IP it answers");
    assert!(!orphaned);
    // Another node answers the IPv6 address; nobody owns the IPv4 one.
    h.set(v6, facts("web", None, false));
    h.set(v4, facts("web", None, true));
    assert_eq!(h.record(&svc("web")), (None, true));
    // The IP moves to another Service: both records may change.
    assert_eq!(
        h.set(v4, facts("db", Some(&["eth0"]), false)),
        vec![svc("db"), svc("web")]
    );
    h.set(v6, None);
    assert_eq!(h.record(&svc("web")), (None, true), "gone: an orphan");
    assert_eq!(h.services().collect::<Vec<_>>(), vec![&svc("db")]);
}

#[test]
fn record_names_are_dns_labels_and_the_same_everywhere() {
    let name = record_name(&svc("a-very-long-service-name-that-goes-on-and-on"));
    assert_eq!(name.len(), 23);
    assert!(name.starts_with("l2-"));
    assert!(name[3..].bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(
        name,
        record_name(&svc("a-very-long-service-name-that-goes-on-and-on"))
    );
    assert_ne!(
        record_name(&svc("a")),
        record_name(&ServiceKey::new("other", "a"))
    );
}

#[tokio::test]
async fn a_new_owner_takes_the_record_over_and_an_orphan_is_deleted() {
    let api = api_with_namespace("a_new_owner_takes_the_record_over_and_an").await;
    let client = api.client().await;
    let mut n1 = RecordWriter::new(client.clone(), "swimlb-system");
    let mut n2 = RecordWriter::new(client, "swimlb-system");
    n1.set(&svc("web"), status("n1", "web"), false);
    n1.set(&svc("db"), status("n1", "db"), false);
    let errors = n1.flush().await;
    assert!(errors.is_empty(), "{errors:?}");
    let web = record_name(&svc("web"));
    let db = record_name(&svc("db"));
    let mut expected = vec![
        (web.clone(), "n1".to_string(), "n1".to_string()),
        (db.clone(), "n1".to_string(), "n1".to_string()),
    ];
    expected.sort();
    assert_eq!(records(&api), expected);
    let writes_before = record_requests(&api).len();
    // n1 dies; n2 takes web over. Only web's record is written, once: its status first,
    // what readers take as the truth, then the object's labels.
    n2.set(&svc("web"), status("n2", "web"), false);
    assert!(n2.flush().await.is_empty());
    let writes: Vec<String> = record_requests(&api)
        .into_iter()
        .skip(writes_before)
        .map(|r| r.resource)
        .collect();
    assert_eq!(
        writes,
        ["servicel2statuses/status", "servicel2statuses"],
        "one Service moved: its status, then its object"
    );
    let mut expected = vec![
        (web.clone(), "n2".to_string(), "n2".to_string()),
        (db.clone(), "n1".to_string(), "n1".to_string()),
    ];
    expected.sort();
    assert_eq!(records(&api), expected);
    // Nothing changed: nothing is written.
    n2.set(&svc("web"), status("n2", "web"), false);
    assert!(!n2.is_pending());
    // db is announced by nobody now: the record goes.
    n2.set(&svc("db"), None, true);
    assert!(n2.flush().await.is_empty());
    assert_eq!(records(&api), vec![(web, "n2".into(), "n2".into())]);
}

#[tokio::test]
async fn a_record_overwritten_behind_the_owners_back_is_written_again() {
    let api = api_with_namespace("a_record_overwritten_behind_the_owners_b").await;
    let client = api.client().await;
    let mut n1 = RecordWriter::new(client.clone(), "swimlb-system");
    let mut n2 = RecordWriter::new(client, "swimlb-system");
    n1.set(&svc("web"), status("n1", "web"), false);
    assert!(n1.flush().await.is_empty());
    // A partition: n2 also owns web for a while and writes the record.
    n2.set(&svc("web"), status("n2", "web"), false);
    assert!(n2.flush().await.is_empty());
    let web = record_name(&svc("web"));
    assert_eq!(records(&api), vec![(web.clone(), "n2".into(), "n2".into())]);
    // The partition heals, n1 keeps web. What it knows it wrote hides the stale record;
    // the watch shows it.
    n1.set(&svc("web"), status("n1", "web"), false);
    assert!(!n1.is_pending(), "nothing changed as far as n1 knows");
    let theirs = status("n2", "web").unwrap();
    assert!(
        n1.observe(&svc("web"), Some(&theirs)),
        "stale: set it again"
    );
    n1.set(&svc("web"), status("n1", "web"), false);
    assert!(n1.is_pending());
    assert!(n1.flush().await.is_empty());
    assert_eq!(records(&api), vec![(web.clone(), "n1".into(), "n1".into())]);
    // Seeing its own record changes nothing; a deleted one is set again.
    let mine = status("n1", "web").unwrap();
    assert!(!n1.observe(&svc("web"), Some(&mine)));
    assert!(n1.observe(&svc("web"), None));
    // A Service this node does not announce is none of its business.
    assert!(!n2.observe(&svc("db"), Some(&mine)));
}

#[tokio::test]
async fn writes_that_fail_while_the_api_server_is_away_are_retried_when_it_is_back() {
    let mut api = api_with_namespace("writes_that_fail_while_the_api_server_is").await;
    let client = api.client().await;
    api.stop_apiserver().unwrap();
    let mut n1 = RecordWriter::new(client, "swimlb-system");
    n1.set(&svc("web"), status("n1", "web"), false);
    n1.set(&svc("db"), status("n1", "db"), false);
    n1.set(&svc("gone"), None, true);
    let errors = n1.flush().await;
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(n1.is_pending(), "kept for the next flush");
    // Ownership of db moved away meanwhile: its failed write is dropped; and gone is
    // announced again, by another node: its delete is dropped too.
    n1.set(&svc("db"), None, false);
    n1.set(&svc("gone"), None, false);
    api.start_apiserver().unwrap();
    assert!(records(&api).is_empty(), "nothing was written meanwhile");
    assert!(n1.flush().await.is_empty());
    assert!(!n1.is_pending());
    assert_eq!(
        records(&api),
        vec![(record_name(&svc("web")), "n1".into(), "n1".into())]
    );
}

/// Every record in the namespace: (Service name label, status node).
fn records_by_service(api: &TestPlane) -> Vec<(String, String)> {
    sorted_records(api, |o| {
        (
            text(&o["metadata"]["labels"][SERVICE_NAME_LABEL]),
            text(&o["status"]["node"]),
        )
    })
}

/// The names of the records `user` deleted.
fn deletes_by(api: &TestPlane, user: &str) -> Vec<String> {
    api.requests()
        .into_iter()
        .filter(|r| r.user == user && r.verb == "delete")
        .map(|r| r.name)
        .collect()
}

/// What the loop does with the Services an IP change touched, for the first live member:
/// each one's record set (an orphan's deleted).
fn tell(h: &Holdings, writer: &mut RecordWriter, touched: Vec<ServiceKey>) {
    for service in touched {
        let (record, unowned) = h.record(&service);
        writer.set(&service, record, unowned);
    }
}

#[tokio::test]
async fn services_sharing_an_ip_each_get_a_record_naming_the_owner_until_one_goes() {
    let api = api_with_namespace("services_sharing_an_ip_each_get_a_record").await;
    let mut writer = RecordWriter::new(api.client().await, "swimlb-system");
    let ip: IpAddr = "192.0.2.10".parse().unwrap();
    let mut h = Holdings::new("n1");
    let shared = IpFacts {
        shared_with: Some(vec![svc("web-udp")].into_boxed_slice()),
        ..facts("web-tcp", Some(&["eth0"]), false).unwrap()
    };
    let touched = h.set(ip, Some(shared));
    assert_eq!(touched, vec![svc("web-tcp"), svc("web-udp")]);
    assert!(h.holds(&svc("web-udp")));
    tell(&h, &mut writer, touched);
    assert!(writer.flush().await.is_empty());
    assert_eq!(
        records_by_service(&api),
        vec![
            ("web-tcp".to_string(), "n1".to_string()),
            ("web-udp".to_string(), "n1".to_string()),
        ],
        "one record per Service, both naming the owner"
    );
    // web-udp is deleted (or takes another IP): only its record goes.
    let touched = h.set(ip, facts("web-tcp", Some(&["eth0"]), false));
    assert_eq!(touched, vec![svc("web-tcp"), svc("web-udp")]);
    assert!(!h.holds(&svc("web-udp")));
    tell(&h, &mut writer, touched);
    assert!(writer.flush().await.is_empty());
    assert_eq!(
        records_by_service(&api),
        vec![("web-tcp".to_string(), "n1".to_string())]
    );
}

#[test]
fn holdings_compare_the_services_sharing_an_ip() {
    let ip: IpAddr = "192.0.2.10".parse().unwrap();
    let mut h = Holdings::new("n1");
    let links: BTreeSet<String> = ["eth0".to_string()].into();
    let shared = IpFacts {
        shared_with: Some(vec![svc("web-udp")].into_boxed_slice()),
        ..facts("web-tcp", Some(&["eth0"]), false).unwrap()
    };
    h.set(ip, Some(shared));
    let tcp = Some(("default", "web-tcp"));
    let udp = ["default/web-udp".to_string()];
    let other = ["default/db".to_string()];
    assert!(h.matches(&ip, tcp, Some(&udp), Some(&links), false));
    assert!(!h.matches(&ip, tcp, None, Some(&links), false));
    assert!(!h.matches(&ip, tcp, Some(&other), Some(&links), false));
    assert!(!h.matches(&ip, tcp, Some(&[]), Some(&links), false));
}

/// Writes a record of `service` naming `node`, as that node would have.
async fn leave_record(api: &TestPlane, node: &str, service: &str) {
    let mut writer = RecordWriter::new(api.client().await, "swimlb-system");
    writer.set(&svc(service), status(node, service), false);
    assert!(writer.flush().await.is_empty());
}

/// Every record the API holds, seen by `strays` as the records' watch lists them, against
/// the Services `served`.
async fn list_into(api: &TestPlane, strays: &mut Strays, served: &[&str]) {
    let list = Api::<ServiceL2Status>::namespaced(api.client().await, "swimlb-system")
        .list(&Default::default())
        .await
        .unwrap();
    for record in list {
        let status = record.status.expect("written with a status");
        let service = ServiceKey::new(&status.service_namespace, &status.service_name);
        let is_served = served.contains(&service.name.as_str());
        strays.seen(&service, Some(&status.node), is_served);
    }
}

#[tokio::test]
async fn a_record_of_a_service_not_served_is_swept_by_one_node_only() {
    let api = api_with_namespace("a_record_of_a_service_not_served_is_swep").await;
    // Left while every speaker was down: n3 is gone for good, n2 comes back.
    leave_record(&api, "n3", "gone").await;
    leave_record(&api, "n2", "old").await;
    leave_record(&api, "n2", "web").await;
    let mut n1 = RecordWriter::new(api.client_of("n1").await, "swimlb-system");
    let mut n2 = RecordWriter::new(api.client_of("n2").await, "swimlb-system");
    let (mut s1, mut s2) = (Strays::new(), Strays::new());
    s1.synced();
    s2.synced();
    list_into(&api, &mut s1, &["web"]).await;
    list_into(&api, &mut s2, &["web"]).await;
    let live = |node: &str| node == "n1" || node == "n2";
    // The record naming a dead node is the first member's; the one naming n2 is n2's.
    let due1 = s1.due("n1", live, Some("n1"));
    let due2 = s2.due("n2", live, Some("n1"));
    assert_eq!(due1, vec![svc("gone")]);
    assert_eq!(due2, vec![svc("old")]);
    assert!(s1.due("n1", live, Some("n1")).is_empty(), "handed out once");
    for service in &due1 {
        n1.sweep(service);
    }
    for service in &due2 {
        n2.sweep(service);
    }
    assert!(n1.flush().await.is_empty());
    assert!(n2.flush().await.is_empty());
    assert_eq!(
        records_by_service(&api),
        vec![("web".to_string(), "n2".to_string())],
        "the served Service's record stays"
    );
    assert_eq!(deletes_by(&api, "n1"), vec![record_name(&svc("gone"))]);
    assert_eq!(deletes_by(&api, "n2").len(), 1, "one delete each: no race");
    assert_eq!((n1.take_swept(), n2.take_swept()), (1, 1));
    assert_eq!(n1.take_swept(), 0, "taken");
}

#[tokio::test]
async fn nothing_is_swept_before_the_served_services_are_known() {
    let api = api_with_namespace("nothing_is_swept_before_the_served_servi").await;
    leave_record(&api, "n1", "web").await;
    let mut n1 = RecordWriter::new(api.client_of("n1").await, "swimlb-system");
    let mut strays = Strays::new();
    // The caches have not listed yet: nothing is served as far as this node knows.
    list_into(&api, &mut strays, &[]).await;
    let alone = |node: &str| node == "n1";
    assert!(strays.due("n1", alone, Some("n1")).is_empty());
    assert!(!n1.is_pending());
    // They list: web is served, its record is no stray, and nothing is swept either.
    strays.served(&svc("web"));
    strays.synced();
    assert!(strays.due("n1", alone, Some("n1")).is_empty());
    assert_eq!(
        records_by_service(&api),
        vec![("web".to_string(), "n1".to_string())]
    );
    assert!(deletes_by(&api, "n1").is_empty());
    // Had web not been served, the record would have been swept now.
    list_into(&api, &mut strays, &[]).await;
    assert_eq!(strays.due("n1", alone, Some("n1")), vec![svc("web")]);
    // And a sweep is undone when the Service is served again before it is performed.
    n1.sweep(&svc("web"));
    n1.set(&svc("web"), status("n1", "web"), false);
    assert!(n1.flush().await.is_empty());
    assert!(deletes_by(&api, "n1").is_empty());
}
