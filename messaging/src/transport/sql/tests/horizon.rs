//! A transaction left open on the shared database is found and named
//! (`postgres::horizon`), in a database of its own so that no other test's
//! transaction is older.

use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};

use crate::transport::sql::postgres::horizon::{oldest, Holder};

/// A session on `url` named `application`, its pid.
async fn session(url: &str, application: &str) -> (PgConnection, i32) {
    let mut conn = PgConnection::connect(url).await.unwrap();
    sqlx::query(&format!("SET application_name = '{application}'")).execute(&mut conn).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut conn).await.unwrap();
    (conn, pid)
}

async fn run(conn: &mut PgConnection, sql: &str) {
    sqlx::query(sql).execute(conn).await.unwrap();
}

#[test]
fn postgres_a_transaction_holding_back_cleanup_is_named_with_what_to_do() {
    let db = super::Database::new("msgtest_horizon");
    let url = db.url.clone();
    super::runtime().block_on(async {
        let pool = PgPool::connect(&url).await.unwrap();
        // A repeatable-read snapshot, left idle; then a read-committed
        // session that wrote (a transaction id of its own); and one that only
        // read, which holds nothing back.
        let (mut report, report_pid) = session(&url, "nightly-report").await;
        run(&mut report, "BEGIN ISOLATION LEVEL REPEATABLE READ").await;
        run(&mut report, "SELECT count(*) FROM pg_class").await;
        let (mut writer, writer_pid) = session(&url, "").await;
        run(&mut writer, "CREATE TABLE app_orders (id int)").await;
        run(&mut writer, "BEGIN").await;
        run(&mut writer, "INSERT INTO app_orders VALUES (1)").await;
        let (mut reader, _) = session(&url, "reader").await;
        run(&mut reader, "BEGIN").await;
        run(&mut reader, "SELECT 1").await;
        tokio::time::sleep(Duration::from_millis(1_200)).await;

        assert_eq!(oldest(&pool, Duration::from_secs(60)).await.unwrap(), None, "none open a minute yet");
        let held = Duration::from_secs(1);
        let found = oldest(&pool, held).await.unwrap().expect("the report's snapshot");
        let Holder { pid, open_ms, state, application, client, .. } = found.clone();
        assert_eq!((pid, state.as_str(), application.as_str()), (report_pid, "idle in transaction", "nightly-report"));
        assert!(open_ms >= 1_000, "{open_ms}");
        let warning = found.warning();
        assert!(!warning.contains("pg_class"), "the session's statement is not logged: {warning}");
        for part in [
            &format!("session {report_pid} `nightly-report` ({client}, idle in transaction) has been open for 0 min"),
            "every lease walks past them",
            &format!("SELECT pg_terminate_backend({report_pid})"),
            "idle_in_transaction_session_timeout",
        ] {
            assert!(warning.contains(part), "`{part}` in: {warning}");
        }

        let running = Holder { state: "active".to_owned(), ..found.clone() };
        assert!(running.warning().ends_with("bound such sessions with `statement_timeout`"), "{}", running.warning());

        run(&mut report, "COMMIT").await;
        let found = oldest(&pool, held).await.unwrap().expect("the writer's transaction");
        assert_eq!(found.pid, writer_pid);
        run(&mut writer, "COMMIT").await;
        assert_eq!(oldest(&pool, held).await.unwrap(), None, "a session that only read holds nothing back");

        drop((report, writer, reader));
        pool.close().await;
    });
}
