//! The console's API and pages against real transports: listings and their
//! pages, one message, every action and its effect on the queue,
//! capabilities, pause (also by another process on PostgreSQL), access
//! rules and escaping of hostile payloads.
#![cfg(feature = "console")]

use crate::fixtures;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use messaging::console::Console;
use messaging::prelude::*;
use serde_json::{json, Value};

#[messaging::queue("console-jobs", dlq = "console-jobs-dlq", max_receives = 1)]
pub(crate) struct ConsoleJobs;

#[messaging::queue("console-groups.fifo", fifo, dlq = "console-groups-dlq.fifo", max_receives = 1)]
struct ConsoleGroups;

#[messaging::message(name = "console.job", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Job {
    pub(crate) n: u32,
    pub(crate) note: String,
}

/// A queue no test's app consumes while a message of it is held: see
/// [`held_past_lease_on`].
#[messaging::queue("console-held", visibility = "3s")]
struct ConsoleHeld;

/// Whether the "bug" that fails jobs is fixed, how many jobs ran, and
/// whether jobs noted "held" may end.
#[derive(Default)]
pub(crate) struct Shop {
    pub(crate) fixed: AtomicBool,
    pub(crate) handled: AtomicUsize,
    pub(crate) let_go: AtomicBool,
}

#[messaging::handler(queue = ConsoleJobs)]
async fn console_job(job: Job, shop: State<Arc<Shop>>) -> Result<(), HandlerError> {
    if job.note == "held" {
        // Held until the test lets it go, not for a fixed time: on a loaded
        // CI machine a 1.5 s sleep ended before the test had looked.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !shop.let_go.load(Ordering::SeqCst) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shop.handled.fetch_add(1, Ordering::SeqCst);
        return Ok(());
    }
    if job.note != "ok" && !shop.fixed.load(Ordering::SeqCst) {
        return Err(HandlerError::permanent(format!("job {} is poison", job.n)));
    }
    shop.handled.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[messaging::handler(queue = ConsoleGroups)]
async fn console_group(job: Job, shop: State<Arc<Shop>>) -> Result<(), HandlerError> {
    if job.note != "ok" && !shop.fixed.load(Ordering::SeqCst) {
        return Err(HandlerError::permanent(format!("job {} is poison", job.n)));
    }
    shop.handled.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[messaging::handler(queue = ConsoleHeld)]
async fn console_held(_job: Job) {}

/// An HTTP response: status, headers (lowercase names) and body.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: String,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request over a fresh connection.
pub(crate) async fn call(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect to the console");
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut raw))
        .await
        .expect("the console answers within 20 s")
        .expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|s| s.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Reply { status, headers, body: body.to_owned() }
}

const JSON: (&str, &str) = ("Content-Type", "application/json");

/// The app consuming our two queues, with its console on a loopback port.
pub(crate) struct ConsoleHarness {
    pub(crate) addr: String,
    running: Option<messaging::Running>,
    pub(crate) shop: Arc<Shop>,
    pub(crate) publisher: Publisher,
}

impl ConsoleHarness {
    pub(crate) async fn start(url: &str) -> ConsoleHarness {
        ConsoleHarness::start_with(url, &["console-jobs", "console-groups.fifo"], Duration::from_millis(200)).await
    }

    /// The app consuming `queues` on `url`, each receive waiting at most `wait`.
    async fn start_with(url: &str, queues: &[&str], wait: Duration) -> ConsoleHarness {
        let transport = messaging::transport::connect(url).await.expect("connect");
        let mut app = messaging::App::new(transport).await.expect("app");
        app.only_queues(queues);
        let shop = Arc::new(Shop::default());
        app.setup().provide(shop.clone());
        app.set_receive_wait(wait);
        let publisher = app.setup().publisher();
        let mut running = app.start().expect("start");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let bound = listener.local_addr().expect("address");
        let console = Console::of_running(&running).listening_on(bound).router();
        running.serve_http_with(listener, console).expect("serve");
        ConsoleHarness { addr: bound.to_string(), running: Some(running), shop, publisher }
    }

    async fn get(&self, path: &str) -> Reply {
        call(&self.addr, "GET", path, &[], "").await
    }

    async fn get_json(&self, path: &str) -> Value {
        let reply = self.get(path).await;
        assert_eq!(reply.status, 200, "GET {path}: {}", reply.body);
        reply.json()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let reply = call(&self.addr, "POST", path, &[JSON], &body.to_string()).await;
        assert_eq!(reply.status, 200, "POST {path} {body}: {}", reply.body);
        reply.json()
    }

    async fn counts(&self, queue: &str) -> Value {
        self.get_json(&format!("/api/v1/queues/{queue}")).await["counts"].clone()
    }

