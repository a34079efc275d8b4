//! The pool: its size comes from the URL (`max_connections=`), and when it
//! gets no connection in time the error says why: the database refuses
//! connections (and how), or it accepts them and the pool's are all in use.
//! PostgreSQL is reached through a proxy the test can cut, so that the
//! server itself keeps running for the other tests.

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::transport::sql::dialect::{Dialect, SqlStore};

/// A TCP proxy to the test server, on a port of its own; dropping it closes
/// the port and every connection through it.
struct Proxy {
    port: u16,
    /// Connections it took.
    accepted: Arc<AtomicUsize>,
    /// Told to stop forwarding on every open link.
    freeze: Arc<tokio::sync::Notify>,
    _tasks: JoinSet<()>,
}

impl Proxy {
    async fn start(server: (String, u16)) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        let freeze = Arc::new(tokio::sync::Notify::new());
        let frozen = freeze.clone();
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let mut links = JoinSet::new();
            while let Ok((mut client, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let server = server.clone();
                let frozen = frozen.clone();
                links.spawn(async move {
                    if let Ok(mut upstream) = TcpStream::connect(server).await {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                            // Forwards nothing more and closes nothing: both
                            // ends stay open, unanswered.
                            () = frozen.notified() => std::future::pending().await,
                        }
                    }
                });
            }
        });
        Proxy { port, accepted, freeze, _tasks: tasks }
    }

    /// Every link open now stops forwarding for good, without closing (a
    /// server gone from the network); links opened later forward.
    fn freeze_open_links(&self) {
        self.freeze.notify_waiters();
    }
}

/// A store whose pool of `size` reaches the test server through `proxy`,
/// waiting at most 1 s for a connection.
async fn store_through(proxy: &Proxy, size: u32) -> SqlStore<sqlx::Postgres> {
    let options = PgConnectOptions::from_str(&super::postgres_base()).unwrap().host("127.0.0.1").port(proxy.port);
    let pool = PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(1))
        .connect_with(options)
        .await
        .expect("connect through the proxy");
    // The store's background task (LISTEN, the clock) on a pool of its
    // own: its connections are not the ones the tests count.
    let state = sqlx::Postgres::adopt(&sqlx::PgPool::connect_lazy(&super::postgres_base()).unwrap());
    SqlStore::new(pool, state)
}

/// The test server's host and port.
fn server() -> (String, u16) {
    let options = PgConnectOptions::from_str(&super::postgres_base()).unwrap();
    (options.get_host().to_owned(), options.get_port())
}

#[test]
fn postgres_a_pool_timeout_says_the_database_refuses_connections() {
    super::runtime().block_on(async {
        let proxy = Proxy::start(server()).await;
        let store = store_through(&proxy, 2).await;
        store.query("counting", &["SELECT 1"], &[]).await.expect("a statement through the proxy");
        drop(proxy);
        // The pooled connection may be tried first and fail by itself; the
        // next statement waits for a new one.
        let mut errors = Vec::new();
        for _ in 0..3 {
            let e = store.query("counting", &["SELECT 1"], &[]).await.expect_err("the proxy is gone");
            errors.push(e.to_string());
            if errors.last().is_some_and(|e| e.contains("no connection within")) {
                break;
            }
        }
        let e = errors.last().unwrap();
        assert!(
            e.starts_with("postgresql: counting failed: no connection within 1s: a new connection fails:"),
            "{errors:?}"
        );
        assert!(e.contains("Connection refused"), "names the cause: {errors:?}");
    });
}

