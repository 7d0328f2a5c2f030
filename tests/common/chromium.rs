//! Headless Chromium for the tests that check a page as a browser renders it.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "shared fixtures: each test binary uses part of them; a test fails loudly on what it asserts"
)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Runs headless Chromium on `target` (a `file://` or `http://127.0.0.1` URL) and returns the
/// DOM it rendered. Bounded: Chromium is killed after 90 s and the test fails.
pub fn dump_dom(target: &str, profile: &Path) -> String {
    run(target, profile, &["--dump-dom".to_owned()])
}

/// Renders `target` at `width` × 1000 CSS pixels and writes a PNG screenshot to `png`.
pub fn screenshot(target: &str, profile: &Path, width: u32, png: &Path) {
    screenshot_sized(target, profile, (width, 1000), png);
}

/// [`screenshot`] in a window of `(width, height)` CSS pixels (what a person sees above the
/// fold).
pub fn screenshot_sized(target: &str, profile: &Path, (width, height): (u32, u32), png: &Path) {
    run(
        target,
        profile,
        &[
            format!("--window-size={width},{height}"),
            "--hide-scrollbars".to_owned(),
            format!("--screenshot={}", png.display()),
        ],
    );
    assert!(png.exists(), "chromium wrote no screenshot of {target}");
}

/// How `html` (a self-contained page: inline CSS, no external assets) lays out at `width` CSS
/// pixels, as Chromium measures it: the page is written to `dir` with a script appended that
/// records, in the DOM, the document's scroll width and every table that sticks out of the
/// viewport without a scrolling box around it. Returns `(scroll width, client width,
/// overflowing tables)`.
pub fn layout(html: &str, dir: &Path, width: u32) -> (u32, u32, Vec<String>) {
    let probe = r#"<script>
addEventListener('load', () => {
  const view = document.documentElement.clientWidth;
  const bad = [];
  for (const table of document.querySelectorAll('table')) {
    const right = table.getBoundingClientRect().right;
    if (right <= view + 1) continue;
    let box = table.parentElement, held = false;
    while (box) {
      const style = getComputedStyle(box);
      if ((style.overflowX === 'auto' || style.overflowX === 'scroll') && box.getBoundingClientRect().right <= view + 1) { held = true; break; }
      box = box.parentElement;
    }
    if (!held) bad.push((table.className || 'table') + '@' + Math.round(right));
  }
  const out = document.createElement('pre');
  out.id = 'layout-probe';
  out.textContent = document.documentElement.scrollWidth + ' ' + view + ' ' + bad.join(',');
  document.body.appendChild(out);
});
</script>"#;
    let page = dir.join(format!("layout-{width}.html"));
    std::fs::write(&page, html.replace("</body>", &format!("{probe}</body>"))).unwrap();
    let dom = run(
        &format!("file://{}", page.display()),
        &dir.join(format!("profile-{width}")),
        &[
            format!("--window-size={width},1000"),
            "--dump-dom".to_owned(),
        ],
    );
    let start = dom
        .find("id=\"layout-probe\">")
        .expect("the layout probe ran")
        + 19;
    let text = &dom[start..start + dom[start..].find('<').unwrap()];
    let mut parts = text.splitn(3, ' ');
    let scroll: u32 = parts.next().unwrap().parse().unwrap();
    let client: u32 = parts.next().unwrap().parse().unwrap();
    let bad = parts
        .next()
        .unwrap_or("")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    (scroll, client, bad)
}

/// [`dump_dom`] with extra Chromium flags (e.g. `--virtual-time-budget=5000`, to let a page's
/// script navigate before the DOM is dumped). The same `profile` keeps cookies between runs.
pub fn dump_dom_with(target: &str, profile: &Path, extra: &[&str]) -> String {
    let mut flags: Vec<String> = extra.iter().map(|f| (*f).to_owned()).collect();
    flags.push("--dump-dom".to_owned());
    run(target, profile, &flags)
}

fn run(target: &str, profile: &Path, extra: &[String]) -> String {
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
    if super::wait::child_exit(&mut child, Duration::from_secs(90)).is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("chromium did not finish rendering {target} within 90 s");
    }
    reader.join().unwrap().unwrap()
}
