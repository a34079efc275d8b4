//! `/ready` follows the receives: 503 naming the queue while its receives
//! fail (the database is gone), 200 again once they succeed, on SQLite and
//! PostgreSQL. The outage is the framework's table renamed away and back.

use std::time::Duration;

use messaging::prelude::*;

use crate::fixtures;

/// The queue whose receives are watched.
#[messaging::queue("ready-jobs")]
struct ReadyJobs;

/// A job nobody sends: the worker only needs to keep receiving.
#[messaging::message(name = "ready.job", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ReadyJob {
    /// Its number.
    n: u32,
}

#[messaging::handler(queue = ReadyJobs)]
async fn ready_job(_job: ReadyJob) {}

/// Waits until `/ready` on `addr` answers `status`; returns the body.
pub(crate) async fn until_ready_is(addr: &str, status: u16, what: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let addr = addr.to_owned();
        let (got, body) = tokio::task::spawn_blocking(move || fixtures::http_get(&addr, "/ready")).await.unwrap();
        if got == status {
            return body;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: /ready is still {got}: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts the queue's worker on `url` with the endpoints, takes the table
/// away with `outage(true)` and gives it back with `outage(false)`.
async fn ready_follows_the_receives(url: &str, outage: impl Fn(bool)) {
    let transport = messaging::transport::connect(url).await.expect("connect");
    let mut app = messaging::App::new(transport).await.expect("app");
    app.only_queues(&["ready-jobs"]);
    app.set_receive_wait(Duration::from_millis(100));
    let mut running = app.start().expect("start");
    let addr = running.serve_http("127.0.0.1:0".parse().unwrap()).await.expect("serve").to_string();
    until_ready_is(&addr, 200, "before the outage").await;
    outage(true);
    let body = until_ready_is(&addr, 503, "during the outage").await;
    let v: serde_json::Value = serde_json::from_str(&body).expect("a JSON body");
    assert_eq!(v["status"], "receives failing", "{v}");
    assert_eq!(v["failing"][0]["queue"], "ready-jobs", "{v}");
    assert!(v["failing"][0]["error"].as_str().is_some_and(|e| e.contains("messaging_messages")), "{v}");
    outage(false);
    until_ready_is(&addr, 200, "after the outage").await;
    running.stop().await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_is_503_while_sqlite_receives_fail() {
    let db = fixtures::SqliteFile::new();
    let url = format!("{}&migrate=true&poll=50ms", db.url);
    let path = db.path.clone();
    ready_follows_the_receives(&url, move |gone| {
        let (from, to) = if gone { ("messaging_messages", "gone") } else { ("gone", "messaging_messages") };
        let path = path.clone();
        // Its own runtime: called from a blocking context of the test.
        std::thread::spawn(move || {
            fixtures::runtime().block_on(async {
                use messaging::sqlx::Connection as _;
                let mut c = messaging::sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
                    .await
                    .expect("connect");
                messaging::sqlx::query(&format!("ALTER TABLE {from} RENAME TO {to}"))
                    .execute(&mut c)
                    .await
                    .expect("rename");
            })
        })
        .join()
        .unwrap();
    })
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_is_503_while_postgres_receives_fail() {
    let pg = fixtures::Postgres::new().await;
    let url = format!("{}&migrate=true&poll=50ms", pg.url);
    let schema = pg.schema.clone();
    ready_follows_the_receives(&url, move |gone| {
        let (from, to) = if gone { ("messaging_messages", "gone") } else { ("gone", "messaging_messages") };
        fixtures::psql(&format!("ALTER TABLE {schema}.{from} RENAME TO {to}"));
    })
    .await;
}
