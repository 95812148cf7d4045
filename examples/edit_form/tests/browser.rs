//! Two people edit the same item in two real browsers (headless Chromium, driven
//! over WebDriver by chromedriver): the second save shows the conflict page with
//! both sets of values, re-applying it succeeds, and nothing is lost.
//!
//! Needs `chromium` and `chromedriver` (Debian: `apt-get install chromium
//! chromium-driver`; `scripts/test.sh` installs them); `CHROMIUM` and
//! `CHROMEDRIVER` override the paths. `UPDATE_DOCS=1` saves the conflict page's
//! screenshot as `docs/edit_form_conflict.png`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use diesel::prelude::*;
use edit_form::schema::items;
use edit_form::{setup, Item, Pool};
use serde_json::{json, Value};

/// The element key of the WebDriver protocol.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn request(method: &str, url: &str, body: Option<Value>) -> Value {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let response = match (method, body) {
        ("POST", body) => agent
            .post(url)
            .header("Content-Type", "application/json")
            .send(body.unwrap_or_else(|| json!({})).to_string()),
        ("DELETE", _) => agent.delete(url).call(),
        _ => agent.get(url).call(),
    };
    let mut response = response.unwrap_or_else(|err| panic!("{method} {url}: {err}"));
    let status = response.status();
    let text = response
        .body_mut()
        .with_config()
        .limit(64 * 1024 * 1024)
        .read_to_string()
        .unwrap();
    assert!(status.is_success(), "{method} {url}: {status} {text}");
    serde_json::from_str::<Value>(&text).unwrap()["value"].clone()
}

/// A chromedriver process on a port of its own, stopped on drop.
struct Driver {
    process: Child,
    url: String,
}

impl Driver {
    fn start() -> Driver {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let binary = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".to_owned());
        let process = Command::new(&binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| {
                panic!("cannot start {binary} (apt-get install chromium-driver): {err}")
            });
        let driver = Driver {
            process,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .build()
                .into();
            if agent.get(format!("{}/status", driver.url)).call().is_ok() {
                return driver;
            }
            assert!(Instant::now() < deadline, "chromedriver did not come up");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// One browser (a WebDriver session: a Chromium of its own, with its own
/// profile, so two of them share no cookies or cache).
struct Browser<'d> {
    session: String,
    driver: &'d Driver,
}

impl<'d> Browser<'d> {
    fn open(driver: &'d Driver) -> Browser<'d> {
        let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
        let created = request(
            "POST",
            &format!("{}/session", driver.url),
            Some(json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": chromium,
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage", "--window-size=900,700"]
                }
            }}})),
        );
        Browser {
            session: created["sessionId"].as_str().unwrap().to_owned(),
            driver,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}/session/{}{path}", self.driver.url, self.session)
    }

    fn goto(&self, url: &str) {
        request("POST", &self.url("/url"), Some(json!({ "url": url })));
    }

    /// The elements matching `css` now.
    fn all(&self, css: &str) -> Vec<String> {
        let found = request(
            "POST",
            &self.url("/elements"),
            Some(json!({"using": "css selector", "value": css})),
        );
        found
            .as_array()
            .unwrap_or_else(|| panic!("find {css}: {found}"))
            .iter()
            .map(|e| e[ELEMENT].as_str().unwrap().to_owned())
            .collect()
    }

    /// The element matching `css`, waiting up to 10 s for it to appear.
    fn find(&self, css: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(found) = self.all(css).into_iter().next() {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "no {css} on the page:\n{}",
                self.source()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn replace_text(&self, css: &str, text: &str) {
        let element = self.find(css);
        request(
            "POST",
            &self.url(&format!("/element/{element}/clear")),
            None,
        );
        request(
            "POST",
            &self.url(&format!("/element/{element}/value")),
            Some(json!({ "text": text })),
        );
    }

    fn click(&self, css: &str) {
        let element = self.find(css);
        request(
            "POST",
            &self.url(&format!("/element/{element}/click")),
            None,
        );
    }

    fn text(&self, css: &str) -> String {
        let element = self.find(css);
        request("GET", &self.url(&format!("/element/{element}/text")), None)
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn source(&self) -> String {
        request("GET", &self.url("/source"), None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    fn screenshot(&self) -> Vec<u8> {
        let png = request("GET", &self.url("/screenshot"), None);
        base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap()
    }
}

impl Drop for Browser<'_> {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| request("DELETE", &self.url(""), None));
    }
}

/// The app on a port of its own, on a thread with its own runtime.
fn serve(pool: Pool) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, edit_form::app(pool)).await.unwrap();
        });
    });
    format!("http://{address}")
}

fn item(pool: &Pool) -> Item {
    items::table
        .find(1)
        .select(Item::as_select())
        .first(&mut pool.get().unwrap())
        .unwrap()
}

struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The app on a SQLite file of its own (removed at the end), served on a port of
/// its own.
struct App {
    pool: Pool,
    base: String,
    _file: TempFile,
}

