#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]
//! The admin listener's browser login on loopback: with `admin.token` set, a browser with no
//! bearer header logs in at `/login`, reads the page and the matrix with its session cookie and
//! can start a sweep from the page's own form (CSRF field), while `POST /sweeps` and the
//! reference API still need the bearer token; logging out, expiry, failed logins counted and
//! slowed; the redirect to the login form in headless Chromium.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use tokentap::app::serve::ProxyServer;
use tokentap::sim::{Profile, SimOptions, SimServer};

const TOKEN: &str = "s3cret token+/= of the tests";

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tokentap-admin-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn form_escape(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

async fn proxy_with_token(upstream: &str, extra_admin: &str) -> ProxyServer {
    proxy_from_config(&format!(
        "[upstream]\nurl = \"{upstream}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\n[store]\ndata_dir = \"\"\n[admin]\ntoken = \"{TOKEN}\"\n{extra_admin}\n"
    ))
    .await
    .0
}

/// A request to the admin listener with optional cookie, bearer and form body.
async fn admin(
    server: &ProxyServer,
    method: &str,
    path: &str,
    cookie: Option<&str>,
    bearer: Option<&str>,
    form: Option<String>,
) -> Received2 {
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", server.admin_addr))
        .header("accept", "text/html,application/xhtml+xml");
    if let Some(cookie) = cookie {
        request = request.header("cookie", cookie);
    }
    if let Some(bearer) = bearer {
        request = request.header("authorization", format!("Bearer {bearer}"));
    }
    let body = match form {
        Some(form) => {
            request = request.header("content-type", "application/x-www-form-urlencoded");
            Bytes::from(form)
        }
        None => Bytes::new(),
    };
    send(request.body(Full::new(body)).unwrap()).await
}

/// `GET path` on the admin listener from the loopback address `from` (127.0.0.0/8: every
/// address there is this machine's), with an optional bearer token and `Host`.
async fn get_from(
    server: &ProxyServer,
    from: std::net::Ipv4Addr,
    path: &str,
    bearer: Option<&str>,
    host: Option<&str>,
) -> (u16, http::HeaderMap, String) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(std::net::SocketAddr::from((from, 0))).unwrap();
    let stream = socket.connect(server.admin_addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let mut request = http::Request::get(path).header(
        "host",
        host.map_or_else(|| server.admin_addr.to_string(), str::to_string),
    );
    if let Some(bearer) = bearer {
        request = request.header("authorization", format!("Bearer {bearer}"));
    }
    let response = sender
        .send_request(request.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

async fn login(server: &ProxyServer, token: &str) -> Received2 {
    admin(
        server,
        "POST",
        "/login",
        None,
        None,
        Some(format!("token={}", form_escape(token))),
    )
    .await
}

/// `tokentap_session=<id>` from a login's `Set-Cookie`, and the whole header.
fn session_cookie(response: &Received2) -> (String, String) {
    let set = response
        .headers
        .get("set-cookie")
        .expect("a Set-Cookie")
        .to_str()
        .unwrap()
        .to_owned();
    let pair = set.split(';').next().unwrap().trim().to_owned();
    (pair, set)
}

fn hidden_csrf(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
    page[at..].split('"').next().unwrap().to_owned()
}

fn metric(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_logs_in_reads_the_page_and_starts_a_sweep_while_writes_need_the_bearer() {
    let sim = SimServer::start(
        Profile::builtin("step-3.7-flash-fp8-4x-rtx-pro-6000").unwrap(),
        SimOptions::default(),
    )
    .await
    .unwrap();
    let server = proxy_with_token(&sim.base_url(), "").await;

    // No bearer, no session: a browser is sent to the login form, an API client gets 401.
    let page = admin(&server, "GET", "/", None, None, None).await;
    assert_eq!(page.status, 303);
    assert_eq!(page.headers["location"], "/login");
    let api = get(&format!("http://{}/matrix", server.admin_addr)).await;
    assert_eq!(api.status, 401);
    let form = admin(&server, "GET", "/login", None, None, None).await;
    assert_eq!(form.status, 200);
    assert!(form
        .text()
        .contains("<form id=\"login\" method=\"post\" action=\"/login\""));
    assert!(!form.text().contains(TOKEN));

    // Log in: a 303 to the page with an HttpOnly, SameSite=Strict, Path=/ cookie.
    let logged_in = login(&server, TOKEN).await;
    assert_eq!(logged_in.status, 303, "{}", logged_in.text());
    assert_eq!(logged_in.headers["location"], "/");
    let (cookie, set_cookie) = session_cookie(&logged_in);
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    assert!(!set_cookie.contains(&form_escape(TOKEN)) && !set_cookie.contains(TOKEN));
    let id = cookie.strip_prefix("tokentap_session=").unwrap();
    assert_eq!(id.len(), 64);
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));

    // The page and the matrix read with the cookie alone.
    let page = admin(&server, "GET", "/", Some(&cookie), None, None).await;
    assert_eq!(page.status, 200);
    let text = page.text();
    assert!(text.contains("id=\"session\""), "{text}");
    let csrf = hidden_csrf(&text);
    assert_eq!(csrf.len(), 64);
    let matrix = admin(
        &server,
        "GET",
        "/matrix?format=json",
        Some(&cookie),
        None,
        None,
    )
    .await;
    assert_eq!(matrix.status, 200);
    let sweeps = admin(&server, "GET", "/sweeps", Some(&cookie), None, None).await;
    assert_eq!(sweeps.status, 200);
    // A page read with the bearer (an API client) has no browser controls.
    let bearer_page = admin(&server, "GET", "/", None, Some(TOKEN), None).await;
    assert_eq!(bearer_page.status, 200);
    assert!(!bearer_page.text().contains("id=\"session\""));

    // Writes still need the bearer token: the cookie is not enough.
    let plan = r#"{"contexts":["8K"],"concurrency":[1],"cell_duration":"1s","max_output":64}"#;
    let mut post = http::Request::post(format!("http://{}/sweeps", server.admin_addr))
        .header("cookie", &cookie)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(plan)))
        .unwrap();
    assert_eq!(send(post).await.status, 401);
    let reference = admin(
        &server,
        "PUT",
        "/reference",
        Some(&cookie),
        None,
        Some(r#"{"from":"latest-sweep"}"#.into()),
    )
    .await;
    assert_eq!(reference.status, 401);

    // The page's own form starts a sweep, but only with the session's CSRF token.
    let forged = admin(
        &server,
        "POST",
        "/page/sweep",
        Some(&cookie),
        None,
        Some("csrf=0000".into()),
    )
    .await;
    assert_eq!(forged.status, 403);
    let no_cookie = admin(
        &server,
        "POST",
        "/page/sweep",
        None,
        None,
        Some(format!("csrf={csrf}")),
    )
    .await;
    assert_eq!(no_cookie.status, 303);
    assert_eq!(no_cookie.headers["location"], "/login");
    assert!(server.admin.sweeps.list().is_empty(), "nothing started yet");
    // One click previews: the cells, the largest prompt, the KV cache, the expected
    // duration, and a confirming form. Nothing starts.
    assert!(text.contains("Preview a sweep…"), "{text}");
    let preview = admin(
        &server,
        "POST",
        "/page/sweep",
        Some(&cookie),
        None,
        Some(format!("csrf={csrf}&action=preview")),
    )
    .await;
    assert_eq!(preview.status, 200, "{}", preview.text());
    let shown = preview.text();
    for part in [
        "Decode cells:",
        "largest prompt",
        "KV cache:",
        "Expected duration: about",
        "Start this sweep",
        "cut to fit sweep.max_default_duration",
    ] {
        assert!(shown.contains(part), "{part}: {shown}");
    }
    // The old one-button form (no action) previews too.
    let old_form = admin(
        &server,
        "POST",
        "/page/sweep",
        Some(&cookie),
        None,
        Some(format!("csrf={csrf}")),
    )
    .await;
    assert_eq!(old_form.status, 200);
    assert!(
        server.admin.sweeps.list().is_empty(),
        "a preview started a sweep"
    );
    // The confirmation starts it.
    let started = admin(
        &server,
        "POST",
        "/page/sweep",
        Some(&cookie),
        None,
        Some(format!("csrf={csrf}&action=start")),
    )
    .await;
    assert_eq!(started.status, 303, "{}", started.text());
    assert_eq!(started.headers["location"], "/");
    let list = server.admin.sweeps.list();
    assert_eq!(list.len(), 1);
    let id = list[0].id.clone();
    // While it runs, the page says how far it is and offers Cancel, which cancels it.
    let page = admin(&server, "GET", "/", Some(&cookie), None, None)
        .await
        .text();
    assert!(page.contains("id=\"sweep-running\""), "{page}");
    assert!(page.contains("Cancel the sweep"), "{page}");
    assert!(!page.contains("Preview a sweep"), "{page}");
    let cancelled = admin(
        &server,
        "POST",
        "/page/sweep",
        Some(&cookie),
        None,
        Some(format!("csrf={csrf}&action=cancel&id={id}")),
    )
    .await;
    assert!(
        cancelled.status == 303 || cancelled.status == 409,
        "{}",
        cancelled.text()
    );
    post = http::Request::delete(format!("http://{}/sweeps/{id}", server.admin_addr))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let _ = send(post).await.status;
    let sweeps = &server.admin.sweeps;
    common::wait::until("the sweep to end", Duration::from_secs(60), || {
        !sweeps.get(&id).is_some_and(|s| s.state.is_active())
    })
    .await;

    // Log out: the cookie is cleared and no longer opens the page.
    let out = admin(
        &server,
        "POST",
        "/logout",
        Some(&cookie),
        None,
        Some(format!("csrf={csrf}")),
    )
    .await;
    assert_eq!(out.status, 303);
    assert_eq!(out.headers["location"], "/login");
    assert!(session_cookie(&out).1.contains("Max-Age=0"));
    let page = admin(&server, "GET", "/", Some(&cookie), None, None).await;
    assert_eq!(page.status, 303);
    assert_eq!(page.headers["location"], "/login");
    let api = send(
        http::Request::get(format!("http://{}/matrix", server.admin_addr))
            .header("cookie", &cookie)
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(api.status, 401);
    assert_eq!(server.admin.sessions.open_count(), 0);
    server.shutdown().await;
}

/// The configured `session_ttl` is the cookie's lifetime and the session table's. That a
/// session past it opens nothing and is no longer counted is `admin::sessions`' paused-time
/// test (`sessions_expire_and_are_bounded`); a session that no longer opens the page is sent
/// to the login form, above (after a logout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_last_the_configured_time() {
    let upstream = ScriptedUpstream::start(|_| Script::json(200, "{}")).await;
    let server = proxy_with_token(&upstream.url(), "session_ttl = \"1s\"").await;
    let logged_in = login(&server, TOKEN).await;
    assert_eq!(logged_in.status, 303);
    let (cookie, set_cookie) = session_cookie(&logged_in);
    assert!(set_cookie.contains("Max-Age=1"), "{set_cookie}");
    assert_eq!(server.admin.sessions.ttl(), Duration::from_secs(1));
    let page = admin(&server, "GET", "/", Some(&cookie), None, None).await;
    assert_eq!(page.status, 200, "a live session opens the page");
    assert_eq!(server.admin.sessions.open_count(), 1);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_are_counted_and_slowed() {
    let upstream = ScriptedUpstream::start(|_| Script::json(200, "{}")).await;
    let server = proxy_with_token(&upstream.url(), "").await;
    // Read from another address: this one's failures make it wait, bearer or not.
    let metrics = || async {
        get_from(
            &server,
            [127, 0, 0, 9].into(),
            "/metrics",
            Some(TOKEN),
            None,
        )
        .await
        .2
    };
    let before = metrics().await;
    assert_eq!(
        metric(
            &before,
            "tokentap_admin_login_failures_total{reason=\"bad_token\"}"
        ),
        Some(0.0),
        "the series exists before any failure"
    );

    let wrong = login(&server, "guess").await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.headers.get("set-cookie").is_none());
    assert!(wrong.text().contains("id=\"login-error\""));
    // A wrong token from this address too soon after: 429, counted as throttled.
    let soon = login(&server, "guess-2").await;
    assert_eq!(soon.status, 429);
    assert!(soon.headers.get("set-cookie").is_none());
    let retry: u64 = soon.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=1).contains(&retry), "{retry}");
    let after = metrics().await;
    assert_eq!(
        metric(
            &after,
            "tokentap_admin_login_failures_total{reason=\"bad_token\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &after,
            "tokentap_admin_login_failures_total{reason=\"throttled\"}"
        ),
        Some(1.0)
    );
    // While the address waits, no token it sends is compared, the right one neither: a
    // guesser learns nothing by sending more (the wait itself: `admin::sessions`' paused-time
    // tests).
    let good = login(&server, TOKEN).await;
    assert_eq!(good.status, 429);
    assert!(good.headers.get("set-cookie").is_none());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_login_form_leads_to_the_open_page() {
    let upstream = ScriptedUpstream::start(|_| Script::json(200, "{}")).await;
    let (server, _) = proxy(&upstream.url(), "").await;
    let form = admin(&server, "GET", "/login", None, None, None).await;
    assert_eq!(form.status, 303);
    assert_eq!(form.headers["location"], "/");
    assert_eq!(
        admin(&server, "GET", "/", None, None, None).await.status,
        200
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headless_chromium_is_sent_to_the_login_form_logs_in_and_opens_the_page() {
    let _cores = common::cores::busy().await;
    let upstream = ScriptedUpstream::start(|_| Script::json(200, "{}")).await;
    let server = proxy_with_token(&upstream.url(), "").await;
    let dir = temp_dir("chromium-login");
    let profile = dir.join("profile");
    let dump = |url: String, extra: &'static [&'static str]| {
        let profile = profile.clone();
        tokio::task::spawn_blocking(move || common::chromium::dump_dom_with(&url, &profile, extra))
    };
    // No bearer, no cookie: the page redirects to the form.
    let admin = server.admin_addr;
    let dom = dump(format!("http://{admin}/?window=15m"), &[])
        .await
        .unwrap();
    assert!(dom.contains("id=\"login\""), "{dom}");
    assert!(dom.contains("type=\"password\""), "{dom}");
    assert!(
        !dom.contains("id=\"production\""),
        "the page itself stays closed"
    );
    // The form posted by the browser (from a page of its own that submits it) sets the cookie;
    // Chromium then opens the page with it, the session's controls included. The submitting
    // page is served from loopback: Chromium (since its Local Network Access checks) does not
    // let an opaque origin such as a data: URL post to a loopback address.
    let submit_page = format!(
        "<form method=post action=\"http://{admin}/login\"><input name=token value=\"{TOKEN}\"></form><script>document.forms[0].submit()</script>"
    );
    let page_server = ScriptedUpstream::start(move |_| {
        let mut script = Script::json(200, &submit_page);
        script.headers = vec![("content-type", "text/html; charset=utf-8".into())];
        script
    })
    .await;
    dump(
        format!("{}/submit", page_server.url()),
        &["--virtual-time-budget=5000"],
    )
    .await
    .unwrap();
    assert_eq!(server.admin.sessions.open_count(), 1, "Chromium logged in");
    let dom = dump(format!("http://{admin}/?window=15m"), &[])
        .await
        .unwrap();
    assert!(dom.contains("id=\"production\""), "{dom}");
    assert!(
        dom.contains("id=\"session\"") && dom.contains("name=\"csrf\""),
        "{dom}"
    );
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_guesses_are_throttled_per_address_and_a_full_table_never_locks_out_a_new_one() {
    let upstream = ScriptedUpstream::start(|_| Script::json(200, "{}")).await;
    // The listener's budget out of the way: this test is about the per-address record.
    let server = proxy_with_token(
        &upstream.url(),
        "max_failed_credentials_per_second = 1000000",
    )
    .await;
    let guesser = std::net::Ipv4Addr::new(127, 0, 1, 1);
    let (status, _, _) = get_from(&server, guesser, "/matrix", Some("guess-1"), None).await;
    assert_eq!(status, 401);
    // A wrong one at once again: 429; the right one from the same address is not compared
    // either while the address waits.
    let (status, headers, body) =
        get_from(&server, guesser, "/matrix", Some("guess-2"), None).await;
    assert_eq!(status, 429, "{body}");
    assert!(headers.contains_key("retry-after"));
    let (status, _, body) = get_from(&server, guesser, "/matrix", Some(TOKEN), None).await;
    assert_eq!(status, 429, "{body}");
    // Guessing at full speed gets one failure counted a second, then fewer.
    let started = tokio::time::Instant::now();
    let mut looked = 0;
    while started.elapsed() < Duration::from_millis(1500) {
        let (status, _, _) = get_from(&server, guesser, "/matrix", Some("guess"), None).await;
        looked += usize::from(status == 401);
    }
    assert!(looked <= 2, "{looked} guesses were counted in 1.5 s");

    // Wrong tokens from more addresses than the table holds: a new address is never made to
    // wait for the others.
    for n in 0..1030u32 {
        let from = std::net::Ipv4Addr::from(0x7f02_0000 + n);
        let (status, _, _) = get_from(&server, from, "/matrix", Some("wrong"), None).await;
        assert_eq!(status, 401, "{from}");
    }
    let fresh = std::net::Ipv4Addr::new(127, 0, 3, 3);
    assert_eq!(
        get_from(&server, fresh, "/matrix", Some("wrong"), None)
            .await
            .0,
        401
    );
    // The latest guessers are still held (nothing they send is compared yet), and a right
    // token from an address with no failures goes in.
    let latest = std::net::Ipv4Addr::from(0x7f02_0000 + 1029);
    assert_eq!(
        get_from(&server, latest, "/matrix", Some("wrong"), None)
            .await
            .0,
        429
    );
    assert_eq!(
        get_from(&server, latest, "/matrix", Some(TOKEN), None)
            .await
            .0,
        429
    );
    let clean = std::net::Ipv4Addr::new(127, 0, 3, 4);
    assert_eq!(
        get_from(&server, clean, "/matrix", Some(TOKEN), None)
            .await
            .0,
        200
    );
    server.shutdown().await;
}

/// A guesser sending wrong tokens as fast as it can from the operator's own address (one NAT,
/// an ingress, `kubectl port-forward`): it gets one comparison per wait, whatever it sends (the
/// right token too is not compared while the address waits, so guessing faster learns nothing),
/// and a right token never clears the address's record for it. The operator's browser session,
/// opened before, still reads: a session cookie is not a guessable credential. (How long the
/// address waits after each failure, and the listener's budget a second, are
/// `admin::sessions`' paused-time tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_that_keeps_guessing_is_compared_once_per_wait() {
    let upstream = ScriptedUpstream::start(|_| Script::json(200, "{}")).await;
    let server = std::sync::Arc::new(proxy_with_token(&upstream.url(), "").await);
    let shared = std::net::Ipv4Addr::new(127, 0, 5, 5);
    let logged_in = login(&server, TOKEN).await;
    assert_eq!(logged_in.status, 303);
    let (cookie, _) = session_cookie(&logged_in);
    let started = tokio::time::Instant::now();
    let mut compared = 0;
    for n in 0..400 {
        let (status, _, _) = get_from(
            &server,
            shared,
            "/matrix",
            Some(&format!("guess-{n}")),
            None,
        )
        .await;
        assert!(status == 401 || status == 429, "{status}");
        compared += usize::from(status == 401);
    }
    let seconds = started.elapsed().as_secs_f64();
    // One comparison, then one after each wait of 1 s, 2 s, …: at most 2 in under 3 s.
    assert!(
        compared <= 1 + usize::from(seconds >= 1.0) + usize::from(seconds >= 3.0),
        "{compared} of 400 guesses compared in {seconds:.1} s"
    );
    // A wrong one (counted, or waiting), then the right one at once: not compared.
    let (status, _, _) = get_from(&server, shared, "/matrix", Some("guess"), None).await;
    assert!(status == 401 || status == 429, "{status}");
    let (status, _, _) = get_from(&server, shared, "/matrix", Some(TOKEN), None).await;
    assert_eq!(
        status, 429,
        "the right token is not compared while its address waits"
    );
    let read = admin(&server, "GET", "/matrix", Some(&cookie), None, None).await;
    assert_eq!(read.status, 200, "{}", read.text());
    match std::sync::Arc::try_unwrap(server) {
        Ok(server) => server.shutdown().await,
        Err(_) => panic!("the guesser is done"),
    }
}

/// Login heads sent first, their bodies a second later: each attempt was counted when its head
/// came, so one failure is checked as a first attempt and the rest wait (HTTP/1.1 and h2c).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_whose_bodies_come_late_are_counted_when_their_heads_come() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = ScriptedUpstream::start(|_| Script::json(200, "{}")).await;
    let server = proxy_with_token(&upstream.url(), "").await;
    let body = "token=guess";
    // HTTP/1.1: 20 connections, each sends its head, then all bodies together.
    let mut streams = Vec::new();
    for _ in 0..20 {
        let mut stream = tokio::net::TcpStream::connect(server.admin_addr)
            .await
            .unwrap();
        let head = format!(
            "POST /login HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n",
            server.admin_addr,
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        streams.push(stream);
    }
    // The heads are in (each counted as it came); then all bodies together.
    let admin = std::sync::Arc::clone(&server.admin);
    common::wait::until("20 login heads read", Duration::from_secs(10), || {
        admin.sessions.attempts() >= 20
    })
    .await;
    let mut statuses = Vec::new();
    for stream in &mut streams {
        // A throttled login is answered before its body is read, and its connection may be
        // closed by then.
        let _ = stream.write_all(body.as_bytes()).await;
    }
    for mut stream in streams {
        let mut answer = vec![0u8; 12];
        tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut answer))
            .await
            .unwrap()
            .unwrap();
        statuses.push(String::from_utf8_lossy(&answer[9..12]).into_owned());
    }
    let checked = statuses.iter().filter(|s| *s == "401").count();
    assert_eq!(checked, 1, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| *s == "429").count(), 19);

    // h2c: 20 streams on one connection from another address, heads first.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(std::net::SocketAddr::from(([127, 0, 6, 6], 0)))
        .unwrap();
    let stream = socket.connect(server.admin_addr).await.unwrap();
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let mut bodies = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..20 {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
        let request = http::Request::post(format!("http://{}/login", server.admin_addr))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(LateBody(rx))
            .unwrap();
        let mut sender = sender.clone();
        answers.push(tokio::spawn(
            async move { sender.send_request(request).await },
        ));
        bodies.push(tx);
    }
    common::wait::until("20 more login heads read", Duration::from_secs(10), || {
        admin.sessions.attempts() >= 40
    })
    .await;
    for tx in bodies {
        // A throttled login's body is never read: its stream is answered and gone.
        let _ = tx.send(Bytes::from_static(b"token=guess")).await;
    }
    let mut statuses = Vec::new();
    for answer in answers {
        let response = tokio::time::timeout(Duration::from_secs(10), answer)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        statuses.push(response.status().as_u16());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 401).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 19);
    server.shutdown().await;
}