    /// Waits until the count of `status` in `queue` is `n`.
    pub(crate) async fn until_count(&self, queue: &str, status: &str, n: u64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let counts = self.counts(queue).await;
            if counts[status] == json!(n) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "{queue}: {status} never reached {n}: {counts}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every id of a listing, read a page at a time; and the number of pages.
    async fn all_ids(&self, queue: &str, query: &str, limit: usize) -> (Vec<String>, usize) {
        let (mut ids, mut pages, mut after) = (Vec::new(), 0, None::<String>);
        loop {
            let mut path = format!("/api/v1/queues/{queue}/messages?{query}&limit={limit}");
            if let Some(cursor) = &after {
                path.push_str(&format!("&after={cursor}"));
            }
            let page = self.get_json(&path).await;
            pages += 1;
            let messages = page["messages"].as_array().expect("messages").clone();
            assert!(messages.len() <= limit, "a page holds at most its limit");
            ids.extend(messages.iter().map(|m| m["message_id"].as_str().expect("id").to_owned()));
            match page["next"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => return (ids, pages),
            }
            assert!(pages < 100, "the pages do not end");
        }
    }

    pub(crate) async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            running.stop().await;
        }
    }
}

/// The API and the pages on one database or `memory://` transport.
async fn console_on(url: &str, database: bool) {
    let h = ConsoleHarness::start(url).await;
    // 120 poison jobs: dead letters, listed over three pages of 50.
    let poison: Vec<Job> = (0..120).map(|n| Job { n, note: "bad".into() }).collect();
    let ids: Vec<String> = h
        .publisher
        .send_batch::<ConsoleJobs, _>(&poison)
        .await
        .into_iter()
        .map(|r| r.expect("sent").to_string())
        .collect();
    h.until_count("console-jobs", "dead", 120).await;
    let (listed, pages) = h.all_ids("console-jobs", "status=dead", 50).await;
    assert_eq!(pages, 3);
    assert_eq!(listed.len(), 120, "every dead letter once");
    assert_eq!(listed.iter().collect::<HashSet<_>>(), ids.iter().collect::<HashSet<_>>());
    assert_eq!(listed, ids, "oldest first");

    // One message: decoded, with its envelope and its failed attempt.
    let one = h.get_json(&format!("/api/v1/queues/console-jobs/messages/{}", ids[7])).await;
    assert_eq!(one["status"], "dead_letter");
    assert_eq!(one["type"], "console.job");
    assert_eq!(one["version"], 1);
    assert_eq!(one["body"]["data"]["n"], 7);
    assert_eq!(one["history"][0]["message"], "job 7 is poison");
    let missing = h.get("/api/v1/queues/console-jobs/messages/nope").await;
    assert_eq!((missing.status, missing.json()["status"].clone()), (404, json!(404)));

    // Filters.
    let typed = h.get_json("/api/v1/queues/console-jobs/messages?status=dead&type=console.job&limit=500").await;
    assert_eq!(typed["messages"].as_array().map(Vec::len), Some(120));
    let other = h.get_json("/api/v1/queues/console-jobs/messages?status=dead&type=other.type").await;
    assert_eq!(other["messages"], json!([]));

    // Three delayed jobs sleep; one is retried now (and handled), one deleted.
    for n in 0..3 {
        h.publisher
            .send::<ConsoleJobs, _>(&Job { n: 1000 + n, note: "ok".into() })
            .delay(Duration::from_secs(600))
            .await
            .expect("sent");
    }
    h.until_count("console-jobs", "sleeping", 3).await;
    let (sleeping, _) = h.all_ids("console-jobs", "status=sleeping", 10).await;
    assert_eq!(sleeping.len(), 3);
    let retried = h.post("/api/v1/queues/console-jobs/retry", json!({ "ids": [sleeping[0]] })).await;
    assert_eq!(retried["retried"], 1);
    h.until_count("console-jobs", "sleeping", 2).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while h.shop.handled.load(Ordering::SeqCst) < 1 {
        assert!(std::time::Instant::now() < deadline, "the retried job was not handled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deleted = h.post("/api/v1/queues/console-jobs/delete", json!({ "ids": [sleeping[1]] })).await;
    assert_eq!(deleted["deleted"], 1);
    assert_eq!(h.counts("console-jobs").await["sleeping"], 1);

    // The bug is fixed: two dead letters by id, then ten by filter, then the rest purged.
    h.shop.fixed.store(true, Ordering::SeqCst);
    let moved = h.post("/api/v1/queues/console-jobs/redrive", json!({ "ids": [ids[0], ids[1]] })).await;
    assert_eq!(moved["moved"], 2);
    h.until_count("console-jobs", "dead", 118).await;
    let by_filter = h.post("/api/v1/queues/console-jobs/redrive", json!({ "type": "console.job", "max": 10 })).await;
    assert_eq!(by_filter["moved"], 10);
    h.until_count("console-jobs", "dead", 108).await;
    let counted = h.post("/api/v1/queues/console-jobs/purge", json!({ "dry_run": true })).await;
    assert_eq!((counted["deleted"].clone(), counted["left"].clone()), (json!(108), json!(108)));
    let purged = h.post("/api/v1/queues/console-jobs/purge", json!({})).await;
    assert_eq!(purged["deleted"], 108);
    assert_eq!(h.counts("console-jobs").await["dead"], 0);
    // Moving them took them out of the dead letters at once; they run soon
    // after (on a loaded CI machine, not always before the purge returned).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while h.shop.handled.load(Ordering::SeqCst) < 13 {
        let handled = h.shop.handled.load(Ordering::SeqCst);
        assert!(std::time::Instant::now() < deadline, "the redriven jobs ran: {handled} of 13 in 20 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A message being handled is in flight, held until its visibility ends.
    // (The redriven jobs' acknowledgements may still be under way: wait for
    // them, so that the one in flight is this one.)
    h.until_count("console-jobs", "in_flight", 0).await;
    let slow = h.publisher.send::<ConsoleJobs, _>(&Job { n: 1500, note: "held".into() }).await.expect("sent");
    h.until_count("console-jobs", "in_flight", 1).await;
    let held = h.get_json("/api/v1/queues/console-jobs/messages?status=in_flight").await;
    assert_eq!(held["messages"][0]["message_id"], slow.as_str());
    let until = held["messages"][0]["held_until_ms"].as_i64().expect("held_until_ms");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64;
    assert!(until > now && until <= now + 31_000, "held until the visibility ends: {until} vs {now}");
    h.shop.let_go.store(true, Ordering::SeqCst);
    h.until_count("console-jobs", "in_flight", 0).await;
    h.shop.let_go.store(false, Ordering::SeqCst);

    // A newer version of an identity being handled waits, and shows.
    if database {
        let first = Job { n: 1600, note: "held".into() };
        h.publisher.send::<ConsoleJobs, _>(&first).id("job-1600").await.expect("sent");
        h.until_count("console-jobs", "in_flight", 1).await;
        let newer = Job { n: 1601, note: "held".into() };
        let second = h.publisher.send::<ConsoleJobs, _>(&newer).id("job-1600").await.expect("sent");
        let waiting =
            h.get_json("/api/v1/queues/console-jobs/messages?status=awaiting_release&identity=job-1600").await;
        let row = &waiting["messages"][0];
        assert_eq!(row["identity"], "job-1600", "{waiting}");
        assert_eq!(row["deferred"]["message_id"], second.as_str());
        assert_eq!(row["deferred"]["body"]["data"]["n"], 1601, "the waiting version's body, decoded");
        let page = h.get(&format!("/queues/console-jobs/messages/{}", row["message_id"].as_str().unwrap_or(""))).await;
        assert!(page.body.contains("waiting version") && page.body.contains("&#34;n&#34;: 1601"), "{}", page.body);
        h.shop.let_go.store(true, Ordering::SeqCst);
        h.until_count("console-jobs", "awaiting_release", 0).await;
        h.until_count("console-jobs", "in_flight", 0).await;
    }

    // Pause: nothing is received until the queue is resumed.
    let paused = h.post("/api/v1/queues/console-jobs/pause", json!({})).await;
    let scope = if database { "all_processes" } else { "this_process" };
    assert_eq!((paused["paused"].clone(), paused["scope"].clone()), (json!(true), json!(scope)));
    assert_eq!(h.get_json("/api/v1/queues/console-jobs").await["paused"], true);
    tokio::time::sleep(Duration::from_millis(400)).await; // a receive in flight ends
    let before = h.shop.handled.load(Ordering::SeqCst);
    h.publisher.send::<ConsoleJobs, _>(&Job { n: 2000, note: "ok".into() }).await.expect("sent");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.shop.handled.load(Ordering::SeqCst), before, "a paused queue handles nothing");
    assert_eq!(h.counts("console-jobs").await["pending"], 1);
    h.post("/api/v1/queues/console-jobs/resume", json!({})).await;
    h.until_count("console-jobs", "pending", 0).await;
    assert_eq!(h.get_json("/api/v1/queues/console-jobs").await["paused"], false);

    // FIFO dead letters by group.
    for (n, group) in [(1, "g1"), (2, "g2"), (3, "g1")] {
        h.shop.fixed.store(false, Ordering::SeqCst);
        h.publisher.send::<ConsoleGroups, _>(&Job { n, note: "bad".into() }).group(group).await.expect("sent");
    }
    h.until_count("console-groups.fifo", "dead", 3).await;
    let g1 = h.get_json("/api/v1/queues/console-groups.fifo/messages?status=dead&group=g1").await;
    let groups: Vec<&str> =
        g1["messages"].as_array().expect("list").iter().filter_map(|m| m["group_id"].as_str()).collect();
    assert_eq!(groups, ["g1", "g1"]);

    // Capabilities and the overview.
    let queues = h.get_json("/api/v1/queues").await;
    let ours = queues["queues"].as_array().expect("queues").iter().find(|q| q["name"] == "console-jobs").cloned();
    let ours = ours.expect("console-jobs in the overview");
    assert_eq!(ours["capabilities"]["list"], true);
    assert_eq!(ours["capabilities"]["purge"], true);
    assert_eq!(ours["kind"], "standard");
    assert!(ours["rates"]["handled_total"].as_u64().unwrap_or(0) >= 13, "{ours}");
    assert_eq!(
        ours["capabilities"]["statuses"].as_array().map(|s| s.contains(&json!("awaiting_release"))),
        Some(database)
    );

    errors_are_json(&h).await;
    hostile_payloads_render_as_text(&h).await;
    a_purge_from_the_page_asks_first(&h).await;
    h.stop().await;
}

/// The form token a page of the console carries.
fn form_token(page: &str) -> String {
    let rest = page.split("name=\"form_token\" value=\"").nth(1).expect("a form on the page");
    rest.split('"').next().unwrap_or_default().to_owned()
}

/// "Purge all" on the dead letters' page shows the count and deletes
/// nothing until it is confirmed.
async fn a_purge_from_the_page_asks_first(h: &ConsoleHarness) {
    let dead = h.counts("console-jobs").await["dead"].as_u64().expect("dead");
    assert!(dead >= 1, "a dead letter to purge");
    let page = h.get("/queues/console-jobs?status=dead").await.body;
    let token = form_token(&page);
    let form_type = ("Content-Type", "application/x-www-form-urlencoded");
    let form = format!("form_token={token}&status=dead&action=purge_all");
    let asked = call(&h.addr, "POST", "/ui/queues/console-jobs", &[form_type], &form).await;
    assert_eq!(asked.status, 200, "{}", asked.body);
    assert!(asked.body.contains(&format!("This deletes {dead} dead letter(s)")), "{}", asked.body);
    assert_eq!(h.counts("console-jobs").await["dead"], dead, "nothing deleted before the confirmation");
    let confirmed =
        call(&h.addr, "POST", "/ui/queues/console-jobs", &[form_type], &format!("{form}&confirm=yes")).await;
    assert_eq!(confirmed.status, 303, "{}", confirmed.body);
    assert!(confirmed.header("location").is_some_and(|l| l.contains(&format!("deleted%20{dead}%20message"))));
    assert_eq!(h.counts("console-jobs").await["dead"], 0);
}

/// Bad input is a JSON error with its status, never a panic.
async fn errors_are_json(h: &ConsoleHarness) {
    for (method, path, body, status) in [
        ("GET", "/api/v1/queues/no-such-queue", "", 404),
        ("GET", "/api/v1/queues/console-jobs-dlq", "", 404),
        ("GET", "/api/v1/queues/console-jobs/messages?status=lost", "", 400),
        ("GET", "/api/v1/queues/console-jobs/messages?limit=0", "", 400),
        ("GET", "/api/v1/queues/console-jobs/messages?limit=x", "", 400),
        ("GET", "/api/v1/queues/console-jobs/messages?after=garbage", "", 400),
        ("GET", "/api/v1/queues/console-jobs/messages?colour=red", "", 400),
        ("POST", "/api/v1/queues/console-jobs/explode", "{}", 404),
        ("POST", "/api/v1/queues/console-jobs/delete", "{\"ids\": []}", 400),
        ("POST", "/api/v1/queues/console-jobs/delete", "{\"ids\": 3}", 400),
        ("POST", "/api/v1/queues/console-jobs/redrive", "{\"type\": \"not.registered\"}", 400),
        ("POST", "/api/v1/queues/console-jobs/purge", "{\"older_than\": \"soon\"}", 400),
        ("POST", "/api/v1/queues/console-jobs/purge", "{\"ids\": [\"a\"]}", 400),
        ("POST", "/api/v1/queues/console-jobs/pause", "{\"why\": 1}", 400),
        ("POST", "/api/v1/queues/console-jobs/pause", "not json", 400),
        ("GET", "/api/v1/nothing/here", "", 404),
    ] {
        let reply = call(&h.addr, method, path, &[JSON], body).await;
        assert_eq!(reply.status, status, "{method} {path} {body}: {}", reply.body);
        let error = reply.json();
        assert_eq!(error["status"], status, "{error}");
        assert!(error["error"].as_str().is_some_and(|e| !e.is_empty()), "{error}");
    }
    let plain = call(&h.addr, "POST", "/api/v1/queues/console-jobs/pause", &[], "").await;
    assert_eq!(plain.status, 415, "an action needs a JSON content type: {}", plain.body);
}

/// A payload that holds markup renders as text on every page.
async fn hostile_payloads_render_as_text(h: &ConsoleHarness) {
    let hostile = "<script>alert(1)</script>\"><img src=x onerror=alert(1)>";
    let id = h.publisher.send::<ConsoleJobs, _>(&Job { n: 666, note: hostile.into() }).await.expect("sent");
    h.until_count("console-jobs", "dead", 1).await;
    for path in [
        "/".to_owned(),
        "/queues/console-jobs?status=dead".to_owned(),
        format!("/queues/console-jobs/messages/{id}"),
        "/queues/%3Cscript%3E".to_owned(),
        "/queues/console-jobs?status=%3Cb%3E".to_owned(),
    ] {
        let page = h.get(&path).await;
        assert!(page.status == 200 || page.status == 400 || page.status == 404, "{path}: {}", page.status);
        assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"), "{path}");
        assert!(!page.body.contains("<script>alert") && !page.body.contains("<img src=x"), "{path}: {}", page.body);
        assert!(!page.body.contains("<script>"), "{path}");
    }
    let status = h.get("/queues/console-jobs?status=%3Cb%3E").await;
    assert!(status.body.contains("&#60;b&#62;") && !status.body.contains("`<b>`"), "{}", status.body);
    let page = h.get(&format!("/queues/console-jobs/messages/{id}")).await;
    assert!(
        page.body.contains("&#60;script&#62;alert(1)&#60;/script&#62;"),
        "the payload shows as text: {}",
        page.body
    );
    let api = h.get_json(&format!("/api/v1/queues/console-jobs/messages/{id}")).await;
    assert_eq!(api["body"]["data"]["note"], hostile, "the API returns the payload as it is, as JSON");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_on_sqlite() {
    let file = fixtures::SqliteFile::new();
    console_on(&format!("{}&migrate=true&poll=100ms", file.url), true).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_on_postgres() {
    let pg = fixtures::Postgres::new().await;
    console_on(&format!("{}&migrate=true&poll=100ms", pg.url), true).await;
}

/// A consumer that received a message and stopped (killed, or cut off from
/// the database) leaves it in flight with nothing running to take it back:
/// the console says so, in the counts, the overview and the queue's page,
/// until the next receive takes it back.
async fn held_past_lease_on(url: &str) {
    let h = ConsoleHarness::start_with(url, &["console-groups.fifo"], Duration::from_millis(200)).await;
    let consumer = messaging::transport::connect(url).await.expect("connect");
    consumer.declare(&<ConsoleHeld as Queue>::SPEC).await.expect("declare");
    h.publisher.send::<ConsoleHeld, _>(&Job { n: 1, note: "ok".into() }).await.expect("sent");
    let held = consumer.receive("console-held", 10, Duration::from_secs(5)).await.expect("receive");
    assert_eq!(held.len(), 1, "received");
    let counts = h.counts("console-held").await;
    assert_eq!((&counts["in_flight"], &counts["expired"]), (&json!(1), &json!(0)), "{counts}");
    assert!(!h.get("/").await.body.contains("held past"), "nothing held past its lease yet");
    // The consumer stops: nothing acknowledges or extends the lease (3 s).
    drop(held);
    tokio::time::sleep(Duration::from_millis(3_300)).await;
    let counts = h.counts("console-held").await;
    assert_eq!((&counts["in_flight"], &counts["expired"]), (&json!(1), &json!(1)), "{counts}");
    let said = "1 message is held past its lease: the consumer that received it stopped";
    let overview = h.get("/").await.body;
    assert!(overview.contains(said), "the overview says why it stays in flight: {overview}");
    let page = h.get("/queues/console-held").await.body;
    assert!(page.contains(said) && page.contains(r#"id="expired""#), "the queue's page says so too: {page}");
    // The next receive takes it back (handled as usual: one lease that ran
    // out does not make a suspect).
    let again = consumer.receive("console-held", 10, Duration::from_secs(5)).await.expect("receive again");
    assert_eq!(again.len(), 1, "taken back and received again");
    assert!(!again[0].suspect, "one lease that ran out makes no suspect");
    let counts = h.counts("console-held").await;
    assert_eq!((&counts["in_flight"], &counts["expired"]), (&json!(1), &json!(0)), "{counts}");
    assert!(!h.get("/").await.body.contains("held past"), "held within its lease again");
    let acked = consumer.ack("console-held", vec![again[0].receipt.clone()]).await;
    assert!(acked.iter().all(Result::is_ok), "{acked:?}");
    h.until_count("console-held", "in_flight", 0).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_held_past_its_lease_is_shown_on_sqlite() {
    let file = fixtures::SqliteFile::new();
    held_past_lease_on(&format!("{}&migrate=true&poll=100ms", file.url)).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_held_past_its_lease_is_shown_on_postgres() {
    let pg = fixtures::Postgres::new().await;
    held_past_lease_on(&format!("{}&migrate=true&poll=100ms", pg.url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_on_memory() {
    console_on("memory://", false).await;
}

/// Pages and the API of a console on `addr` for a console `console`.
async fn serve(console: Console, addr: &str) -> String {
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
    let bound = listener.local_addr().expect("address");
    let router = console.listening_on(bound).router();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("127.0.0.1:{}", bound.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_loopback_every_request_needs_the_token() {
    let transport = messaging::transport::connect("memory://").await.expect("connect");
    let app = messaging::App::new(transport).await.expect("app");

    // No token, all interfaces: nothing is served, reads included.
    let open = serve(Console::of_app(&app), "0.0.0.0:0").await;
    for path in ["/api/v1/queues", "/", "/queues/console-jobs"] {
        let reply = call(&open, "GET", path, &[], "").await;
        assert_eq!(reply.status, 403, "{path}");
        assert!(reply.body.contains("MESSAGING_ADMIN_TOKEN"), "{path}: {}", reply.body);
    }

    // A token: the API wants it as a bearer header, the pages send to the login.
    let guarded = serve(Console::of_app(&app).token(Some("s3cret".into())), "0.0.0.0:0").await;
    assert_eq!(call(&guarded, "GET", "/api/v1/queues", &[], "").await.status, 401);
    let wrong = [("Authorization", "Bearer s3cre")];
    assert_eq!(call(&guarded, "GET", "/api/v1/queues", &wrong, "").await.status, 401);
    let bearer = ("Authorization", "Bearer s3cret");
    assert_eq!(call(&guarded, "GET", "/api/v1/queues", &[bearer], "").await.status, 200);
    let page = call(&guarded, "GET", "/", &[], "").await;
    assert_eq!((page.status, page.header("location")), (303, Some("/login")));
    let refused =
        call(&guarded, "POST", "/login", &[("Content-Type", "application/x-www-form-urlencoded")], "token=nope").await;
    assert_eq!(refused.status, 401);
    let login =
        call(&guarded, "POST", "/login", &[("Content-Type", "application/x-www-form-urlencoded")], "token=s3cret")
            .await;
    assert_eq!(login.status, 303);
    let cookie = login.header("set-cookie").expect("a cookie").to_owned();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let session = cookie.split(';').next().expect("name=value").to_owned();
    let overview = call(&guarded, "GET", "/", &[("Cookie", &session)], "").await;
    assert_eq!(overview.status, 200);
    assert!(overview.body.contains("console-jobs"));

    // Another site's request may not act, whatever it carries.
    let evil = [bearer, JSON, ("Origin", "http://evil.example")];
    let forged = call(&guarded, "POST", "/api/v1/queues/console-jobs/pause", &evil, "{}").await;
    assert_eq!(forged.status, 403, "{}", forged.body);
    let cross = [bearer, JSON, ("Sec-Fetch-Site", "cross-site")];
    assert_eq!(call(&guarded, "POST", "/api/v1/queues/console-jobs/pause", &cross, "{}").await.status, 403);
    // A form without this process's form token is refused.
    let form = [("Cookie", session.as_str()), ("Content-Type", "application/x-www-form-urlencoded")];
    let stale = call(&guarded, "POST", "/ui/queues/console-jobs", &form, "action=pause&form_token=old").await;
    assert_eq!(stale.status, 403, "{}", stale.body);
    let ok = call(&guarded, "POST", "/api/v1/queues/console-jobs/pause", &[bearer, JSON], "{}").await;
    assert_eq!(ok.status, 200, "{}", ok.body);

    // Read-only: everything shows, nothing acts.
    let read_only = serve(Console::of_app(&app).token(Some("s3cret".into())).read_only(true), "0.0.0.0:0").await;
    let shown = call(&read_only, "GET", "/queues/console-jobs?status=dead", &[bearer], "").await;
    assert_eq!(shown.status, 200);
    assert!(!shown.body.contains("name=\"action\""), "a read-only page shows no action");
    let acted = call(&read_only, "POST", "/api/v1/queues/console-jobs/pause", &[bearer, JSON], "{}").await;
    assert_eq!(acted.status, 403);
    assert!(acted.json()["error"].as_str().is_some_and(|e| e.contains("read-only")));

    // On loopback without a token it answers.
    let local = serve(Console::of_app(&app), "127.0.0.1:0").await;
    assert_eq!(call(&local, "GET", "/api/v1/queues", &[], "").await.status, 200);
}

#[cfg(feature = "sqs")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_on_sqs_shows_counts_and_browses_dead_letters() {
    let moto = fixtures::SqsServer::start();
    let h = ConsoleHarness::start_with(&moto.url(true), &["console-jobs"], Duration::from_secs(1)).await;

    let view = h.get_json("/api/v1/queues/console-jobs").await;
    let caps = &view["capabilities"];
    assert_eq!(
        (caps["list"].clone(), caps["delete"].clone(), caps["purge"].clone()),
        (json!(false), json!(false), json!(false))
    );
    assert_eq!((caps["dead_letters"].clone(), caps["pause"].clone()), (json!(true), json!("this_process")));
    assert_eq!(caps["statuses"], json!(["dead"]));
    for status in ["pending", "sleeping", "in_flight"] {
        let refused = h.get(&format!("/api/v1/queues/console-jobs/messages?status={status}")).await;
        assert_eq!(refused.status, 501, "listing {status} on SQS: {}", refused.body);
    }
    let refused = call(&h.addr, "POST", "/api/v1/queues/console-jobs/delete", &[JSON], "{\"ids\":[\"x\"]}").await;
    assert_eq!(refused.status, 501, "{}", refused.body);
    let refused = call(&h.addr, "POST", "/api/v1/queues/console-jobs/purge", &[JSON], "{}").await;
    assert_eq!(refused.status, 501, "{}", refused.body);

    // Three poison jobs: dead letters, read through the dead-letter queue.
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(h.publisher.send::<ConsoleJobs, _>(&Job { n, note: "bad".into() }).await.expect("sent").to_string());
    }
    h.until_count("console-jobs", "dead", 3).await;
    let listed = h.get_json("/api/v1/queues/console-jobs/messages").await;
    assert_eq!(listed["status"], "dead", "SQS lists its dead letters by default");
    let found: HashSet<String> = listed["messages"]
        .as_array()
        .expect("list")
        .iter()
        .map(|m| m["message_id"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(found, ids.iter().cloned().collect::<HashSet<_>>());
    let one = h.get_json(&format!("/api/v1/queues/console-jobs/messages/{}", ids[1])).await;
    assert_eq!(one["body"]["data"]["n"], 1);
    assert!(one["reason"].as_str().is_some_and(|r| r.contains("job 1 is poison")), "{one}");

    // Fixed: one by id goes back and is handled.
    h.shop.fixed.store(true, Ordering::SeqCst);
    let moved = h.post("/api/v1/queues/console-jobs/redrive", json!({ "ids": [ids[0]] })).await;
    assert_eq!(moved["moved"], 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while h.shop.handled.load(Ordering::SeqCst) < 1 {
        assert!(std::time::Instant::now() < deadline, "the redriven job was not handled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Pause this process's workers: a new job waits until the resume.
    let paused = h.post("/api/v1/queues/console-jobs/pause", json!({})).await;
    assert_eq!(paused["scope"], "this_process");
    tokio::time::sleep(Duration::from_millis(1500)).await; // the long poll in flight ends
    h.publisher.send::<ConsoleJobs, _>(&Job { n: 9, note: "ok".into() }).await.expect("sent");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(h.shop.handled.load(Ordering::SeqCst), 1, "paused: nothing received");
    h.post("/api/v1/queues/console-jobs/resume", json!({})).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while h.shop.handled.load(Ordering::SeqCst) < 2 {
        assert!(std::time::Instant::now() < deadline, "the job was not handled after the resume");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.stop().await;
}

#[cfg(feature = "postgres")]
mod another_process {
    use super::*;

    #[messaging::queue("console-paused")]
    struct Paused;

    #[messaging::message(name = "console.paused", v = 1)]
    #[derive(Debug, Clone, Serialize, Deserialize)]
    struct Tick {
        n: u32,
    }

    #[messaging::handler(queue = Paused)]
    async fn tick(tick: Tick, pool: State<sqlx::PgPool>) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO console_ticks (n) VALUES ($1)").bind(tick.n as i32).execute(&*pool).await?;
        Ok(())
    }

    /// The consuming process: serves `console-paused` until it is killed.
    #[test]
    #[ignore = "entry point of the consumer started by a_pause_is_honoured_by_another_process"]
    fn consumer_process() {
        let Ok(url) = std::env::var("MESSAGING_TEST_URL") else { return };
        fixtures::runtime().block_on(async move {
            let transport = messaging::transport::connect(&url).await.expect("connect");
            let mut app = messaging::App::new(transport).await.expect("app");
            app.only_queues(&["console-paused"]);
            app.setup().provide(sqlx::PgPool::connect(&url).await.expect("pool"));
            app.set_receive_wait(Duration::from_millis(200));
            app.start().expect("start").wait().await;
        });
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pause_is_honoured_by_another_process() {
        let pg = fixtures::Postgres::new().await;
        let url = format!("{}&migrate=true&poll=200ms", pg.url);
        let pool = sqlx::PgPool::connect(&pg.url).await.expect("pool");
        sqlx::query("CREATE TABLE console_ticks (n INT NOT NULL)").execute(&pool).await.expect("table");
        let transport = messaging::transport::connect(&url).await.expect("connect");
        let app = messaging::App::new(transport.clone()).await.expect("app");
        let addr = serve(Console::of_app(&app), "127.0.0.1:0").await;
        let publisher = Publisher::new(transport);
        /// Kills the consumer however the test ends.
        struct Killed(std::process::Child);
        impl Drop for Killed {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let _child = Killed(
            crate::fixtures::entry_process(module_path!(), "consumer_process")
                .env("MESSAGING_TEST_URL", &url)
                .env("RUST_LOG", "warn")
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("spawn the consumer"),
        );
        let ticks = || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM console_ticks").fetch_one(&pool).await.expect("count")
        };
        // The consumer runs: a first tick is handled.
        publisher.send::<Paused, _>(&Tick { n: 0 }).await.expect("sent");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while ticks().await < 1 {
            assert!(std::time::Instant::now() < deadline, "the consumer process handled nothing");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Paused here, in the database: the other process leases nothing.
        let paused = call(&addr, "POST", "/api/v1/queues/console-paused/pause", &[JSON], "{}").await;
        assert_eq!(paused.json()["scope"], "all_processes");
        tokio::time::sleep(Duration::from_millis(600)).await; // its cached flag is at most one poll old
        for n in 1..=5 {
            publisher.send::<Paused, _>(&Tick { n }).await.expect("sent");
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(ticks().await, 1, "a paused queue is leased by no process");
        let counts = call(&addr, "GET", "/api/v1/queues/console-paused", &[], "").await.json();
        assert_eq!((counts["paused"].clone(), counts["counts"]["pending"].clone()), (json!(true), json!(5)));
        // Resumed: the other process handles them within a poll or two.
        call(&addr, "POST", "/api/v1/queues/console-paused/resume", &[JSON], "{}").await;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while ticks().await < 6 {
            assert!(std::time::Instant::now() < deadline, "the resumed queue was not consumed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_nests_under_a_prefix_of_another_service() {
    let transport = messaging::transport::connect("memory://").await.expect("connect");
    let app = messaging::App::new(transport).await.expect("app");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let bound = listener.local_addr().expect("address");
    let console = Console::of_app(&app).listening_on(bound).router();
    let service = axum::Router::new().route("/", axum::routing::get(|| async { "the shop" })).nest("/ops", console);
    tokio::spawn(async move { axum::serve(listener, service).await });
    let addr = bound.to_string();
    assert_eq!(call(&addr, "GET", "/", &[], "").await.body, "the shop");
    let overview = call(&addr, "GET", "/ops", &[], "").await;
    assert_eq!(overview.status, 200);
    assert!(overview.body.contains("href=\"/ops/queues/console-jobs\""), "{}", overview.body);
    assert!(overview.body.contains("href=\"/ops/assets/console.css\""));
    assert!(overview.body.contains("class=\"home\" href=\"/ops\""), "the home link is the mount point");
    assert_eq!(call(&addr, "GET", "/ops/assets/console.css", &[], "").await.status, 200);
    assert_eq!(call(&addr, "GET", "/ops/api/v1/queues/console-jobs", &[], "").await.json()["name"], "console-jobs");
    // A page's form acts and sends the operator back under the prefix.
    let page = call(&addr, "GET", "/ops/queues/console-jobs", &[], "").await.body;
    let token = form_token(&page);
    let form = format!("form_token={token}&status=pending&action=pause");
    let form_type = ("Content-Type", "application/x-www-form-urlencoded");
    let acted = call(&addr, "POST", "/ops/ui/queues/console-jobs", &[form_type], &form).await;
    assert_eq!(acted.status, 303, "{}", acted.body);
    let back = acted.header("location").expect("back to the queue");
    assert!(back.starts_with("/ops/queues/console-jobs?status=pending&notice=paused"), "{back}");
    let unknown = call(&addr, "GET", "/ops/nowhere", &[], "").await;
    assert_eq!((unknown.status, unknown.json()["status"].clone()), (404, json!(404)));
}
