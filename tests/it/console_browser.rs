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

/// The text of the element `css` picks, once `wanted` holds for it: a
/// click that navigates returns before the next page may have replaced the
/// last one, so what is read is polled (and a stale element read again)
/// for at most 10 s.
async fn until_text(client: &Client, css: &str, wanted: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = None;
    loop {
        if let Ok(element) = client.find(Locator::Css(css)).await {
            if let Ok(text) = element.text().await {
                if wanted(&text) {
                    return text;
                }
                last = Some(text);
            }
        }
        assert!(Instant::now() < deadline, "`{css}` never read as wanted; last read: {last:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `css` picks `n` elements (see [`until_text`]).
async fn until_count(client: &Client, css: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = client.find_all(Locator::Css(css)).await.map(|all| all.len()).ok();
        if found == Some(n) {
            return;
        }
        assert!(Instant::now() < deadline, "`{css}` picks {found:?} elements, not {n}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Clicks the element `css` picks, once it is there.
async fn click(client: &Client, locator: Locator<'_>) {
    let element = client.wait().at_most(Duration::from_secs(10)).for_element(locator).await.expect("the element");
    element.click().await.expect("click");
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
    let overview = until_text(&client, "#queues", |t| t.contains("console-jobs")).await;
    assert!(overview.contains("console-groups.fifo"), "{overview}");
    shoot(&client, "overview.png").await;

    // The queue's dead letters.
    click(&client, Locator::LinkText("console-jobs")).await;
    click(&client, Locator::Id("tab-dead")).await;
    until_text(&client, "nav.tabs a.current", |t| t.starts_with("dead")).await;
    until_count(&client, "#messages tbody tr", 3).await;
    until_text(&client, "#messages", |t| t.contains("is poison")).await;
    shoot(&client, "dead-letters.png").await;

    // One of them, with its error and body.
    click(&client, Locator::Css("#messages tbody td.id a")).await;
    let fields = until_text(&client, "#fields", |t| t.contains("dead_letter")).await;
    assert!(fields.contains("console.job"), "{fields}");
    until_text(&client, "#body", |t| t.contains("\"note\": \"bad\"")).await;
    shoot(&client, "message.png").await;

    // Fixed: redrive it, and see it leave the dead letters and run.
    h.shop.fixed.store(true, Ordering::SeqCst);
    click(&client, Locator::Id("redrive")).await;
    until_text(&client, "#notice", |t| t == "redrove 1 message(s)").await;
    until_text(&client, "#tab-dead b", |t| t == "2").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.shop.handled.load(Ordering::SeqCst) < 1 {
        assert!(Instant::now() < deadline, "the redriven job did not run");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The other two at once: tick them, redrive the selection.
    until_count(&client, "#messages tbody input[type=checkbox]", 2).await;
    for checkbox in client.find_all(Locator::Css("#messages tbody input[type=checkbox]")).await.expect("boxes") {
        checkbox.click().await.expect("tick");
    }
    click(&client, Locator::Id("redrive-selected")).await;
    until_text(&client, "#notice", |t| t == "redrove 2 message(s)").await;
    until_text(&client, "#tab-dead b", |t| t == "0").await;
    until_text(&client, "#empty", |t| t.contains("No dead messages")).await;

    // The sleeping ones, on a phone's screen.
    client.set_window_size(390, 844).await.expect("a phone's size");
    click(&client, Locator::Id("tab-sleeping")).await;
    until_text(&client, "nav.tabs a.current", |t| t.starts_with("sleeping")).await;
    until_count(&client, "#messages tbody tr", 2).await;
    shoot(&client, "phone-sleeping.png").await;
    client.goto(&format!("{base}/")).await.expect("the overview");
    until_text(&client, "#queues", |t| t.contains("console-jobs")).await;
    shoot(&client, "phone-overview.png").await;

    client.close().await.expect("close the browser");
    h.stop().await;
}
