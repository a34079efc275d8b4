//! The command line every `#[messaging::main]` binary gets, exercised on the
//! orders example: `run` (default, here draining), `validate`, `queues`,
//! transport selection, and graceful exit on SIGTERM.

use crate::fixtures;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A fresh working directory (the default transport writes `messaging.db` there).
struct WorkDir(PathBuf);

impl WorkDir {
    fn new() -> WorkDir {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("orders-cli-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        WorkDir(dir)
    }

    /// The URL of the example's database here.
    #[cfg(feature = "sqlite")]
    fn database(&self) -> String {
        format!("sqlite://{}", self.0.join("messaging.db").display())
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The example binary (built on demand when the test runs on its own), run in `dir`.
fn orders_in(dir: &WorkDir) -> Command {
    let mut cmd = orders();
    cmd.current_dir(&dir.0);
    cmd
}

/// The orders example binary, built on demand when the test runs on its own.
fn orders() -> Command {
    example("orders")
}

/// An example binary, built first (see [`fixtures::example_binary`]).
fn example(name: &str) -> Command {
    let mut cmd = Command::new(fixtures::example_binary(name));
    cmd.env_remove("MESSAGING_URL").env("RUST_LOG", "warn");
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn run_handles_the_demo_orders_and_exits() {
    let dir = WorkDir::new();
    // The default log filter (no RUST_LOG).
    let out = run(orders_in(&dir).env_remove("RUST_LOG"));
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for line in [
        "handled order A1 for ada (coupon: WELCOME; v2)",
        "handled order A2 for grace (coupon: none; v2)",
        "handled order A3 for linus (coupon: none; arrived as v1, upcast to v2)",
        "sent confirmation of order A3 to linus@example.com",
    ] {
        assert!(text.contains(line), "missing `{line}` in:\n{text}");
    }
    // Logs to a pipe are plain text, and carry the app's and the framework's
    // INFO lines, not the dependencies'.
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(!logs.contains('\x1b'), "no colour codes off a terminal: {logs}");
    assert!(logs.contains(" INFO messaging"), "{logs}");
    assert!(!logs.contains(" INFO sqlx") && !logs.contains(" INFO opentelemetry"), "{logs}");
    assert!(dir.0.join("messaging.db").exists(), "the embedded default is a SQLite file");
    // The queues are empty afterwards, on disk.
    let out = run(orders_in(&dir).arg("queues"));
    let listing = stdout(&out);
    let orders_line = listing.lines().find(|l| l.starts_with("orders.fifo")).unwrap_or_default();
    assert_eq!(orders_line.split_whitespace().nth(2), Some("0"), "{listing}");
}

/// A reader that goes away (`app queues | head -1`) ends the output, not
/// the command: no panic, no backtrace, exit 0.
#[test]
fn output_into_a_closed_pipe_is_dropped_quietly() {
    let mut child = orders()
        .args(["--transport", "memory://", "queues"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The read end closes before the command has started, so its first
    // line meets a closed pipe.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let errors = String::from_utf8_lossy(&out.stderr);
    assert!(!errors.contains("panicked"), "{errors}");
    assert!(out.status.success(), "{:?}: {errors}", out.status);
}

#[test]
fn validate_and_queues() {
    let dir = WorkDir::new();
    // The app's own name and version, not the framework's.
    let out = run(orders_in(&dir).arg("--version"));
    assert_eq!(stdout(&out).trim(), format!("orders {}", env!("CARGO_PKG_VERSION")));
    assert!(run(orders_in(&dir).arg("migrate")).status.success());
    let out = run(orders_in(&dir).arg("validate"));
    assert!(out.status.success());
    assert!(stdout(&out).starts_with("ok: 2 queue(s), 2 handler(s) on sqlite"), "{}", stdout(&out));
    // The example's `main` publishes three orders; `validate` runs it to
    // check the setup and sends none of them, saying so.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "note: main published 3 message(s) (3 to `orders.fifo`) while setting up; `validate` sends nothing, so \
             none was sent (only `run` publishes what main sends)"
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(orders_in(&dir).args(["queues", "--json"]));
    let line = stdout(&out).lines().find(|l| l.contains("\"name\":\"orders.fifo\"")).map(str::to_owned);
    let queue: serde_json::Value = serde_json::from_str(&line.unwrap_or_default()).unwrap();
    assert_eq!(queue["depth"], 0, "validate published nothing: {queue}");
    let out = run(orders().args(["--transport", "memory://", "queues"]));
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(text.contains("orders.fifo") && text.contains("fifo") && text.contains("orders-dlq.fifo"), "{text}");
    assert!(text.contains("emails") && text.contains("standard"), "{text}");
}

#[test]
fn a_bad_transport_url_is_a_clear_error() {
    let out = run(orders().env("MESSAGING_URL", "carrier-pigeon://coop"));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown scheme `carrier-pigeon`"), "{err}");
    let out = run(orders().args(["--transport", "no-scheme", "validate"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected SCHEME://"));
    let out = run(orders().args(["--transport", "memory://", "run", "--drain", "--serve"]));
    assert_eq!(out.status.code(), Some(2), "clap rejects conflicting flags");
}

#[cfg(unix)]
#[test]
fn serve_mode_stops_gracefully_on_sigterm() {
    use std::io::BufRead;
    let dir = WorkDir::new();
    let mut child =
        orders_in(&dir).args(["run", "--serve"]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let (lines, seen) = std::sync::mpsc::channel();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in stdout.lines().map_while(Result::ok) {
            all.push_str(&line);
            all.push('\n');
            let _ = lines.send(line);
        }
        all
    });
    // Wait until it has handled the demo orders...
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match seen.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains("sent confirmation of order A3") => break,
            Ok(_) => {}
            Err(_) => {
                let _ = child.kill();
                panic!("the demo orders were not handled within 30 s");
            }
        }
    }
    // ...and see that it goes on serving rather than exiting when drained,
    // then ask it to stop.
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "--serve keeps running after the demo");
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let status = fixtures::wait_for(&mut child, Duration::from_secs(10), "the orders example after SIGTERM");
    assert!(status.success(), "exit status {status:?}");
    assert!(reader.join().unwrap().contains("handled order A3"));
}

use fixtures::http_get;

#[test]
fn run_serves_health_readiness_and_metrics_and_logs_json() {
    use std::io::BufRead;
    let dir = WorkDir::new();
    let mut child = orders_in(&dir)
        .args(["run", "--serve", "--http", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .env("MESSAGING_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Every log line is a JSON object; one of them says where the endpoint listens.
    let (lines, logged) = std::sync::mpsc::channel();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let address = loop {
        let Ok(line) = logged.recv_timeout(deadline.saturating_duration_since(Instant::now())) else {
            let _ = child.kill();
            panic!("the endpoint's address was not logged within 30 s (or the process exited)");
        };
        let entry: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        if let Some(addr) = entry["fields"]["address"].as_str() {
            break addr.to_owned();
        }
    };
    assert!(address.starts_with("127.0.0.1:"), "{address}");
    let (status, body) = http_get(&address, "/health");
    assert_eq!(status, 200, "{body}");
    assert_eq!(http_get(&address, "/ready").0, 200);
    // The demo orders get handled; their metrics show up in the scrape.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, metrics) = http_get(&address, "/metrics");
        assert_eq!(status, 200);
        if metrics.contains("messaging_client_consumed_messages") && metrics.contains("orders.fifo") {
            break;
        }
        assert!(Instant::now() < deadline, "no consume metrics in:\n{metrics}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let status = fixtures::wait_for(&mut child, Duration::from_secs(10), "the orders example after SIGTERM");
    assert!(status.success(), "exit status {status:?}");
}

#[test]
fn the_telemetry_example_handles_its_readings() {
    let dir = WorkDir::new();
    let mut cmd = example("telemetry");
    cmd.current_dir(&dir.0);
    let out = run(&mut cmd);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for line in
        ["handled reading of m-1 (12.5 kWh) for tenant north", "handled reading of m-2 (3.25 kWh) for tenant south"]
    {
        assert!(text.contains(line), "missing `{line}` in:\n{text}");
    }
}

/// The example's SQLite database with `orders.fifo` declared as the example
/// declares it.
#[cfg(feature = "sqlite")]
async fn orders_fifo(dir: &WorkDir) -> std::sync::Arc<dyn messaging::transport::Transport> {
    orders_fifo_at(&format!("{}?migrate=true", dir.database())).await
}

/// The transport at `url` with `orders.fifo` declared as the example
/// declares it.
#[cfg(any(feature = "sqlite", feature = "sqs"))]
async fn orders_fifo_at(url: &str) -> std::sync::Arc<dyn messaging::transport::Transport> {
    let t = messaging::transport::connect(url).await.unwrap();
    let spec = messaging::QueueSpec {
        fifo: true,
        dlq: Some("orders-dlq.fifo"),
        default_group: Some("orders"),
        ..messaging::QueueSpec::standard("orders.fifo")
    };
    t.declare(&spec).await.unwrap();
    t
}

/// The body of every planted letter.
#[cfg(any(feature = "sqlite", feature = "sqs"))]
const PLANTED: &[u8] = br#"{"type":"orders.placed","v":2,"data":{"order_id":"Z9","customer_id":"zoe","coupon":null}}"#;

/// Plants one dead letter in the example's SQLite database, as a permanently
/// failed message of `orders.fifo` would leave it.
#[cfg(feature = "sqlite")]
fn plant_dead_letter(dir: &WorkDir) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let t = orders_fifo(dir).await;
        let out = messaging::transport::Outgoing {
            body: PLANTED.to_vec().into(),
            group_id: Some("zoe".into()),
            ..Default::default()
        };
        t.send("orders.fifo", out).await.unwrap();
        let d = t.receive("orders.fifo", 1, std::time::Duration::from_secs(1)).await.unwrap().remove(0);
        t.dead_letters()
            .unwrap()
            .dead_letter("orders.fifo", &d, messaging::transport::FailedAttempt::new(1, "Declined", "card declined"))
            .await
            .unwrap();
    });
}

#[cfg(feature = "sqlite")]
#[test]
fn dead_letters_from_the_command_line() {
    let dir = WorkDir::new();
    plant_dead_letter(&dir);
    let out = run(orders_in(&dir).args(["dlq", "peek", "orders.fifo", "--json"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(line["type"], "orders.placed");
    assert_eq!(line["reason"], "card declined (after 1 attempt)");
    assert_eq!(line["history"][0]["type"], "Declined", "{line}");
    assert_eq!(line["history"][0]["message"], "card declined", "{line}");
    assert_eq!(line["history"][0]["attempt"], 1, "{line}");
    // The body decoded (the envelope with its data), and when it failed.
    assert_eq!(line["body"]["type"], "orders.placed", "{line}");
    assert_eq!(line["body"]["data"]["order_id"], "Z9", "{line}");
    assert!(line["failed_at"].as_str().is_some_and(|t| t.ends_with('Z') && t.contains('T')), "{line}");
    // `show` finds it under its source queue, with its history and decoded body.
    let id = line["message_id"].as_str().expect("an id").to_owned();
    let out = run(orders_in(&dir).args(["show", "orders.fifo", &id, "--json"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(shown["status"], "dead_letter", "{shown}");
    assert_eq!(shown["history"][0]["type"], "Declined", "{shown}");
    assert_eq!(shown["body"]["data"]["order_id"], "Z9", "{shown}");
    let out = run(orders_in(&dir).args(["show", "orders.fifo", &id]));
    assert!(stdout(&out).contains("reason    card declined (after 1 attempt)"), "{}", stdout(&out));
    assert!(stdout(&out).contains(": Declined: card declined"), "{}", stdout(&out));
    let out = run(orders_in(&dir).args(["show", "orders.fifo", "no-such-id"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no message `no-such-id` in `orders.fifo`"));
    // A dead-letter queue's name is answered with its queue's.
    let out = run(orders_in(&dir).args(["dlq", "peek", "orders-dlq.fifo"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("`orders-dlq.fifo` is the dead-letter queue of `orders.fifo`"), "{stderr}");
    let out = run(orders_in(&dir).arg("queues"));
    assert!(stdout(&out).contains("1 in orders-dlq.fifo"), "{}", stdout(&out));
    // A type filter that matches nothing moves nothing.
    let out = run(orders_in(&dir).args(["dlq", "redrive", "orders.fifo", "--type", "emails.confirmation"]));
    assert!(stdout(&out).contains("redrove 0 message(s)"), "{}", stdout(&out));
    let out = run(orders_in(&dir).args(["dlq", "redrive", "orders.fifo", "--type", "orders.placed"]));
    assert!(out.status.success());
    assert!(stdout(&out).contains("redrove 1 message(s) of `orders.fifo`"), "{}", stdout(&out));
    let out = run(orders_in(&dir).args(["dlq", "peek", "orders.fifo"]));
    assert!(stdout(&out).contains("no dead letters"), "{}", stdout(&out));
    let out = run(orders_in(&dir).args(["dlq", "peek", "nope"]));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("error: `nope` is not a declared queue; declared: emails, orders.fifo"), "{stderr}");
}

#[cfg(feature = "sqlite")]
#[test]
fn dead_letters_are_counted_deleted_and_purged_from_the_command_line() {
    let dir = WorkDir::new();
    for _ in 0..4 {
        plant_dead_letter(&dir);
    }
    let dlq = |args: &[&str]| {
        let out = run(orders_in(&dir).arg("dlq").args(args));
        (out.status.code(), stdout(&out), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // --max 1 moves one and says how many are left.
    let (code, out, err) = dlq(&["redrive", "orders.fifo", "--max", "1"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("redrove 1 message(s) of `orders.fifo`; 0 skipped by the filter; 3 left"), "{out}");
    // An unknown type is an error naming the registered ones, not a silent no-op.
    let (code, _, err) = dlq(&["redrive", "orders.fifo", "--type", "nosuch"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("`nosuch` is not a registered message type; registered: "), "{err}");
    assert!(err.contains("orders.placed"), "{err}");
    // A dry run counts and changes nothing.
    let (_, out, _) = dlq(&["redrive", "orders.fifo", "--dry-run"]);
    assert!(out.contains("would redrive 3 message(s)"), "{out}");
    let (_, out, _) = dlq(&["purge", "orders.fifo", "--dry-run"]);
    assert!(out.contains("would delete 3 dead letter(s)"), "{out}");
    assert!(out.contains("nothing was deleted"), "{out}");
    // The same counts as JSON, for scripts.
    let json = |out: &str| -> serde_json::Value {
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not one JSON object ({e}): {out}"))
    };
    let (_, out, _) = dlq(&["redrive", "orders.fifo", "--dry-run", "--json"]);
    assert_eq!(
        json(&out),
        serde_json::json!({"queue": "orders.fifo", "dry_run": true, "moved": 3, "skipped": 0, "left": 3})
    );
    let (_, out, _) = dlq(&["purge", "orders.fifo", "--dry-run", "--json", "--type", "orders.placed"]);
    assert_eq!(
        json(&out),
        serde_json::json!({"queue": "orders.fifo", "dry_run": true, "deleted": 3, "skipped": 0, "left": 3})
    );
    let (_, out, _) = dlq(&["delete", "orders.fifo", "--json", "not-a-letter"]);
    assert_eq!(json(&out), serde_json::json!({"queue": "orders.fifo", "requested": 1, "deleted": 0}));
    // Delete one by id.
    let (_, peeked, _) = dlq(&["peek", "orders.fifo", "--json"]);
    let first: serde_json::Value = serde_json::from_str(peeked.lines().next().expect("a letter")).unwrap();
    let id = first["message_id"].as_str().expect("an id").to_owned();
    let (code, out, err) = dlq(&["delete", "orders.fifo", &id, "not-a-letter"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("deleted 1 of 2 dead letter(s)"), "{out}");
    // Purge asks for --yes; letters failed just now are not older than a day.
    let (code, _, err) = dlq(&["purge", "orders.fifo"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("for good: add --yes") && err.contains("(2 now)"), "{err}");
    let (_, out, _) = dlq(&["purge", "orders.fifo", "--older-than", "1d", "--yes"]);
    assert!(out.contains("deleted 0 dead letter(s) of `orders.fifo`; 2 skipped by the filter; 2 left"), "{out}");
    let (_, out, _) = dlq(&["purge", "orders.fifo", "--type", "orders.placed", "--yes"]);
    assert!(out.contains("deleted 2 dead letter(s) of `orders.fifo`; 0 skipped by the filter; 0 left"), "{out}");
    let out = run(orders_in(&dir).arg("queues"));
    let line = stdout(&out).lines().find(|l| l.starts_with("orders.fifo")).map(str::to_owned).unwrap_or_default();
    let depth: Vec<&str> = line.split_whitespace().collect();
    assert_eq!((depth.get(2), depth.get(5)), (Some(&"1"), Some(&"0")), "the redriven one is back, none dead: {line}");
}

/// A consumer that died holding a message leaves it in flight until some
/// receive takes it back: `queues` says so (and `--json` counts it).
#[cfg(feature = "sqlite")]
#[test]
fn queues_names_the_messages_held_past_their_lease() {
    use sqlx::Connection as _;
    let dir = WorkDir::new();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let t = orders_fifo(&dir).await;
        let out = messaging::transport::Outgoing {
            body: PLANTED.to_vec().into(),
            group_id: Some("zoe".into()),
            ..Default::default()
        };
        t.send("orders.fifo", out).await.unwrap();
        let held = t.receive("orders.fifo", 1, std::time::Duration::from_secs(1)).await.unwrap();
        assert_eq!(held.len(), 1);
        // The consumer is gone and its lease has run out (set in the past
        // rather than waited for).
        let mut conn = sqlx::SqliteConnection::connect(&dir.database()).await.unwrap();
        sqlx::query("UPDATE messaging_messages SET lease_expires = 1 WHERE queue = 'orders.fifo'")
            .execute(&mut conn)
            .await
            .unwrap();
    });
    let out = run(orders_in(&dir).arg("queues"));
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    let said = "  1 message is held past its lease: the consumer that received it stopped";
    assert!(text.lines().any(|l| l.starts_with(said)), "{text}");
    let lines = queues_json(&mut orders_in(&dir));
    let orders = lines.iter().find(|l| l["name"] == "orders.fifo").expect("orders.fifo");
    assert_eq!(orders["held_past_lease"], 1, "{orders}");
    let emails = lines.iter().find(|l| l["name"] == "emails").expect("emails");
    assert_eq!(emails["held_past_lease"], 0, "{emails}");
}

/// While messages move to the dead letters, `queues` counts the queue and
/// its dead letters in one snapshot: the two add up to what there is. (Asked
/// apart, 20,000 letters being dead-lettered read 10,907 + 9,127.)
#[cfg(feature = "sqlite")]
#[test]
fn queues_counts_depth_and_dead_letters_in_one_snapshot() {
    use sqlx::Connection as _;
    use std::sync::atomic::{AtomicBool, Ordering};
    const MESSAGES: u64 = 5_000;
    let dir = WorkDir::new();
    plant(&dir, MESSAGES as usize, "pending");
    let url = dir.database();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // Counted once before anything moves (which also builds the example
    // first, when the test runs on its own).
    let orders = |lines: Vec<serde_json::Value>| {
        let orders = lines.into_iter().find(|l| l["name"] == "orders.fifo").expect("orders.fifo");
        (orders["depth"].as_u64().unwrap(), orders["dead_letters"].as_u64().unwrap())
    };
    assert_eq!(orders(queues_json(&mut orders_in(&dir))), (MESSAGES, 0));
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let mover = {
        let (stop, url) = (stop.clone(), url.clone());
        std::thread::spawn(move || {
            runtime.block_on(async {
                let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
                while !stop.load(Ordering::SeqCst) {
                    sqlx::query(
                        "UPDATE messaging_messages SET status = 'error' WHERE id = (SELECT min(id) FROM \
                         messaging_messages WHERE queue = 'orders.fifo' AND status = 'pending')",
                    )
                    .execute(&mut conn)
                    .await
                    .unwrap();
                    // About 5 s for all: longer than the counting below.
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            })
        })
    };
    let mut seen = Vec::new();
    for _ in 0..12 {
        seen.push(orders(queues_json(&mut orders_in(&dir))));
    }
    stop.store(true, Ordering::SeqCst);
    mover.join().unwrap();
    assert!(seen.iter().any(|&(_, dead)| dead > 0 && dead < MESSAGES), "nothing moved while counting: {seen:?}");
    assert!(seen.iter().all(|&(depth, dead)| depth + dead == MESSAGES), "depth + dead letters: {seen:?}");
}

/// Plants `n` dead letters of `orders.fifo` in the example's SQLite
/// database, quickly: published, then marked as dead letters in one
/// statement.
#[cfg(feature = "sqlite")]
fn plant_dead_letters(dir: &WorkDir, n: usize) {
    plant(dir, n, "error");
}

/// Plants `n` messages of `orders.fifo` in the example's SQLite database,
/// quickly: published, then given `status` in one statement.
#[cfg(feature = "sqlite")]
fn plant(dir: &WorkDir, n: usize, status: &str) {
    use sqlx::Connection as _;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let t = orders_fifo(dir).await;
        for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
            let batch = chunk
                .iter()
                .map(|i| messaging::transport::Outgoing {
                    body: PLANTED.to_vec().into(),
                    group_id: Some(format!("customer-{}", i % 7)),
                    ..Default::default()
                })
                .collect();
            for result in t.send_batch("orders.fifo", batch).await {
                result.unwrap();
            }
        }
        let url = dir.database();
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::query("UPDATE messaging_messages SET status = ?1 WHERE queue = 'orders.fifo'")
            .bind(status)
            .execute(&mut conn)
            .await
            .unwrap();
    });
}

/// The dead letters left in the example's database.
#[cfg(feature = "sqlite")]
fn dead_letters_left(dir: &WorkDir) -> i64 {
    use sqlx::Connection as _;
    let url = dir.database();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::query_scalar("SELECT count(*) FROM messaging_messages WHERE queue = 'orders.fifo' AND status = 'error'")
            .fetch_one(&mut conn)
            .await
            .unwrap()
    })
}

/// Ctrl-C during a long redrive: it stops taking letters at once, exits 130
/// within the two seconds it gives itself, and says how many it moved and
/// how many are left; run again, it moves the rest. (Before, the signal's
/// default action ended it silently, the operator left to count.)
#[cfg(feature = "sqlite")]
#[test]
fn a_redrive_stopped_by_a_signal_says_where_it_stands_and_goes_on_when_run_again() {
    const LETTERS: i64 = 60_000;
    let dir = WorkDir::new();
    plant_dead_letters(&dir, LETTERS as usize);
    let child = orders_in(&dir)
        .args(["dlq", "redrive", "orders.fifo"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The signal once the first pages have moved.
    let deadline = Instant::now() + Duration::from_secs(60);
    while dead_letters_left(&dir) == LETTERS {
        assert!(Instant::now() < deadline, "the redrive never moved a letter");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    let signalled = Instant::now();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(signalled.elapsed() < Duration::from_secs(4), "{:?}", signalled.elapsed());
    let line = stderr.lines().find(|l| l.starts_with("stopped by a signal: ")).unwrap_or_else(|| panic!("{stderr}"));
    let numbers: Vec<i64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    let [moved, left] = numbers[..] else { panic!("{line}") };
    assert!(moved > 0 && left > 0, "stopped part way: {line}");
    assert_eq!(moved + left, LETTERS, "{line}");
    assert_eq!(left, dead_letters_left(&dir), "{line}");
    assert!(line.ends_with("run `dlq redrive orders.fifo` again to go on with the rest"), "{line}");
    let out = run(orders_in(&dir).args(["dlq", "redrive", "orders.fifo"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout(&out).contains(&format!("redrove {left} message(s) of `orders.fifo`")), "{}", stdout(&out));
    let out = run(orders_in(&dir).arg("queues"));
    let line = stdout(&out).lines().find(|l| l.starts_with("orders.fifo")).map(str::to_owned).unwrap_or_default();
    let columns: Vec<&str> = line.split_whitespace().collect();
    let all = LETTERS.to_string();
    assert_eq!((columns.get(2), columns.get(5)), (Some(&all.as_str()), Some(&"0")), "each letter back once: {line}");
}

#[test]
fn health_has_an_exit_code_for_orchestrators() {
    let dir = WorkDir::new();
    assert!(run(orders_in(&dir).arg("migrate")).status.success());
    let out = run(orders_in(&dir).arg("health"));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout(&out).starts_with("healthy: 2 queue(s) reachable on sqlite"), "{}", stdout(&out));
    let out = run(orders_in(&dir).args(["--transport", "postgres://postgres@127.0.0.1:1/none", "health"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect to PostgreSQL"));
}

#[cfg(feature = "sqs")]
#[test]
fn the_same_app_runs_on_sqs_by_configuration() {
    let moto = fixtures::SqsServer::start();
    let out = run(example("sqs_orders")
        .env_remove("MESSAGING_URL")
        .env("RUST_LOG", "warn")
        .env("MESSAGING_URL", moto.url(true))
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test"));
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for line in
        ["handled order S1 for ada", "handled order S2 for grace (coupon: SPRING; v2)", "arrived as v1, upcast to v2"]
    {
        assert!(text.contains(line), "missing `{line}` in:\n{text}");
    }
    // What SQS does not offer is refused as such: the reason alone, not a
    // "message rejected" nor the advice to run it again for the rest.
    for (args, said) in [
        (
            &["dlq", "redrive", "orders.fifo", "--dry-run"][..],
            "error: a dry run of a redrive of `orders.fifo` is not supported on SQS; `dlq peek` shows the letters\n",
        ),
        (
            &["dlq", "purge", "orders.fifo", "--yes"][..],
            "error: purging the dead letters of `orders.fifo` is not supported by this transport\n",
        ),
    ] {
        let out = run(example("sqs_orders")
            .args(args)
            .env("MESSAGING_URL", moto.url(false))
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test"));
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), said, "{args:?}");
    }
    // `show` on SQS finds a dead letter by the id the logs gave.
    let id = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
        let t = orders_fifo_at(&moto.url(false)).await;
        let out = messaging::transport::Outgoing {
            body: PLANTED.to_vec().into(),
            group_id: Some("zoe".into()),
            ..Default::default()
        };
        let id = t.send("orders.fifo", out).await.unwrap();
        let d = t.receive("orders.fifo", 1, std::time::Duration::from_secs(5)).await.unwrap().remove(0);
        assert_eq!(d.message_id, id);
        let failure = messaging::transport::FailedAttempt::new(1, "Declined", "card declined");
        t.dead_letters().unwrap().dead_letter("orders.fifo", &d, failure).await.unwrap();
        id.to_string()
    });
    let show = |id: &str| {
        run(example("sqs_orders")
            .args(["show", "orders.fifo", id])
            .env("MESSAGING_URL", moto.url(false))
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test"))
    };
    let out = show(&id);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for line in [&format!("message   {id}")[..], "status    dead", "group     zoe", "reason    card declined"] {
        assert!(text.lines().any(|l| l.starts_with(line)), "missing `{line}` in:\n{text}");
    }
    let out = show("not-a-letter");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("on this transport `show` finds dead letters only"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = WorkDir::new();
    let mut elsewhere = example("sqs_orders");
    elsewhere.current_dir(&dir.0).env_remove("MESSAGING_URL");
    let out = run(&mut elsewhere);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("this example runs on Amazon SQS, not on sqlite"));
}

#[cfg(feature = "sqlite")]
#[test]
fn publish_reads_the_data_as_the_registered_type() {
    let dir = WorkDir::new();
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();
    let publish = |args: &[&str]| run(orders_in(&dir).arg("publish").args(args));
    // The newest version; the group from the message's field.
    let out = publish(&[
        "orders.fifo",
        "--type",
        "orders.placed",
        "--data",
        r#"{"order_id":"C1","customer_id":"cy","coupon":"SPRING"}"#,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("published orders.placed v2 to `orders.fifo` as "), "{}", stdout(&out));
    // A misspelt optional field is left out, with a warning.
    let out = publish(&[
        "orders.fifo",
        "--type",
        "orders.placed",
        "--data",
        r#"{"order_id":"C4","customer_id":"cy","cuopon":"X"}"#,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("warning: `cuopon` is not a field of orders.placed v2"), "{}", stderr(&out));
    // An older version (no group field: the queue's default group), upcast by the handler.
    let out = publish(&[
        "orders.fifo",
        "--type",
        "orders.placed",
        "--version",
        "1",
        "--data",
        r#"{"order_id":"C2","customer_id":"cy"}"#,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The data from standard input, with an attribute.
    let mut child = orders_in(&dir)
        .args(["publish", "emails", "--type", "emails.confirmation", "--data", "-", "--attribute", "tenant=acme"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(br#"{"order_id":"E1","to":"eve@example.com"}"#).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // Errors name what is wrong, and send nothing.
    for (args, expected) in [
        (
            vec!["orders.fifo", "--type", "orders.placed", "--data", r#"{"order_id":"C3"}"#],
            "missing field `customer_id`",
        ),
        (vec!["orders.fifo", "--type", "orders.placed", "--data", "not json"], "is not a valid `orders.placed v2`"),
        (
            vec!["orders.fifo", "--type", "nope", "--data", "{}"],
            "no message type `nope`; known: emails.confirmation, orders.placed",
        ),
        (
            vec!["nowhere", "--type", "orders.placed", "--data", "{}"],
            "`nowhere` is not a declared queue; declared: emails, orders.fifo",
        ),
        (
            vec!["orders.fifo", "--type", "orders.placed", "--version", "7", "--data", "{}"],
            "has no version 7; it has 1, 2",
        ),
        (
            vec![
                "orders.fifo",
                "--type",
                "emails.confirmation",
                "--delay",
                "5s",
                "--data",
                r#"{"order_id":"X","to":"x"}"#,
            ],
            "FIFO queue `orders.fifo` takes no per-message delay",
        ),
        (
            vec![
                "emails",
                "--type",
                "emails.confirmation",
                "--attribute",
                "AWS.x=1",
                "--data",
                r#"{"order_id":"X","to":"x"}"#,
            ],
            "reserved by SQS",
        ),
    ] {
        let out = publish(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr(&out).contains(expected), "{args:?}: {}", stderr(&out));
    }
    let listing = stdout(&run(orders_in(&dir).arg("queues")));
    let depth = |queue: &str| {
        listing.lines().find(|l| l.starts_with(queue)).and_then(|l| l.split_whitespace().nth(2).map(str::to_owned))
    };
    assert_eq!((depth("orders.fifo").as_deref(), depth("emails ").as_deref()), (Some("3"), Some("1")), "{listing}");
    // The app handles them (beside its demo orders).
    let out = run(&mut orders_in(&dir));
    let text = stdout(&out);
    for line in [
        "handled order C1 for cy (coupon: SPRING; v2)",
        "handled order C2 for cy (coupon: none; arrived as v1, upcast to v2)",
        "handled order C4 for cy (coupon: none; v2)",
        "sent confirmation of order E1 to eve@example.com",
    ] {
        assert!(text.contains(line), "missing `{line}` in:\n{text}");
    }
}

/// The lines of `queues --json`, parsed.
fn queues_json(cmd: &mut Command) -> Vec<serde_json::Value> {
    let out = run(cmd.args(["queues", "--json"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect()
}

fn files_in(dir: &WorkDir) -> Vec<String> {
    std::fs::read_dir(&dir.0).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

#[test]
fn read_only_commands_create_no_database_and_say_so() {
    let dir = WorkDir::new();
    for args in [
        &["queues"][..],
        &["validate"],
        &["health"],
        &["dlq", "peek", "orders.fifo"],
        &["dlq", "redrive", "orders.fifo", "--dry-run"],
        &["dlq", "delete", "orders.fifo", "some-id"],
        &["dlq", "purge", "orders.fifo", "--yes"],
        &["show", "orders.fifo", "some-id"],
    ] {
        let out = run(orders_in(&dir).args(args));
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("there is no database file `messaging.db`"), "{args:?}: {err}");
        assert!(err.contains("`run` or `migrate` creates it"), "{args:?}: {err}");
        assert_eq!(files_in(&dir), Vec::<String>::new(), "{args:?} created a file");
    }
    // A file in a directory that does not exist: `run` would not create it either.
    let out = run(orders_in(&dir).args(["--transport", "sqlite://nowhere/app.db", "queues"]));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("its directory `nowhere` does not exist either"), "{err}");
    // Once it exists, they read it.
    let out = run(orders_in(&dir).arg("migrate"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let queues = queues_json(&mut orders_in(&dir));
    assert_eq!(queues.len(), 2, "{queues:?}");
    let fifo = queues.iter().find(|q| q["name"] == "orders.fifo").expect("orders.fifo listed");
    assert_eq!(fifo["kind"], "fifo");
    assert_eq!(fifo["depth"], 0);
    assert_eq!(fifo["dead_letters"], 0);
    assert_eq!(fifo["dead_letter_queue"], "orders-dlq.fifo");
    let emails = queues.iter().find(|q| q["name"] == "emails").expect("emails listed");
    assert_eq!((emails["kind"].as_str(), emails["concurrency"].as_u64()), (Some("standard"), Some(8)));
}

#[test]
fn run_and_publish_on_a_new_file_without_migrate_say_so_and_create_nothing() {
    let dir = WorkDir::new();
    for args in [&["run"][..], &["publish", "emails", "--type", "emails.confirmation", "--data", "{}"]] {
        let out = run(orders_in(&dir).args(["--transport", "sqlite://app.db"]).args(args));
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("there is no database file `app.db`"), "{args:?}: {err}");
        assert!(err.contains("add `migrate=true` to it (`sqlite://app.db?migrate=true`)"), "{args:?}: {err}");
        assert_eq!(files_in(&dir), Vec::<String>::new(), "{args:?} created a file");
    }
    // Where `migrate=true` would not help, it is not offered.
    for (url, why) in [
        ("sqlite://no-such-dir/app.db", "its directory `no-such-dir` does not exist: create it, or name another file"),
        ("sqlite://app.db?mode=ro", "a read-only URL (`mode=ro`) does not create it"),
    ] {
        let out = run(orders_in(&dir).args(["--transport", url, "run"]));
        assert_eq!(out.status.code(), Some(1), "{url}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why) && !err.contains("migrate=true"), "{url}: {err}");
        assert_eq!(files_in(&dir), Vec::<String>::new(), "{url} created something");
    }
    // `migrate`, the other fix, creates the file and its tables.
    let out = run(orders_in(&dir).args(["--transport", "sqlite://app.db", "migrate"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(orders_in(&dir).args(["--transport", "sqlite://app.db", "validate"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn json_output_of_validate_health_and_publish() {
    let dir = WorkDir::new();
    assert!(run(orders_in(&dir).arg("migrate")).status.success());
    let json = |out: &Output| -> serde_json::Value {
        serde_json::from_str(stdout(out).trim())
            .unwrap_or_else(|e| panic!("not one JSON object ({e}): {}", stdout(out)))
    };
    let out = run(orders_in(&dir).args(["validate", "--json"]));
    assert!(out.status.success());
    let v = json(&out);
    assert_eq!((v["status"].as_str(), v["queues"].as_u64(), v["handlers"].as_u64()), (Some("ok"), Some(2), Some(2)));
    assert_eq!(v["transport"], "sqlite");
    let out = run(orders_in(&dir).args(["health", "--json"]));
    assert!(out.status.success());
    let v = json(&out);
    assert_eq!((v["status"].as_str(), v["queues"].as_u64()), (Some("healthy"), Some(2)));
    assert_eq!(v["failing"], serde_json::json!([]));
    let out = run(orders_in(&dir).args([
        "publish",
        "orders.fifo",
        "--json",
        "--type",
        "orders.placed",
        "--data",
        r#"{"order_id":"J1","customer_id":"jo"}"#,
    ]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json(&out);
    assert_eq!(
        (v["queue"].as_str(), v["type"].as_str(), v["version"].as_u64()),
        (Some("orders.fifo"), Some("orders.placed"), Some(2))
    );
    let id = v["message_id"].as_str().expect("a message id").to_owned();
    // The published message is the one `show` finds.
    let out = run(orders_in(&dir).args(["show", "orders.fifo", &id, "--json"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(json(&out)["body"]["data"]["order_id"], "J1");
    // Failures are JSON too, with the exit status of the text form.
    let out = run(orders_in(&dir).args(["--transport", "postgres://postgres@127.0.0.1:1/none", "validate", "--json"]));
    assert_eq!(out.status.code(), Some(1));
    let v = json(&out);
    assert_eq!(v["status"], "invalid");
    assert!(v["problems"][0].as_str().is_some_and(|p| p.contains("refused")), "{v}");
    let out = run(orders_in(&dir).args(["--transport", "postgres://postgres@127.0.0.1:1/none", "health", "--json"]));
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn run_with_http_on_a_busy_port_fails_before_consuming() {
    let dir = WorkDir::new();
    assert!(run(orders_in(&dir).arg("migrate")).status.success());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = run(orders_in(&dir).args(["run", "--http", &addr]));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
    // Nothing was published by the setup hook, nothing received.
    let text = stdout(&out);
    assert!(!text.contains("published") && !text.contains("handled"), "{text}");
    let queues = queues_json(&mut orders_in(&dir));
    assert!(queues.iter().all(|q| q["depth"] == 0), "{queues:?}");
}

/// The shutdown example on `db`, with `jobs` slow jobs published at start.
fn slow_jobs(db: &str, jobs: u32, ms: u64) -> Command {
    let mut cmd = example("shutdown");
    cmd.env("SLOW_JOBS", jobs.to_string()).env("SLOW_MS", ms.to_string()).args(["--transport", db]);
    cmd
}

#[cfg(unix)]
#[test]
fn a_second_signal_stops_at_once_releases_the_messages_and_exits_130() {
    use std::io::BufRead;
    let dir = WorkDir::new();
    let db = format!("sqlite://{}/jobs.db?migrate=true", dir.0.display());
    let mut child = slow_jobs(&db, 3, 60_000).arg("run").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let (lines, seen) = std::sync::mpsc::channel();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    // Two handlers running (concurrency 2), each for a minute.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut started = 0;
    while started < 2 {
        match seen.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.starts_with("started") => started += 1,
            Ok(_) => {}
            Err(_) => {
                let _ = child.kill();
                panic!("two jobs did not start within 30 s");
            }
        }
    }
    let signal = |child: &std::process::Child| {
        assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    };
    // The first signal waits for the handlers (the grace period is 30 s)...
    signal(&child);
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "the first signal waits for running handlers");
    // ...the second stops them at once.
    let second = Instant::now();
    signal(&child);
    let status = fixtures::wait_for(&mut child, Duration::from_secs(10), "the shutdown example after a second SIGINT");
    let took = second.elapsed();
    let errors = errors.join().unwrap();
    assert_eq!(status.code(), Some(130), "{errors}");
    assert!(took < Duration::from_millis(2500), "exited {took:?} after the second signal");
    assert!(errors.contains("stopped at once (second signal): 2 handler(s) stopped"), "{errors}");
    assert!(errors.contains("left to come back"), "{errors}");
    // Nothing is lost, and nothing waits out the two-minute visibility: a
    // new run handles all three at once.
    let drained = Instant::now();
    let out = run(slow_jobs(&db, 0, 10).args(["run", "--drain"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = stdout(&out);
    for n in 0..3 {
        assert!(text.contains(&format!("finished {n}")), "job {n} not handled: {text}");
    }
    assert!(drained.elapsed() < Duration::from_secs(30), "the released jobs waited for their visibility");
}

/// A plain HTTP/1.1 POST of `body`: (status, body).
fn http_post(addr: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default())
}

#[cfg(unix)]
#[test]
fn the_embedded_example_publishes_from_web_requests_and_consumes_in_the_same_process() {
    use std::io::BufRead;
    let dir = WorkDir::new();
    let mut child = example("embedded")
        .env("EMBEDDED_ADDR", "127.0.0.1:0")
        .env("MESSAGING_URL", format!("sqlite://{}/embedded.db?migrate=true", dir.0.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (lines, seen) = std::sync::mpsc::channel();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    let reader = std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let wait_for_line = |wanted: &str| -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match seen.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) if line.contains(wanted) => return line,
                Ok(_) => {}
                Err(_) => panic!("no line with `{wanted}` within 30 s"),
            }
        }
    };
    let addr = wait_for_line("listening on ").trim_start_matches("listening on ").to_owned();
    let (status, body) = http_post(&addr, "/orders", r#"{"sku":"SKU-1","qty":2}"#);
    assert_eq!(status, 202, "{body}");
    wait_for_line("took 2 x SKU-1");
    let (status, body) = http_post(&addr, "/orders", "not json");
    assert_eq!(status, 400, "{body}");
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    wait_for_line("stopped: ");
    let status = fixtures::wait_for(&mut child, Duration::from_secs(10), "the embedded example after SIGTERM");
    assert!(status.success(), "{status:?}");
    reader.join().unwrap();
}

#[test]
fn the_outbox_from_the_command_line_lists_retries_and_needs_no_broker() {
    let dir = WorkDir::new();
    let outbox = format!("sqlite://{}/outbox.db", dir.0.display());
    // migrate creates the outbox's table with the transport's.
    let out = run(orders_in(&dir).args(["--outbox", &outbox, "migrate"]));
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("the outbox on sqlite"), "{}", stdout(&out));
    // No outbox configured: a sentence naming the fix.
    let out = run(orders_in(&dir).args(["outbox"]));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no outbox is configured"), "{out:?}");
    let rows = "INSERT INTO messaging_outbox (queue, message_id, fifo, payload, created_at, next_at, status, error, attempts) \
        VALUES ('orders.fifo', 'refused-1', 1, x'7b7d', 0, 0, 'failed', 'too large for the queue', 1), \
               ('emails', 'waiting-1', 0, x'7b7d', 0, 0, 'pending', NULL, 0)";
    fixtures::runtime().block_on(async {
        let pool = messaging::sqlx::SqlitePool::connect(&outbox).await.unwrap();
        messaging::sqlx::query(rows).execute(&pool).await.unwrap();
    });
    // The transport names a broker that is not there: the outbox alone is read.
    let broker_down = "sqs://us-east-1?endpoint=http://127.0.0.1:9";
    let out = run(orders_in(&dir).args(["--transport", broker_down, "--outbox", &outbox, "outbox", "--json"]));
    assert!(out.status.success(), "{out:?}");
    let value: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(value["database"], "sqlite");
    assert_eq!(value["failed"][0]["message_id"], "refused-1");
    assert_eq!(value["failed"][0]["error"], "too large for the queue");
    let emails = value["queues"].as_array().unwrap().iter().find(|q| q["queue"] == "emails").unwrap().clone();
    assert_eq!((emails["pending"].as_u64(), emails["failed"].as_u64()), (Some(1), Some(0)));
    assert!(value["problem"].as_str().unwrap_or("").contains("`emails`"), "{value}");
    let out = run(orders_in(&dir).args(["--transport", broker_down, "--outbox", &outbox, "outbox"]));
    let text = stdout(&out);
    assert!(text.contains("1 pending, 1 failed") && text.contains("refused-1 after 1 attempt(s): too large"), "{text}");
    let out = run(orders_in(&dir).args(["--outbox", &outbox, "outbox", "retry", "--queue", "orders.fifo", "--json"]));
    assert_eq!(stdout(&out).trim(), r#"{"retried":1}"#, "{out:?}");
    // health fails on a row older than the outbox's max age (no relay ran).
    let out = run(orders_in(&dir).args(["--outbox", &outbox, "health", "--json"]));
    assert!(!out.status.success());
    let value: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(value["status"], "unhealthy");
    assert!(value["outbox"].as_str().unwrap_or("").contains("older than 300 s"), "{value}");
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap()
}

#[cfg(all(unix, feature = "console"))]
#[test]
fn the_console_command_serves_without_consuming_and_queues_pause_for_every_process() {
    let dir = WorkDir::new();
    let console = || {
        let mut cmd = example("console");
        cmd.current_dir(&dir.0).env_remove("MESSAGING_ADMIN_TOKEN");
        cmd
    };
    let data = r#"{"order":"X1","customer":"ada","cents":5}"#;
    let out = run(console().args(["publish", "shop-payments.fifo", "--type", "shop.payment", "--data", data]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Paused in the database, for every process; `queues` says so.
    let out = run(console().args(["queues", "pause", "shop-payments.fifo"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout(&out).contains("paused `shop-payments.fifo`"), "{}", stdout(&out));
    let out = run(console().args(["queues", "--json"]));
    let line = stdout(&out).lines().find(|l| l.contains("\"shop-payments.fifo\"")).map(str::to_owned);
    let line: serde_json::Value = serde_json::from_str(&line.expect("the queue's line")).unwrap();
    assert_eq!(line["paused"], true);
    let out = run(console().args(["queues"]));
    assert!(stdout(&out).contains("shop-payments.fifo (paused)"), "{}", stdout(&out));

    // The console alone: serves the queues and consumes nothing.
    let port = free_port();
    let mut child = console()
        .args(["console", "--http", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "the console did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, body) = fixtures::http_get(&addr, "/api/v1/queues/shop-payments.fifo");
    assert_eq!(status, 200, "{body}");
    let queue: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((queue["paused"].clone(), queue["counts"]["pending"].clone()), (true.into(), 1.into()));
    let (status, page) = fixtures::http_get(&addr, "/");
    assert!(status == 200 && page.contains("shop-payments.fifo"), "{status}: {page}");
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let status = fixtures::wait_for(&mut child, Duration::from_secs(10), "the console after SIGTERM");
    assert!(status.success(), "{status:?}");

    // Beyond loopback it needs a token.
    let out = run(console().args(["console", "--http", &format!("0.0.0.0:{}", free_port())]));
    assert!(!out.status.success());
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(error.contains("beyond loopback") && error.contains("MESSAGING_ADMIN_TOKEN"), "{error}");

    let out = run(console().args(["queues", "resume", "shop-payments.fifo"]));
    assert!(stdout(&out).contains("resumed `shop-payments.fifo`"), "{}", stdout(&out));
    // memory:// keeps no flag that other processes read: said so.
    let out = run(console().args(["--transport", "memory://", "queues", "pause", "shop-payments.fifo"]));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("keeps no pause flag"));
}

/// The lines of `schedules --json`, by schedule name.
fn schedules_json(cmd: &mut Command) -> std::collections::BTreeMap<String, serde_json::Value> {
    let out = run(cmd.args(["schedules", "--json"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| (v["name"].as_str().unwrap().to_owned(), v))
        .collect()
}

#[test]
fn the_schedules_command_lists_pauses_and_resumes_for_every_process() {
    use std::io::BufRead;
    let dir = WorkDir::new();
    let schedules = || {
        let mut cmd = example("schedules");
        cmd.current_dir(&dir.0);
        cmd
    };
    // Before any process ran: no database, and the command says so.
    let out = run(schedules().arg("schedules"));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("there is no database file"));

    let mut child = schedules().arg("run").stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let (lines, seen) = std::sync::mpsc::channel();
    let stdout_of_run = std::io::BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in stdout_of_run.lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let heartbeat = |within: Duration| loop {
        match seen.recv_timeout(within) {
            Ok(line) if line.starts_with("heartbeat of") => return Some(line),
            Ok(_) => {}
            Err(_) => return None,
        }
    };
    let first = heartbeat(Duration::from_secs(20));
    assert!(first.is_some(), "a heartbeat within 20 s (one every 5 s)");

    let listed = schedules_json(&mut schedules());
    let beat = &listed["heartbeat"];
    assert_eq!(beat["queue"], "reports");
    assert_eq!(beat["every_ms"], 5_000);
    assert_eq!(beat["paused"], false);
    assert_eq!(beat["ledger"], "sqlite");
    assert!(beat["last_published_ms"].as_i64().is_some(), "{beat}");
    let next: Vec<i64> = beat["next_ms"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    assert_eq!(next.len(), 3);
    assert!(next.windows(2).all(|w| w[1] - w[0] == 5_000) && next[0] % 5_000 == 0, "{next:?}");
    let nightly = &listed["schedules::nightly_report"];
    assert_eq!((nightly["cron"].as_str(), nightly["tz"].as_str()), (Some("30 2 * * *"), Some("Europe/Oslo")));
    assert_eq!(nightly["catch_up"], "last");
    let nights: Vec<&str> = nightly["next"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(nights.iter().all(|n| n.contains("T02:30:00+0") || n.contains("T03:00:00+02")), "{nights:?}");
    let text = stdout(&run(schedules().arg("schedules")));
    assert!(
        text.contains("heartbeat\n  queue           reports\n  when            every 5s, catch_up = skip"),
        "{text}"
    );
    assert!(text.contains("ledger: sqlite (every process reads it"), "{text}");

    // A pause from another process reaches the running one.
    let out = run(schedules().args(["schedules", "pause", "heartbeat"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout(&out).contains("paused schedule `heartbeat`"));
    assert_eq!(schedules_json(&mut schedules())["heartbeat"]["paused"], true);
    while seen.try_recv().is_ok() {} // what it printed before the pause
    assert_eq!(heartbeat(Duration::from_millis(6_500)), None, "no heartbeat while paused");
    let out = run(schedules().args(["schedules", "resume", "heartbeat"]));
    assert!(out.status.success());
    assert!(heartbeat(Duration::from_secs(10)).is_some(), "heartbeats again once resumed");

    let out = run(schedules().args(["schedules", "pause", "heartbeats"]));
    assert!(!out.status.success());
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(
        error.contains("`heartbeats` is not a schedule; declared: heartbeat, schedules::nightly_report"),
        "{error}"
    );
    let _ = child.kill();
    let _ = child.wait();
}