#[test]
fn postgres_a_pool_timeout_says_when_every_connection_is_in_use() {
    super::runtime().block_on(async {
        let proxy = Proxy::start(server()).await;
        let store = store_through(&proxy, 2).await;
        let held = (store.pool.acquire().await.unwrap(), store.pool.acquire().await.unwrap());
        let e = store.query("counting", &["SELECT 1"], &[]).await.expect_err("no connection is free").to_string();
        assert_eq!(
            e,
            "postgresql: counting failed: no connection within 1s: the database accepts connections, but all 2 of the \
             pool's were in use for that long (long statements, or locks they wait on; `max_connections=` in the URL \
             sets the pool's size)"
        );
        // Ten timeouts at once try one connection between them.
        let before = proxy.accepted.load(Ordering::SeqCst);
        let tries = (0..10).map(|_| store.query("counting", &["SELECT 1"], &[]));
        let errors = futures_util::future::join_all(tries).await;
        assert!(errors.iter().all(|e| e.as_ref().is_err_and(|e| e.to_string().contains("were in use"))), "{errors:?}");
        assert_eq!(proxy.accepted.load(Ordering::SeqCst) - before, 1, "one connection tried for ten timeouts");
        drop(held);
        store.query("counting", &["SELECT 1"], &[]).await.expect("a connection is free again");
    });
}

#[test]
fn postgres_a_pool_timeout_names_a_connection_limit_and_what_to_change() {
    super::psql(
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'msgtest_limited') THEN \
         CREATE ROLE msgtest_limited LOGIN CONNECTION LIMIT 1; END IF; END $$",
    );
    super::runtime().block_on(async {
        let options = PgConnectOptions::from_str(&super::postgres_base()).unwrap().username("msgtest_limited");
        let pool = PgPoolOptions::new()
            .max_connections(3)
            .acquire_timeout(Duration::from_secs(1))
            .connect_with(options)
            .await
            .expect("the role's one connection");
        let state = sqlx::Postgres::adopt(&sqlx::PgPool::connect_lazy(&super::postgres_base()).unwrap());
        let store = SqlStore::new(pool, state);
        let _held = store.pool.acquire().await.unwrap();
        let e = store.query("counting", &["SELECT 1"], &[]).await.expect_err("the role's limit is reached").to_string();
        assert!(e.contains("too many connections for role \"msgtest_limited\" (code 53300)"), "{e}");
        assert!(e.contains("lower `max_connections=` in the URL"), "{e}");
    });
}

/// The most connections `transport`'s pool opens.
fn size<D: Dialect>(transport: &crate::transport::sql::SqlTransport<D>) -> u32 {
    transport.store.pool.options().get_max_connections()
}

#[test]
fn the_url_sets_the_size_of_the_pool() {
    let postgres = super::Postgres::new();
    let sqlite = super::SqliteFile::new();
    super::runtime().block_on(async {
        let sized = format!("{}&max_connections=3", postgres.url);
        let pg = crate::transport::sql::connect::<sqlx::Postgres>(&sized).await.unwrap();
        assert_eq!(size(&pg), 3);
        let pg = crate::transport::sql::connect::<sqlx::Postgres>(&postgres.url).await.unwrap();
        assert_eq!(size(&pg), 10);
        let sized = format!("{}&max_connections=4", sqlite.url);
        let lite = crate::transport::sql::connect::<sqlx::Sqlite>(&sized).await.unwrap();
        assert_eq!(size(&lite), 4);
        let lite = crate::transport::sql::connect::<sqlx::Sqlite>(&sqlite.url).await.unwrap();
        assert_eq!(size(&lite), 8);
    });
}

/// A store on `db` whose pool has three connections, the two that do not
/// listen having run `set` (a `SET SESSION`): what the server or an
/// administrator would have given every connection.
async fn store_whose_connections_ran(db: &super::Postgres, set: &str) -> SqlStore<sqlx::Postgres> {
    let url = format!("{}&max_connections=3&migrate=true", db.url);
    let (store, _) = crate::transport::sql::open::<sqlx::Postgres>(&url).await.expect("connect");
    let mut open = vec![store.pool.acquire().await.unwrap(), store.pool.acquire().await.unwrap()];
    for conn in &mut open {
        sqlx::query(set).execute(&mut **conn).await.unwrap();
    }
    store
}