impl App {
    /// `name` tells the test's file apart from the other tests'.
    fn start(name: &str) -> App {
        let file =
            TempFile(std::env::temp_dir().join(format!("{name}_{}.sqlite", std::process::id())));
        let _ = std::fs::remove_file(&file.0);
        let pool = setup(file.0.to_str().unwrap()).unwrap();
        let base = serve(pool.clone());
        App {
            pool,
            base,
            _file: file,
        }
    }
}

/// A client that hands back every answer as it comes: error statuses are not
/// errors, redirects are not followed.
fn form_client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .into()
}

/// Item 1's edit form as the page posts it, read when the item was "Blue mug"
/// with 10 in stock, saving `stock` over version `lock_version`.
fn post_form(
    agent: &ureq::Agent,
    base: &str,
    lock_version: i32,
    stock: i32,
) -> ureq::http::Response<ureq::Body> {
    agent
        .post(format!("{base}/items/1"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .send(format!(
            "name=Blue+mug&stock={stock}&orig_name=Blue+mug&orig_stock=10&lock_version={lock_version}"
        ))
        .unwrap()
}

#[test]
fn two_people_edit_one_item_and_nothing_is_lost() {
    let App { pool, base, .. } = &App::start("edit_form");
    let edit = format!("{base}/items/1/edit");

    let driver = Driver::start();
    let alice = Browser::open(&driver);
    let bob = Browser::open(&driver);
    // Both open the form at version 0: "Blue mug", stock 10.
    alice.goto(&edit);
    bob.goto(&edit);
    assert_eq!(alice.text("#version"), "0");
    assert_eq!(bob.text("#version"), "0");

    // Alice counts the shelf and saves first.
    alice.replace_text("#stock", "5");
    alice.click("#save");
    alice.find("#saved");
    let saved = item(pool);
    assert_eq!(
        (saved.name.as_str(), saved.stock, saved.lock_version),
        ("Blue mug", 5, 1)
    );

    // Bob renames the item on his stale form: refused, and shown the conflict.
    bob.replace_text("#name", "Blue mug, large");
    bob.click("#save");
    bob.find("#conflict");
    assert_eq!(bob.text("#row-name .mine"), "Blue mug, large");
    assert_eq!(bob.text("#row-name .current"), "Blue mug");
    assert_eq!(bob.text("#row-stock .mine"), "10");
    assert_eq!(
        bob.text("#row-stock .current"),
        "5",
        "Alice's stock is shown"
    );
    assert_eq!(bob.text("#row-name .merged"), "Blue mug, large");
    assert_eq!(
        bob.text("#row-stock .merged"),
        "5",
        "Bob's re-applied form keeps Alice's stock"
    );
    assert_eq!(item(pool), saved, "nothing of Bob's was written");
    let png = bob.screenshot();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    if std::env::var_os("UPDATE_DOCS").is_some() {
        let docs =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/edit_form_conflict.png");
        std::fs::write(docs, &png).unwrap();
    }

    // Bob re-applies his change on the current version.
    bob.click("#save");
    bob.find("#saved");
    let last = item(pool);
    assert_eq!(
        (last.name.as_str(), last.stock, last.lock_version),
        ("Blue mug, large", 5, 2),
        "both changes kept"
    );
    assert_eq!(bob.text("#version"), "2");
}

#[test]
fn a_stale_form_is_answered_with_409_and_writes_nothing() {
    let App { pool, base, .. } = &App::start("edit_form_409");
    let agent = form_client();
    let post = |version: i32, stock: i32| post_form(&agent, base, version, stock).status().as_u16();
    assert_eq!(post(0, 4), 303, "saved, then redirected to the form");
    assert_eq!(post(0, 3), 409, "the same version again is stale");
    let row = item(pool);
    assert_eq!((row.stock, row.lock_version), (4, 1));
}

/// A form whose hidden version was tampered with to `i32::MAX`: no write can
/// follow that version (`Error::VersionOverflow`), which is not the database
/// being busy. Answered as lockkit's `status_for_version_in` answers it for a
/// version sent in the body, `409`, with a page that says the form cannot be
/// saved, and names nothing of the database; nothing is written.
#[test]
fn a_version_at_its_maximum_is_a_409_not_a_busy_database() {
    let App { pool, base, .. } = &App::start("edit_form_overflow");
    let mut response = post_form(&form_client(), base, i32::MAX, 4);
    let status = response.status().as_u16();
    let page = response.body_mut().read_to_string().unwrap();
    assert_eq!(status, 409, "{page}");
    assert!(!page.contains("busy"), "{page}");
    // The page speaks in the client's terms: not the table, the key or the
    // number the error names for the log.
    assert!(
        !page.contains("items 1") && !page.contains("2147483647"),
        "{page}"
    );
    let row = item(pool);
    assert_eq!((row.stock, row.lock_version), (10, 0), "nothing written");
}