/// A request body whose one frame comes later, through a channel (then it ends).
struct LateBody(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for LateBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|data| data.map(|data| Ok(hyper::body::Frame::data(data))))
    }
}

/// One wrong guess from each of 4,000 loopback addresses: the failures checked are bounded by
/// the listener's budget (`admin.max_failed_credentials_per_second`, 10 by default), the rest
/// answered 429; the right token from yet another address still goes in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guesses_from_four_thousand_addresses_are_bounded_by_the_listener_budget() {
    let _cores = common::cores::busy().await;
    let upstream = ScriptedUpstream::start(|_| Script::json(200, "{}")).await;
    let server = std::sync::Arc::new(proxy_with_token(&upstream.url(), "").await);
    let started = tokio::time::Instant::now();
    let mut counted = 0usize;
    let mut throttled = 0usize;
    let addresses: Vec<std::net::Ipv4Addr> = (0..4_000u32)
        .map(|n| std::net::Ipv4Addr::from(0x7f20_0000 + n))
        .collect();
    for chunk in addresses.chunks(50) {
        let mut tasks = Vec::new();
        for &from in chunk {
            let server = std::sync::Arc::clone(&server);
            tasks.push(tokio::spawn(async move {
                get_from(&server, from, "/matrix", Some("wrong"), None)
                    .await
                    .0
            }));
        }
        for task in tasks {
            match task.await.unwrap() {
                401 => counted += 1,
                429 => throttled += 1,
                other => panic!("{other}"),
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let bound = 10.0 + 10.0 * seconds.ceil();
    assert!(
        counted as f64 <= bound,
        "{counted} guesses checked in {seconds:.1} s (bound {bound})"
    );
    assert_eq!(counted + throttled, 4_000);
    // The right token from yet another address goes in once the budget has refilled (a
    // credential is not compared while it is spent: a right one answered at once beside
    // wrong ones answered 429 would tell a guesser which was right).
    let fresh = std::net::Ipv4Addr::new(127, 0, 7, 7);
    common::wait::until_async(
        "the right token admitted",
        Duration::from_secs(5),
        async || {
            get_from(&server, fresh, "/matrix", Some(TOKEN), None)
                .await
                .0
                == 200
        },
    )
    .await;
    match std::sync::Arc::try_unwrap(server) {
        Ok(server) => server.shutdown().await,
        Err(_) => panic!("every request answered"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_only_loopback_hosts_are_answered() {
    let upstream = ScriptedUpstream::start(|_| Script::json(200, "{}")).await;
    let (server, _) = proxy(
        &upstream.url(),
        "[admin]\nallowed_hosts = [\"tokentap.internal\"]\n",
    )
    .await;
    let here = std::net::Ipv4Addr::LOCALHOST;
    let port = server.admin_addr.port();
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "localhost".to_string(),
        format!("[::1]:{port}"),
        format!("Tokentap.Internal:{port}"),
    ] {
        let (status, _, body) = get_from(&server, here, "/matrix", None, Some(&host)).await;
        assert_eq!(status, 200, "{host}: {body}");
    }
    // A name that resolves to loopback for a browser on another site's page (DNS rebinding).
    for host in [
        "evil.example",
        "evil.example:9464",
        "127.0.0.1.evil.example",
    ] {
        let (status, _, body) = get_from(&server, here, "/matrix", None, Some(host)).await;
        assert_eq!(status, 403, "{host}");
        assert!(body.contains("admin.allowed_hosts"), "{body}");
        let (status, _, _) = get_from(&server, here, "/", None, Some(host)).await;
        assert_eq!(status, 403, "{host}");
    }
    // Health checks answer whatever the name.
    assert_eq!(
        get_from(&server, here, "/healthz", None, Some("evil.example"))
            .await
            .0,
        200
    );
    server.shutdown().await;
}

/// Every route of the admin table, asked without credentials, with a browser session and with
/// the bearer token, answers as its access says; and without a token configured, writes are
/// refused outright.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_route_answers_as_its_access_says() {
    use tokentap::admin::{Access, ROUTES};
    let upstream = ScriptedUpstream::start(|_| Script::json(200, "{}")).await;
    let server = proxy_with_token(&upstream.url(), "").await;
    // Each credential from an address of its own: a refused one must not make the next wait.
    let mut address = 0u8;
    for route in ROUTES {
        // A session of its own per route (`POST /logout` ends the one it is asked with).
        let logged_in = login(&server, TOKEN).await;
        let (cookie, _) = session_cookie(&logged_in);
        let path = route.path.example();
        let method = route.method.as_str();
        let ask = |cookie: Option<&str>, bearer: Option<&str>, from: u8| {
            let path = path.clone();
            let cookie = cookie.map(str::to_owned);
            let bearer = bearer.map(str::to_owned);
            let admin_addr = server.admin_addr;
            async move {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket
                    .bind(std::net::SocketAddr::from(([127, 0, 4, from], 0)))
                    .unwrap();
                let stream = socket.connect(admin_addr).await.unwrap();
                let (mut sender, connection) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                        .await
                        .unwrap();
                tokio::spawn(connection);
                let mut request = http::Request::builder()
                    .method(method)
                    .uri(&path)
                    .header("host", admin_addr.to_string())
                    .header("accept", "application/json");
                if let Some(cookie) = cookie {
                    request = request.header("cookie", cookie);
                }
                if let Some(bearer) = bearer {
                    request = request.header("authorization", format!("Bearer {bearer}"));
                }
                let response = sender
                    .send_request(request.body(Full::new(Bytes::new())).unwrap())
                    .await
                    .unwrap();
                response.status().as_u16()
            }
        };
        address += 3;
        let none = ask(None, None, address).await;
        let session = ask(Some(&cookie), None, address + 1).await;
        let bearer = ask(None, Some(TOKEN), address + 2).await;
        let what = format!(
            "{method} {path} ({:?}): none {none}, session {session}, bearer {bearer}",
            route.access
        );
        match route.access {
            Access::Probe => {
                // Nothing is checked: a probe is answered whoever asks.
                assert!(none == session && session == bearer, "{what}");
                assert_eq!(none, 200, "{what}");
            }
            Access::Open => {
                // No check before the handler: credentials change nothing (`POST /login`
                // without a form answers its own 401, whoever asks).
                assert!(none == session && session == bearer, "{what}");
                assert_ne!(none, 403, "{what}");
            }
            Access::Read => {
                assert_eq!(none, 401, "{what}");
                assert!(session != 401 && session != 403, "{what}");
                assert!(bearer != 401 && bearer != 403, "{what}");
            }
            Access::Write => {
                assert_eq!(none, 401, "{what}");
                assert_eq!(session, 401, "{what}: a session cannot write");
                assert!(bearer != 401 && bearer != 403, "{what}");
            }
            Access::Form => {
                // Without a session: to the login form; with one but no CSRF field: 403.
                assert_eq!(none, 303, "{what}");
                assert_eq!(session, 403, "{what}");
                assert_eq!(bearer, 303, "{what}: the bearer is not a session");
            }
        }
    }
    server.shutdown().await;

    // Without a token, reads are open (on loopback names) and writes refused outright.
    let (open, _) = proxy(&upstream.url(), "").await;
    for route in ROUTES.iter().filter(|r| r.access == Access::Write) {
        let request = http::Request::builder()
            .method(route.method.as_str())
            .uri(format!(
                "http://{}{}",
                open.admin_addr,
                route.path.example()
            ))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = send(request).await;
        assert_eq!(response.status, 403, "{route:?}");
        assert!(
            response.text().contains("admin.token"),
            "{}",
            response.text()
        );
    }
    open.shutdown().await;
}

/// A request without a credential and one with a wrong token get different 401s, each saying
/// what the CLI sends (`--token` or `TOKENTAP_ADMIN__TOKEN`); the CLI shows the server's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_token_and_a_wrong_one_are_told_apart() {
    let upstream = ScriptedUpstream::start(|_| Script::json(200, "{}")).await;
    let server = proxy_with_token(&upstream.url(), "").await;
    let (missing, _, said_missing) =
        get_from(&server, [127, 0, 7, 1].into(), "/matrix", None, None).await;
    let (wrong, _, said_wrong) = get_from(
        &server,
        [127, 0, 7, 2].into(),
        "/matrix",
        Some("guess"),
        None,
    )
    .await;
    assert_eq!((missing, wrong), (401, 401));
    assert!(said_missing.contains("none was sent"), "{said_missing}");
    assert!(
        said_wrong.contains("is not this proxy's admin.token"),
        "{said_wrong}"
    );
    for said in [&said_missing, &said_wrong] {
        assert!(said.contains("TOKENTAP_ADMIN__TOKEN"), "{said}");
    }
    assert_ne!(said_missing, said_wrong);

    // The CLI without a token: the server's "none was sent" reaches the terminal.
    let output = tokio::task::spawn_blocking({
        let admin = format!("http://{}", server.admin_addr);
        move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
                .args(["reference", "--admin", &admin, "show"])
                .env_remove("TOKENTAP_ADMIN__TOKEN")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("none was sent") && stderr.contains("TOKENTAP_ADMIN__TOKEN"),
        "{stderr}"
    );
    server.shutdown().await;
}

/// `sweep --target` given a tokentap admin listener says what it is and which flag takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_aimed_at_an_admin_listener_is_told_to_use_admin() {
    let upstream = ScriptedUpstream::start(|_| Script::json(200, "{}")).await;
    let server = proxy_with_token(&upstream.url(), "").await;
    let target = format!("http://{}", server.admin_addr);
    let output = tokio::task::spawn_blocking({
        let target = target.clone();
        move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
                .args(["sweep", "--target", &target, "--dry-run"])
                .env_remove("TOKENTAP_ADMIN__TOKEN")
                .env_remove("TOKENTAP_CONFIG")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("is a tokentap admin listener")
            && stderr.contains(&format!("use --admin {target}")),
        "{stderr}"
    );
    server.shutdown().await;
}

/// Issue 45.6, a preview you can change: the preview page's fields (contexts, concurrency,
/// like production) start the plan they show; each skipped cell is named with its reason,
/// token counts are rounded, and with production in flight the preview names the page's box
/// and the CLI's `--beside-production`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_preview_fields_start_the_plan_they_show_and_name_each_skipped_cell() {
    let sim = SimServer::start(
        Profile::builtin("step-3.7-flash-fp8-4x-rtx-pro-6000").unwrap(),
        SimOptions::default(),
    )
    .await
    .unwrap();
    let server = proxy_with_token(&sim.base_url(), "").await;
    let (cookie, _) = session_cookie(&login(&server, TOKEN).await);
    let page = admin(&server, "GET", "/", Some(&cookie), None, None)
        .await
        .text();
    let csrf = hidden_csrf(&page);
    let form = |fields: &str| {
        let (server, cookie) = (&server, cookie.clone());
        let body = format!("csrf={csrf}&{fields}");
        async move {
            admin(
                server,
                "POST",
                "/page/sweep",
                Some(&cookie),
                None,
                Some(body),
            )
            .await
        }
    };

    // Production traffic for the model, so the sweep can be shaped like it.
    let url = format!("http://{}/v1/completions", server.proxy_addr);
    for _ in 0..2 {
        let done = common::post(
            &url,
            r#"{"model":"step3p7","prompt":"hello","max_tokens":8,"stream":true}"#,
        )
        .await;
        assert_eq!(done.status, 200);
    }
    let meter = &server.proxy.meter;
    common::wait::until("production to drain", Duration::from_secs(10), || {
        meter.inflight(tokentap::base::Source::Production) == 0
    })
    .await;

    // 8K and 128K at 1 and 8 streams: 8 × (128K + 4K) is over the simulator's KV cache
    // (608K tokens), so exactly 128K × 8 is skipped.
    let fields = "contexts=8K%2C+128K&concurrency=1%2C8&cell_duration=7s&like_production=on";
    let preview = form(&format!("action=preview&{fields}")).await;
    assert_eq!(preview.status, 200, "{}", preview.text());
    let shown = preview.text();
    let cells: Vec<(String, String, String)> = shown
        .match_indices("<li data-context=\"")
        .map(|(at, _)| {
            let attrs: Vec<&str> = shown[at..].split('"').collect();
            (
                attrs[1].to_owned(),
                attrs[3].to_owned(),
                attrs[5].to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String, String)> = [
        ("8K", "1", "yes"),
        ("8K", "8", "yes"),
        ("128K", "1", "yes"),
        ("128K", "8", "no"),
    ]
    .iter()
    .map(|(a, b, c)| ((*a).to_owned(), (*b).to_owned(), (*c).to_owned()))
    .collect();
    assert_eq!(cells, expected, "{shown}");
    assert!(
        shown.contains("Skipped 128K × 8: over the KV budget of 608K tokens"),
        "{shown}"
    );
    assert!(
        shown.contains("128K × 8: skipped, over the KV budget"),
        "{shown}"
    );
    assert!(
        shown.contains("Requests: shaped"),
        "like production: {shown}"
    );
    // The cell duration picked is the plan's (issue 61.10).
    assert!(shown.contains("7s per cell window"), "{shown}");
    assert!(
        shown.contains("name=\"cell_duration\" value=\"7s\""),
        "{shown}"
    );
    // Rounded token counts: no raw six-digit figure.
    assert!(shown.contains("of 608K tokens"), "{shown}");
    assert!(!shown.contains("622592"), "{shown}");
    // The confirmation carries exactly the fields previewed; the change form shows them.
    let confirm = &shown[shown.find("id=\"confirm\"").unwrap()..];
    let confirm = &confirm[..confirm.find("</form>").unwrap()];
    for hidden in [
        "name=\"contexts\" value=\"8K, 128K\"",
        "name=\"concurrency\" value=\"1,8\"",
        "name=\"cell_duration\" value=\"7s\"",
        "name=\"like_production\" value=\"on\"",
    ] {
        assert!(confirm.contains(hidden), "{hidden}: {confirm}");
    }
    assert!(shown.contains("Preview again"), "{shown}");
    // A concurrency that is not a list of levels is refused with the reason.
    let bad = form("action=preview&concurrency=1%2Cmany").await;
    assert_eq!(bad.status, 400);
    assert!(bad.text().contains("&quot;many&quot;"), "{}", bad.text());

    // Starting it starts that plan.
    let started = form(&format!("action=start&{fields}")).await;
    assert_eq!(started.status, 303, "{}", started.text());
    let list = server.admin.sweeps.list();
    assert_eq!(list.len(), 1);
    let status = server.admin.sweeps.get(&list[0].id).unwrap();
    assert_eq!(status.request.concurrency, Some(vec![1, 8]));
    assert_eq!(status.request.like_production, Some(true));
    assert!(
        matches!(&status.request.cell_duration, Some(tokentap::sweep::request::DurationValue::Text(d)) if d == "7s"),
        "{:?}",
        status.request.cell_duration
    );
    let sweeps = &server.admin.sweeps;
    let id = list[0].id.clone();
    common::wait::until("the sweep's plan", Duration::from_secs(30), || {
        sweeps.get(&id).is_some_and(|s| s.plan.is_some())
    })
    .await;
    let plan = sweeps.get(&id).unwrap().plan.unwrap();
    assert_eq!(plan.decode_contexts(), [8192, 131072]);
    assert_eq!(plan.concurrency, [1, 8]);
    assert!(plan.like_production.is_some());
    assert!(plan.over_capacity(131072, 8) && !plan.over_capacity(131072, 1));
    let _ = sweeps.cancel(&id);
    common::wait::until("the sweep to end", Duration::from_secs(60), || {
        !sweeps.get(&id).is_some_and(|s| s.state.is_active())
    })
    .await;

    // Production in flight: the preview names the box to tick and the CLI flag.
    let long = {
        let url = url.clone();
        tokio::spawn(async move {
            common::post(
                &url,
                r#"{"model":"step3p7","prompt":"hello","max_tokens":100000,"ignore_eos":true,"stream":true}"#,
            )
            .await
        })
    };
    common::wait::until("a production stream", Duration::from_secs(10), || {
        meter.inflight(tokentap::base::Source::Production) >= 1
    })
    .await;
    let busy = form("action=preview&contexts=8K&concurrency=1")
        .await
        .text();
    assert!(
        busy.contains("tick &quot;Run beside production&quot; on the page"),
        "{busy}"
    );
    assert!(busy.contains("--beside-production"), "{busy}");
    assert!(
        busy.contains("name=\"beside_production\" value=\"on\"> Run beside production"),
        "{busy}"
    );
    long.abort();
    server.shutdown().await;
}

/// Issue 61.8: an admin route sent to the data port is answered with where the admin listener
/// is (not with how to open it there through `proxy.routes`, which would forward tokentap's own
/// routes to the engine), and `tokentap status --admin` pointed at the data port says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_route_on_the_data_port_names_the_admin_listener() {
    let upstream = ScriptedUpstream::start(|_| Script::json(200, "{}")).await;
    let (server, _records) = proxy(&upstream.url(), "").await;
    let admin = format!("http://{}", server.admin_addr);
    let data = format!("http://{}", server.proxy_addr);
    for path in ["/status", "/capacity", "/sweeps/0-0000", "/readyz"] {
        let response = get(&format!("{data}{path}")).await;
        assert_eq!(response.status, 403, "{path}");
        let body: serde_json::Value = serde_json::from_slice(&response.bytes()).unwrap();
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("this is tokentap's data listener")
                && message.contains(&format!("the admin listener is {admin}"))
                && !message.contains("proxy.routes"),
            "{path}: {body}"
        );
        assert_eq!(body["error"]["type"], "admin_route_on_data_port", "{body}");
        assert_eq!(body["error"]["admin"], admin.as_str(), "{body}");
    }
    assert!(upstream.requests().is_empty(), "{:?}", upstream.requests());

    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
                .args(["status", "--admin", &data])
                .env_remove("TOKENTAP_ADMIN__TOKEN")
                .output()
                .unwrap()
        }),
    )
    .await
    .expect("tokentap status answers within 60 s")
    .unwrap();
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("is tokentap's data listener")
            && said.contains(&format!("--admin takes the admin listener, {admin}"))
            && !said.contains("proxy.routes"),
        "{said}"
    );
    server.shutdown().await;
}