#[test]
fn postgres_connections_to_a_server_turned_read_only_are_replaced() {
    let db = super::Postgres::new();
    super::runtime().block_on(async {
        // Read-only, as on a primary that a failover made a standby (the
        // new primary is the same server here).
        let store = store_whose_connections_ran(&db, "SET SESSION default_transaction_read_only = on").await;
        let write = || store.exec("declaring", &["INSERT INTO messaging_queues VALUES ('jobs', false, 0)"], &[]);
        let e = write().await.expect_err("the connection is read-only").to_string();
        assert!(e.contains("(code 25006): the server is read-only"), "{e}");
        write().await.expect("a new connection, not read-only");
    });
}

/// A statement cancelled by a `statement_timeout` that the database or role
/// sets for an application sharing it says where such a limit comes from
/// and how the URL lifts it for the framework's connections.
#[test]
fn postgres_a_statement_timeout_names_where_it_comes_from_and_the_urls_option() {
    let db = super::Postgres::new();
    super::runtime().block_on(async {
        // The application's limit, as `ALTER DATABASE … SET` would give it.
        let store = store_whose_connections_ran(&db, "SET SESSION statement_timeout = '50ms'").await;
        let e = store.query("leasing", &["SELECT pg_sleep(1)"], &[]).await.expect_err("cancelled").to_string();
        assert!(e.contains("(code 57014): the server cancelled the statement"), "{e}");
        assert!(e.contains("`options=-c%20statement_timeout%3D60s`"), "{e}");
    });
}

