//! Headless Chromium for the tests that check a page as a browser renders it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Runs headless Chromium on `target` (a `file://` or `http://127.0.0.1` URL) and returns the
/// DOM it rendered. Bounded: Chromium is killed after 90 s and the test fails.
pub fn dump_dom(target: &str, profile: &Path) -> String {
    dump_dom_with(target, profile, &[])
}

/// [`dump_dom`] with extra Chromium flags (e.g. `--virtual-time-budget=5000`, to let a page's
/// script navigate before the DOM is dumped). The same `profile` keeps cookies between runs.
pub fn dump_dom_with(target: &str, profile: &Path, extra: &[&str]) -> String {
    let chromium = ["chromium", "chromium-browser"]
        .into_iter()
        .find(|name| Command::new(name).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success()))
        .unwrap_or_else(|| panic!("headless Chromium is needed for this test: install Debian's `chromium` package (apt-get install chromium); scripts/test (the README's test command) installs it when missing"));
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg("--dump-dom")
        .arg(target)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut out).map(|_| out)
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish rendering {target} within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reader.join().unwrap().unwrap()
}
