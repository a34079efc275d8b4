//! The console in a real browser: headless Chromium driven over WebDriver
//! (Debian's `chromium` and `chromium-driver`, which ./scripts/test
//! installs) loads the console of a running app, opens a dead letter, clicks
//! redrive and sees it move. Screenshots go to `target/console-screenshots/`.
//! `MESSAGING_SKIP_BROWSER=1` skips it (saying so); without a browser it fails.
#![cfg(feature = "console")]

use crate::fixtures;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};

use super::console::{ConsoleHarness, Job};

/// The WebDriver server, stopped on drop.
struct Driver {
    child: std::process::Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_program(names: &[&str]) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file()))
}

fn start_driver() -> Driver {
    let driver = find_program(&["chromedriver"]).unwrap_or_else(|| {
        panic!(
            "chromedriver is not installed: apt-get install chromium chromium-driver (./scripts/test does it), \
             or set MESSAGING_SKIP_BROWSER=1 to skip the browser test"
        )
    });
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
    let child = std::process::Command::new(driver)
        .arg(format!("--port={port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not listen within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    Driver { child, url: format!("http://127.0.0.1:{port}") }
}

async fn browser(driver: &Driver) -> Client {
    let chromium = find_program(&["chromium", "chromium-browser", "google-chrome"])
        .unwrap_or_else(|| panic!("chromium is not installed: apt-get install chromium chromium-driver"));
    let options = serde_json::json!({
        "binary": chromium,
        "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"],
    });
    let mut capabilities = serde_json::Map::new();
    capabilities.insert("goog:chromeOptions".into(), options);
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector).capabilities(capabilities).connect(&driver.url).await.expect("a browser session")
}

fn screenshots() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("the screenshot directory");
    dir
}

async fn shoot(client: &Client, name: &str) {
    let png = client.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    std::fs::write(screenshots().join(name), png).expect("write the screenshot");
}

async fn text_of(client: &Client, css: &str) -> String {
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css(css))
        .await
        .expect(css)
        .text()
        .await
        .expect("text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_opens_a_dead_letter_and_redrives_it() {
    if std::env::var("MESSAGING_SKIP_BROWSER").as_deref() == Ok("1") {
        eprintln!("skipped: MESSAGING_SKIP_BROWSER=1 (the console's browser test)");
        return;
    }
    let driver = start_driver();
    let file = fixtures::SqliteFile::new();
    let h = ConsoleHarness::start(&format!("{}&migrate=true&poll=100ms", file.url)).await;
    for n in 0..3 {
        h.publisher.send::<super::console::ConsoleJobs, _>(&Job { n, note: "bad".into() }).await.expect("sent");
    }
    for n in 10..12 {
        let later = Job { n, note: "ok".into() };
        h.publisher.send::<super::console::ConsoleJobs, _>(&later).delay(Duration::from_secs(600)).await.expect("sent");
    }
    h.until_count("console-jobs", "dead", 3).await;
    let client = browser(&driver).await;
    let base = format!("http://{}", h.addr);

    // The overview lists the queues with their counts.
    client.goto(&format!("{base}/")).await.expect("open the console");
    let overview = text_of(&client, "#queues").await;
    assert!(overview.contains("console-jobs") && overview.contains("console-groups.fifo"), "{overview}");
    shoot(&client, "overview.png").await;

    // The queue's dead letters.
    client.find(Locator::LinkText("console-jobs")).await.expect("the queue's link").click().await.expect("click");
    client.find(Locator::Id("tab-dead")).await.expect("the dead tab").click().await.expect("click");
    let rows = client.find_all(Locator::Css("#messages tbody tr")).await.expect("rows");
    assert_eq!(rows.len(), 3, "three dead letters");
    assert!(text_of(&client, "#messages").await.contains("is poison"));
    shoot(&client, "dead-letters.png").await;

    // One of them, with its error and body.
    client.find(Locator::Css("#messages tbody td.id a")).await.expect("a message").click().await.expect("click");
    let fields = text_of(&client, "#fields").await;
    assert!(fields.contains("dead_letter") && fields.contains("console.job"), "{fields}");
    assert!(text_of(&client, "#body").await.contains("\"note\": \"bad\""));
    shoot(&client, "message.png").await;

    // Fixed: redrive it, and see it leave the dead letters and run.
    h.shop.fixed.store(true, Ordering::SeqCst);
    client.find(Locator::Id("redrive")).await.expect("the redrive button").click().await.expect("click");
    assert_eq!(text_of(&client, "#notice").await, "redrove 1 message(s)");
    assert_eq!(text_of(&client, "#tab-dead b").await, "2");
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.shop.handled.load(Ordering::SeqCst) < 1 {
        assert!(Instant::now() < deadline, "the redriven job did not run");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The other two at once: tick them, redrive the selection.
    for checkbox in client.find_all(Locator::Css("#messages tbody input[type=checkbox]")).await.expect("boxes") {
        checkbox.click().await.expect("tick");
    }
    client.find(Locator::Id("redrive-selected")).await.expect("the bulk button").click().await.expect("click");
    assert_eq!(text_of(&client, "#notice").await, "redrove 2 message(s)");
    assert_eq!(text_of(&client, "#tab-dead b").await, "0");
    assert!(text_of(&client, "#empty").await.contains("No dead messages"));

    // The sleeping ones, on a phone's screen.
    client.set_window_size(390, 844).await.expect("a phone's size");
    client.find(Locator::Id("tab-sleeping")).await.expect("the sleeping tab").click().await.expect("click");
    assert_eq!(client.find_all(Locator::Css("#messages tbody tr")).await.expect("rows").len(), 2);
    shoot(&client, "phone-sleeping.png").await;
    client.goto(&format!("{base}/")).await.expect("the overview");
    shoot(&client, "phone-overview.png").await;

    client.close().await.expect("close the browser");
    h.stop().await;
}