/// After a read-only error (a failover), the LISTEN connection is made again
/// at once: on the old primary it would hear none of the new primary's
/// NOTIFYs, and idle receivers would wait for their poll.
#[test]
fn postgres_the_listen_connection_is_made_again_after_a_read_only_error() {
    let db = super::Postgres::new();
    let name = super::unique("listen");
    super::runtime().block_on(async {
        let url = format!("{}&max_connections=3&migrate=true&application_name={name}", db.url);
        let (store, _) = crate::transport::sql::open::<sqlx::Postgres>(&url).await.expect("connect");
        // The backend listening for this store, told apart by its application name.
        let listening = || async {
            let mut watcher = store.pool.acquire().await.unwrap();
            sqlx::query_scalar::<_, i32>(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%' \
                 AND state = 'idle'",
            )
            .bind(&name)
            .fetch_optional(&mut *watcher)
            .await
            .unwrap()
        };
        let mut before = None;
        for _ in 0..50 {
            before = listening().await;
            if before.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let before = before.expect("a LISTEN connection");
        let mut open = vec![store.pool.acquire().await.unwrap(), store.pool.acquire().await.unwrap()];
        for conn in &mut open {
            sqlx::query("SET SESSION default_transaction_read_only = on").execute(&mut **conn).await.unwrap();
        }
        drop(open);
        let write = || store.exec("declaring", &["INSERT INTO messaging_queues VALUES ('jobs', false, 0)"], &[]);
        write().await.expect_err("the connection is read-only");
        let mut after = Some(before);
        for _ in 0..50 {
            after = listening().await;
            if after.is_some_and(|pid| pid != before) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(after.is_some_and(|pid| pid != before), "still listening on {before} (now {after:?})");
    });
}

/// A server that closes every session idle for 1 s (`idle_session_timeout`,
/// as a DBA may set it on a database shared with an application; the URL
/// sets it here for this store's sessions alone). After each quiet spell
/// longer than that, the pool handed out the connections the server had
/// closed, and the first statements on them failed ("terminating connection
/// due to idle-session timeout"). Now the pool closes a connection idle for
/// most of the timeout itself, and every write finds a live one.
#[test]
fn postgres_writes_after_quiet_spells_longer_than_the_servers_idle_timeout_all_succeed() {
    use crate::transport::sql::machine::Enqueue;
    use crate::transport::sql::postgres::PostgresStore;
    const NOW: i64 = 1_800_000_000_000;
    let runtime = super::runtime();
    let db = super::Postgres::new();
    let url = format!("{}%20-c%20idle_session_timeout%3D1000", db.url);
    runtime.block_on(async {
        let store = PostgresStore::connect(&url).await.expect("connect");
        store.migrate().await.expect("migrate");
        store.declare("quiet", false, NOW).await.expect("declare");
        for spell in 0..3 {
            // Four at once: the pool holds four connections through the spell.
            let sends = (0..4).map(|n| {
                let id = format!("m-{spell}-{n}");
                let store = &store;
                async move { store.enqueue("quiet", NOW, vec![Enqueue::test(&id, None, &id)], false).await.remove(0) }
            });
            for (n, sent) in futures_util::future::join_all(sends).await.into_iter().enumerate() {
                if let Err(e) = sent {
                    panic!("after quiet spell {spell}, send {n} failed: {e}");
                }
            }
            tokio::time::sleep(Duration::from_millis(1_400)).await;
        }
        let leased = store.lease("quiet", NOW, 100, 30_000, false).await.expect("lease after the last spell");
        assert_eq!(leased.len(), 12);
    });
}

/// Ends the sessions of every connection named `name` (its application
/// name), as a server restart or an operator's `pg_terminate_backend` does,
/// and waits until they are gone.
async fn end_sessions_of(name: &str) {
    use sqlx::Connection;
    let mut admin = sqlx::PgConnection::connect(&super::postgres_base()).await.unwrap();
    let pids: Vec<i32> = sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
        .bind(name)
        .fetch_all(&mut admin)
        .await
        .unwrap();
    assert!(!pids.is_empty(), "no session of {name}");
    sqlx::query("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid")
        .bind(&pids)
        .execute(&mut admin)
        .await
        .unwrap();
    for _ in 0..250 {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)")
            .bind(&pids)
            .fetch_one(&mut admin)
            .await
            .unwrap();
        if left == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the sessions of {name} did not end");
}

/// Has the pool hold `n` idle connections that have each run a statement
/// (given back: the pool's checks of them on their way back are done).
async fn hold_idle(store: &SqlStore<sqlx::Postgres>, n: usize) {
    let mut open = Vec::new();
    for _ in 0..n {
        open.push(store.pool.acquire().await.unwrap());
    }
    for conn in &mut open {
        sqlx::query("SELECT 1").execute(&mut **conn).await.unwrap();
    }
    drop(open);
    for _ in 0..250 {
        if store.pool.num_idle() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the pool holds {} idle connections, not {n}", store.pool.num_idle());
}

/// After a restart, a failover or an operator's kill, the pool still holds
/// connections whose sessions the server ended, and the first statement on
/// each failed ("terminating connection due to administrator command",
/// 57P01): a claim that failed so counted as a failed attempt of its
/// message, a lease or a BEGIN as a failed receive. Now the statements that
/// may run twice (reads, claims, their extensions and releases, leases,
/// BEGINs, and plain sends, whose copies would share a message id) run once
/// more on a new connection, the first lost one
/// closes the others of its age, and a connection that waited a second is
/// pinged on its way out, so a publish after a quiet spell finds a live one.
#[test]
fn postgres_statements_after_the_server_ended_every_session_succeed() {
    use crate::claims::Claim;
    use crate::transport::sql::claims::SqlIdempotencyStore;
    use crate::transport::sql::machine::Enqueue;
    const NOW: i64 = 1_800_000_000_000;
    let db = super::Postgres::new();
    let name = super::unique("ended");
    super::runtime().block_on(async {
        let (setup, _) =
            crate::transport::sql::open::<sqlx::Postgres>(&format!("{}&migrate=true", db.url)).await.unwrap();
        drop(setup);
        // The store's pool as `connect` makes it, named; its background
        // task (LISTEN, the clock) on a pool of its own, whose reconnects
        // would otherwise take the dead connections out of this one.
        let options = PgConnectOptions::from_str(&db.url).unwrap().application_name(&name);
        let wait = <sqlx::Postgres as Dialect>::ANSWER_WITHIN;
        let pool = crate::transport::sql::postgres::pool_options(4, None, wait).connect_with(options).await.unwrap();
        let state = sqlx::Postgres::adopt(&sqlx::PgPool::connect_lazy(&db.url).unwrap());
        let store = SqlStore::<sqlx::Postgres>::new(pool, state);
        store.declare("jobs", false, NOW).await.expect("declare");
        store.declare("heads.fifo", true, NOW).await.expect("declare");
        let claims = SqlIdempotencyStore::on(&store);
        let send = |id: String| {
            let store = &store;
            async move { store.enqueue("jobs", NOW, vec![Enqueue::test(&id, None, &id)], false).await.remove(0) }
        };

        hold_idle(&store, 3).await;
        end_sessions_of(&name).await;
        store.query("counting", &["SELECT 1"], &[]).await.expect("a read after the sessions ended");

        hold_idle(&store, 3).await;
        end_sessions_of(&name).await;
        let claim = claims.claim_at("m-1", "test", "p-1", Duration::from_secs(30), std::time::SystemTime::now());
        assert_eq!(claim.await.expect("a claim after the sessions ended"), Claim::Claimed);

        hold_idle(&store, 3).await;
        end_sessions_of(&name).await;
        let extension = claims.extend_at("m-1", "test", "p-1", Duration::from_secs(60), std::time::SystemTime::now());
        extension.await.expect("a claim's extension after the sessions ended");

        hold_idle(&store, 3).await;
        end_sessions_of(&name).await;
        store.lease("jobs", NOW, 10, 30_000, false).await.expect("a lease after the sessions ended");

        hold_idle(&store, 3).await;
        end_sessions_of(&name).await;
        store
            .lease("heads.fifo", NOW, 10, 30_000, true)
            .await
            .expect("a FIFO lease (a BEGIN) after the sessions ended");

        // Sends run once more too.
        hold_idle(&store, 3).await;
        end_sessions_of(&name).await;
        let sends = futures_util::future::join_all((0..3).map(|n| send(format!("after-{n}")))).await;
        for (n, sent) in sends.into_iter().enumerate() {
            sent.unwrap_or_else(|e| panic!("send {n} after the sessions ended: {e}"));
        }

        // The first lost connection closes the others of its age: writes
        // that run once find new ones.
        let touch = || store.exec("touching", &["UPDATE messaging_queues SET created_at = created_at"], &[]);
        hold_idle(&store, 3).await;
        end_sessions_of(&name).await;
        store.query("counting", &["SELECT 1"], &[]).await.expect("a read after the sessions ended");
        let writes = futures_util::future::join_all((0..3).map(|_| touch())).await;
        for (n, written) in writes.into_iter().enumerate() {
            written.unwrap_or_else(|e| panic!("write {n} after the first lost connection: {e}"));
        }

        // A quiet spell: the connections that waited 1 s or more
        // (`failover::CHECK_AFTER`) are pinged first.
        hold_idle(&store, 3).await;
        end_sessions_of(&name).await;
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let writes = futures_util::future::join_all((0..3).map(|_| touch())).await;
        for (n, written) in writes.into_iter().enumerate() {
            written.unwrap_or_else(|e| panic!("write {n} after a quiet spell: {e}"));
        }
        assert_eq!(store.lease("jobs", NOW, 10, 30_000, false).await.expect("lease").len(), 3);
    });
}

/// A server gone from the network (a failover that moved its name to
/// another address, a partition) answers nothing and closes nothing. A
/// statement on a connection to it waited for good, and so did the pool's
/// ping of that connection when it came back, holding one of the pool's
/// places: the publish and the workers hung, and did not recover after the
/// failover either. Now every statement of the framework's own waits at
/// most its store's `answer_within`, the connections of that age are then
/// closed, not pinged, and those that may run twice run once more on a new
/// connection.
#[test]
fn postgres_statements_on_connections_that_no_longer_answer_give_up_and_go_on_new_ones() {
    use crate::transport::sql::machine::Enqueue;
    const NOW: i64 = 1_800_000_000_000;
    let db = super::Postgres::new();
    let test = async {
        let (setup, _) =
            crate::transport::sql::open::<sqlx::Postgres>(&format!("{}&migrate=true", db.url)).await.unwrap();
        drop(setup);
        let proxy = Proxy::start(server()).await;
        let options = PgConnectOptions::from_str(&db.url).unwrap().host("127.0.0.1").port(proxy.port);
        let wait = Some(Duration::from_millis(500));
        let pool = crate::transport::sql::postgres::pool_options(4, None, wait).connect_with(options).await.unwrap();
        let state = sqlx::Postgres::adopt(&sqlx::PgPool::connect_lazy(&db.url).unwrap());
        let mut store = SqlStore::<sqlx::Postgres>::new(pool, state);
        store.answer_within = wait;
        store.declare("jobs", false, NOW).await.expect("declare");
        store.declare("heads.fifo", true, NOW).await.expect("declare");
        let touch = || store.exec("touching", &["UPDATE messaging_queues SET created_at = created_at"], &[]);

        // Writes that run once give up, each after the wait. The stale mark
        // is the process's: another test's lost connection, in this test
        // binary, may have the pool replace the frozen connections before
        // the writes take them, and then a write succeeds; such a round is
        // tried again.
        let mut rounds = 0;
        loop {
            rounds += 1;
            hold_idle(&store, 4).await;
            proxy.freeze_open_links();
            let began = std::time::Instant::now();
            let written = futures_util::future::join_all((0..4).map(|_| touch())).await;
            assert!(began.elapsed() < Duration::from_secs(3), "gave up after {:?}", began.elapsed());
            if written.iter().any(Result::is_ok) && rounds < 5 {
                continue;
            }
            for written in written {
                let e = written.expect_err("no answer").to_string();
                assert!(e.contains("no answer from the server within 500ms"), "{e}");
            }
            break;
        }
        // The pool's four places are free again: the connections that did
        // not answer were closed, not pinged.
        for (n, written) in futures_util::future::join_all((0..4).map(|_| touch())).await.into_iter().enumerate() {
            written.unwrap_or_else(|e| panic!("write {n} after the frozen connections were given up: {e}"));
        }

        // Those that may run twice run once more, on a new connection.
        hold_idle(&store, 4).await;
        proxy.freeze_open_links();
        let began = std::time::Instant::now();
        let sent = store.enqueue("jobs", NOW, vec![Enqueue::test("m-1", None, "m-1")], false).await.remove(0);
        sent.expect("a send on a frozen connection, then on a new one");
        store.query("counting", &["SELECT 1"], &[]).await.expect("a read");
        store.lease("heads.fifo", NOW, 10, 30_000, true).await.expect("a FIFO lease (a BEGIN)");
        assert_eq!(store.lease("jobs", NOW, 10, 30_000, false).await.expect("a lease").len(), 1);
        assert!(began.elapsed() < Duration::from_secs(5), "took {:?}", began.elapsed());

        // Connections given back after the server went: the pool's check
        // of each on its way back gets no answer either, and gives up.
        // (Frozen before they are given back: one frozen between the
        // pool's check and sqlx's own ping right after it would hold its
        // place until TCP gives up, which through this proxy is never.)
        let mut open = Vec::new();
        for _ in 0..4 {
            open.push(store.pool.acquire().await.unwrap());
        }
        for conn in &mut open {
            sqlx::query("SELECT 1").execute(&mut **conn).await.unwrap();
        }
        proxy.freeze_open_links();
        drop(open);
        for read in futures_util::future::join_all((0..4).map(|_| store.query("counting", &["SELECT 1"], &[]))).await {
            read.expect("a read after connections were given back as the server went");
        }
        // Four at once: none of the pool's places is still taken.
        hold_idle(&store, 4).await;
    };
    super::runtime().block_on(async {
        tokio::time::timeout(Duration::from_secs(60), test).await.expect("the test waited for good");
    });
}
