//! Browser sessions on the admin listener, for when `admin.token` is set: a browser cannot send
//! `Authorization: Bearer`, so it logs in once with the token and gets a session cookie that
//! reads the page and the matrix (every `GET` the bearer token would read) and can start a
//! sweep from the page. Every other write (`POST`/`DELETE /sweeps`, references) still needs the
//! bearer token.
//!
//! | route | does |
//! |---|---|
//! | `GET /login` | the login form (no token configured: a redirect to `/`) |
//! | `POST /login` | form field `token`: right → a session cookie and a redirect to `/`; wrong → 401, counted and slowed |
//! | `POST /logout` | ends the session, clears the cookie, redirects to `/login` |
//! | `POST /page/sweep` | form field `csrf` (the session's own): starts a sweep with the default plan, as `POST /sweeps` with an empty body would |
//!
//! The cookie (`tokentap_session`) is `HttpOnly; SameSite=Strict; Path=/`, host-only (no
//! `Domain`), and carries a 256-bit random id from ring's `SystemRandom`; the token itself is
//! never in a URL, a cookie or a log. The admin listener speaks plain HTTP, so the cookie is not
//! `Secure` (a browser would drop it). Each session has its own CSRF token, a hidden field of the
//! page's forms: with `SameSite=Strict` another site cannot make the browser send the cookie,
//! and without the field a forged form is refused anyway. Sessions last `admin.session_ttl`
//! (12 h by default) and at most `admin.max_sessions` are kept (a login past it ends the
//! oldest). Failed logins are counted (`tokentap_admin_login_failures_total{reason}`) and
//! slowed per client address: after the n-th failure in a row that address waits n seconds
//! (at most [`MAX_DELAY`]) before its next attempt is even checked (429 with `Retry-After`
//! until then); at most [`MAX_CLIENTS`] addresses are tracked, past that new ones share one
//! slot. Sessions live in memory: a restart logs everyone out.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;
use ring::rand::{SecureRandom, SystemRandom};
use tokio::time::Instant;

use super::state::{constant_time_eq, json_error, read_body, respond, AdminState};
use crate::base::escape::xml_escape as escape;
use crate::base::lock::lock;
use crate::proxy::body::ResponseBody;
use crate::proxy::BoxError;

/// The session cookie's name.
pub const COOKIE: &str = "tokentap_session";

/// Longest wait imposed on an address after failed logins.
pub const MAX_DELAY: Duration = Duration::from_secs(30);

/// Most client addresses whose failed logins are remembered; past it, the entry whose wait
/// ended longest ago makes room (never a shared entry: an address with no failures of its own
/// is never made to wait for others').
pub const MAX_CLIENTS: usize = 1024;

/// A remembered address forgets its failures this long after its wait ended.
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);

/// Largest login or form body read.
const MAX_FORM_BYTES: usize = 4 << 10;

/// The client's address, put in the request's extensions by the admin listener's service.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub IpAddr);

/// Why a login failed, the `reason` label of `tokentap_admin_login_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginFailure {
    /// The token given was not the configured one (or was missing).
    BadToken,
    /// The address was still waiting after earlier failures; the token was not checked.
    Throttled,
}

impl LoginFailure {
    pub const ALL: [LoginFailure; 2] = [LoginFailure::BadToken, LoginFailure::Throttled];

    pub fn label(self) -> &'static str {
        match self {
            LoginFailure::BadToken => "bad_token",
            LoginFailure::Throttled => "throttled",
        }
    }
}

#[derive(Debug)]
struct Session {
    csrf: String,
    expires: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    retry_at: Instant,
    /// Which failure of the table's this address's latest was (older ones make room first).
    serial: u64,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<String, Session>,
    /// Failed logins and bearer tokens per client address (`None`: a request whose address is
    /// unknown, only ever an in-process one), at most [`MAX_CLIENTS`].
    failures: HashMap<Option<IpAddr>, Failures>,
    /// Failures recorded so far (the next one's serial).
    serials: u64,
}

/// The browser sessions and the failed-login record of one admin listener.
#[derive(Debug)]
pub struct Sessions {
    ttl: Duration,
    max_sessions: usize,
    random: SystemRandom,
    inner: Mutex<Inner>,
}

/// A session found by its cookie.
#[derive(Debug, Clone)]
pub struct SessionView {
    pub id: String,
    /// The session's CSRF token, the hidden field of the page's forms.
    pub csrf: String,
}

impl Sessions {
    pub fn new(ttl: Duration, max_sessions: usize) -> Self {
        Self {
            ttl,
            max_sessions: max_sessions.max(1),
            random: SystemRandom::new(),
            inner: Mutex::default(),
        }
    }

    /// How long a session lasts.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Opens a session: its id and CSRF token (`None` if the system has no randomness).
    pub fn open(&self) -> Option<SessionView> {
        let id = random_hex(&self.random)?;
        let csrf = random_hex(&self.random)?;
        let now = Instant::now();
        let mut inner = lock(&self.inner);
        inner.sessions.retain(|_, s| s.expires > now);
        while inner.sessions.len() >= self.max_sessions {
            let oldest = inner
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(id, _)| id.clone());
            match oldest {
                Some(oldest) => inner.sessions.remove(&oldest),
                None => break,
            };
        }
        inner.sessions.insert(
            id.clone(),
            Session {
                csrf: csrf.clone(),
                expires: now + self.ttl,
            },
        );
        Some(SessionView { id, csrf })
    }

    /// The live session of this id, if any (an expired one is dropped).
    pub fn find(&self, id: &str) -> Option<SessionView> {
        let now = Instant::now();
        let mut inner = lock(&self.inner);
        let session = inner.sessions.get(id)?;
        if session.expires <= now {
            inner.sessions.remove(id);
            return None;
        }
        Some(SessionView {
            id: id.to_owned(),
            csrf: session.csrf.clone(),
        })
    }

    /// Ends a session.
    pub fn close(&self, id: &str) {
        lock(&self.inner).sessions.remove(id);
    }

    /// Sessions open now (expired ones not counted).
    pub fn open_count(&self) -> usize {
        let now = Instant::now();
        lock(&self.inner)
            .sessions
            .values()
            .filter(|s| s.expires > now)
            .count()
    }

    /// How long this address must still wait before a credential it sends is checked.
    pub fn wait_left(&self, client: Option<IpAddr>) -> Option<Duration> {
        let now = Instant::now();
        let inner = lock(&self.inner);
        let failures = inner.failures.get(&client)?;
        let left = failures.retry_at.saturating_duration_since(now);
        (!left.is_zero()).then_some(left)
    }

    /// Records a failed login or bearer token from this address: returns how long it must
    /// now wait. A full table first forgets what is past [`FORGET_AFTER`], then the entry whose
    /// wait ended (or ends) first.
    pub fn failed(&self, client: Option<IpAddr>) -> Duration {
        let now = Instant::now();
        let mut inner = lock(&self.inner);
        if !inner.failures.contains_key(&client) && inner.failures.len() >= MAX_CLIENTS {
            inner
                .failures
                .retain(|_, f| f.retry_at + FORGET_AFTER > now);
            if inner.failures.len() >= MAX_CLIENTS {
                let oldest = inner
                    .failures
                    .iter()
                    .min_by_key(|(_, f)| (f.retry_at, f.serial))
                    .map(|(address, _)| *address);
                if let Some(oldest) = oldest {
                    inner.failures.remove(&oldest);
                }
            }
        }
        inner.serials += 1;
        let serial = inner.serials;
        let entry = inner.failures.entry(client).or_insert(Failures {
            count: 0,
            retry_at: now,
            serial,
        });
        if entry.retry_at + FORGET_AFTER <= now {
            entry.count = 0;
        }
        entry.serial = serial;
        entry.count = entry.count.saturating_add(1);
        let delay = Duration::from_secs(u64::from(entry.count)).min(MAX_DELAY);
        entry.retry_at = now + delay;
        delay
    }

    /// A good login (or bearer token) from this address forgets its failures.
    pub fn succeeded(&self, client: Option<IpAddr>) {
        let mut inner = lock(&self.inner);
        if !inner.failures.is_empty() {
            inner.failures.remove(&client);
        }
    }
}

/// The answer to a credential sent from an address still waiting after failures: `429`, with
/// how long in `Retry-After` (the credential is not looked at).
pub fn too_many(left: Duration) -> Response<ResponseBody> {
    let seconds = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    let mut response = json_error(
        StatusCode::TOO_MANY_REQUESTS,
        &format!("too many wrong admin credentials from this address: try again in {seconds} s"),
    );
    if let Ok(value) = HeaderValue::try_from(seconds.to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// 32 random bytes as 64 hex digits.
fn random_hex(random: &SystemRandom) -> Option<String> {
    let mut bytes = [0u8; 32];
    random.fill(&mut bytes).ok()?;
    let mut out = String::with_capacity(64);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    Some(out)
}

/// The session id in the request's `Cookie` headers, if any.
pub fn cookie_id<B>(request: &Request<B>) -> Option<&str> {
    request
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == COOKIE).then_some(value)
        })
}

/// The live session this request's cookie names, when a token is configured.
pub fn session_of<B>(state: &AdminState, request: &Request<B>) -> Option<SessionView> {
    state.token.as_ref()?;
    state.sessions.find(cookie_id(request)?)
}

/// Whether the client asked for HTML (a browser navigating), so a 401 becomes the login form.
pub fn wants_html<B>(request: &Request<B>) -> bool {
    request.method() == Method::GET
        && request
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|accept| accept.contains("text/html"))
}

/// A `303 See Other` to `location`.
pub fn see_other(location: &'static str) -> Response<ResponseBody> {
    let mut response = respond(StatusCode::SEE_OTHER, "text/plain; charset=utf-8", "");
    response
        .headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(location));
    response
}

/// `GET /login`: the login form (without a token the page is open: sent there).
pub fn login_form(state: &AdminState) -> Response<ResponseBody> {
    if state.token.is_none() {
        return see_other("/");
    }
    login_page(StatusCode::OK, None)
}

/// `POST /logout`: ends the session and clears its cookie.
pub fn logout<B>(state: &AdminState, request: &Request<B>) -> Response<ResponseBody> {
    if state.token.is_none() {
        return see_other("/");
    }
    if let Some(id) = cookie_id(request) {
        state.sessions.close(id);
    }
    let mut response = see_other("/login");
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("tokentap_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
    response
}

/// `POST /login`: the token from the form; a session cookie when it is the right one (failures
/// throttled per client address).
pub async fn login<B>(state: &AdminState, request: Request<B>) -> Response<ResponseBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let Some(token) = state.token.as_deref() else {
        return see_other("/");
    };
    login_with(state, token, request).await
}

async fn login_with<B>(
    state: &AdminState,
    token: &str,
    request: Request<B>,
) -> Response<ResponseBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let client = request.extensions().get::<ClientAddr>().map(|c| c.0);
    if let Some(left) = state.sessions.wait_left(client) {
        state
            .metrics
            .count_login_failure(LoginFailure::Throttled.label());
        let seconds = left.as_secs() + u64::from(left.subsec_nanos() > 0);
        let mut response = login_page(
            StatusCode::TOO_MANY_REQUESTS,
            Some(&format!(
                "Too many failed logins from your address: try again in {seconds} s."
            )),
        );
        if let Ok(value) = HeaderValue::try_from(seconds.to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return response;
    }
    let body = match read_body(request, MAX_FORM_BYTES, "the login form").await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let given = form_field(&body, "token").unwrap_or_default();
    if !constant_time_eq(given.as_bytes(), token.as_bytes()) {
        state
            .metrics
            .count_login_failure(LoginFailure::BadToken.label());
        let wait = state.sessions.failed(client);
        tracing::warn!(
            client = ?client,
            wait_s = wait.as_secs(),
            "failed admin login"
        );
        return login_page(
            StatusCode::UNAUTHORIZED,
            Some("That is not the admin token."),
        );
    }
    state.sessions.succeeded(client);
    let Some(session) = state.sessions.open() else {
        return json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "no randomness for a session id",
        );
    };
    let mut response = see_other("/");
    let cookie = format!(
        "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        session.id,
        state.sessions.ttl().as_secs().max(1)
    );
    if let Ok(value) = HeaderValue::try_from(cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// The page's sweep forms (`POST /page/sweep`, CSRF-checked): `action=preview` shows what the
/// default plan would do and asks for a confirmation; `action=start` (that confirmation)
/// starts it, beside production only when its box was ticked; `action=cancel` cancels the
/// running sweep. A form without an action previews: nothing starts from one click.
pub async fn sweep_form<B>(state: &AdminState, request: Request<B>) -> Response<ResponseBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    if state.token.is_none() {
        return see_other("/");
    }
    let Some(session) = session_of(state, &request) else {
        return see_other("/login");
    };
    let body = match read_body(request, MAX_FORM_BYTES, "the form").await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let given = form_field(&body, "csrf").unwrap_or_default();
    if !constant_time_eq(given.as_bytes(), session.csrf.as_bytes()) {
        return message_page(
            StatusCode::FORBIDDEN,
            "This form is stale or did not come from the page: reload the page and try again.",
        );
    }
    let action = form_field(&body, "action").unwrap_or_default();
    match action.as_str() {
        "start" => {
            let request = crate::sweep::SweepRequest {
                beside_production: form_field(&body, "beside_production")
                    .map(|v| v == "on" || v == "true"),
                ..crate::sweep::SweepRequest::default()
            };
            match state.sweeps.start(request).await {
                Ok(_) => see_other("/"),
                Err(error) => start_refused(error),
            }
        }
        "cancel" => {
            let id = form_field(&body, "id").unwrap_or_default();
            match state.sweeps.cancel(&id) {
                Ok(()) => see_other("/"),
                Err(error) => message_page(StatusCode::CONFLICT, &error.to_string()),
            }
        }
        _ => match state
            .sweeps
            .preview(&crate::sweep::SweepRequest::default())
            .await
        {
            Ok(preview) => preview_page(&preview, &session),
            Err(error) => start_refused(error),
        },
    }
}

/// A sweep that did not start (or could not be previewed), as a page.
fn start_refused(error: crate::sweep::StartError) -> Response<ResponseBody> {
    use crate::sweep::StartError;
    match error {
        error @ (StartError::Busy { .. } | StartError::ProductionInFlight { .. }) => {
            message_page(StatusCode::CONFLICT, &error.to_string())
        }
        StartError::Plan(error) => message_page(
            StatusCode::BAD_REQUEST,
            &format!("the sweep plan cannot run: {error}"),
        ),
        error @ StartError::Interrupted { .. } => {
            message_page(StatusCode::SERVICE_UNAVAILABLE, &error.to_string())
        }
    }
}

/// What the default plan would do, and the form that starts it.
fn preview_page(
    preview: &crate::sweep::PlanPreview,
    session: &SessionView,
) -> Response<ResponseBody> {
    let csrf = escape(&session.csrf);
    let mut body = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>tokentap · sweep preview</title>{FORM_STYLE}</head><body><h1>Sweep preview</h1><p>The default plan against the server now. Nothing has started.</p><ul id=\"preview\">"
    );
    for line in preview.lines() {
        let _ = write!(body, "<li>{}</li>", escape(&line));
    }
    body.push_str("</ul>");
    let _ = write!(
        body,
        "<form id=\"confirm\" method=\"post\" action=\"/page/sweep\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><input type=\"hidden\" name=\"action\" value=\"start\">"
    );
    if preview.production_in_flight > 0 {
        let _ = write!(
            body,
            "<p class=\"error\">{} production requests are in flight: drain this replica first, or tick the box to run beside them (they slow down; its cells show the production they ran beside).</p><label><input type=\"checkbox\" name=\"beside_production\" value=\"on\"> Run beside production</label><br>",
            preview.production_in_flight
        );
    }
    body.push_str("<button type=\"submit\">Start this sweep</button> <a href=\"/\">Back to the page</a></form></body></html>\n");
    no_store(respond(StatusCode::OK, "text/html; charset=utf-8", body))
}

/// The value of `name` in an `application/x-www-form-urlencoded` body.
fn form_field(body: &[u8], name: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    text.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then(|| super::query::percent_decode(value))?
    })
}

const FORM_STYLE: &str = "<style>body{font:15px system-ui,sans-serif;margin:40px auto;max-width:420px;padding:0 16px;color:#1f2328}input[type=password]{width:100%;padding:6px;font:inherit;box-sizing:border-box}button{margin-top:12px;padding:6px 16px;font:inherit}.error{color:#cf222e}</style>";

/// The login form, with an optional message above it.
fn login_page(status: StatusCode, message: Option<&str>) -> Response<ResponseBody> {
    let mut body = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>tokentap · log in</title>{FORM_STYLE}</head><body><h1>tokentap</h1><p>The admin page needs the admin token (<code>admin.token</code>).</p>"
    );
    if let Some(message) = message {
        let _ = write!(
            body,
            "<p class=\"error\" id=\"login-error\">{}</p>",
            escape(message)
        );
    }
    body.push_str("<form id=\"login\" method=\"post\" action=\"/login\"><label for=\"token\">Admin token</label><input type=\"password\" id=\"token\" name=\"token\" autocomplete=\"current-password\" required autofocus><button type=\"submit\">Log in</button></form><p class=\"note\">Already logged in? <a href=\"/\">Open the page</a> (a link from another site does not carry the session cookie, which is SameSite=Strict; a link on this page does).</p></body></html>\n");
    no_store(respond(status, "text/html; charset=utf-8", body))
}

/// A short HTML page with a message and a link back to the page.
fn message_page(status: StatusCode, message: &str) -> Response<ResponseBody> {
    let body = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>tokentap</title>{FORM_STYLE}</head><body><p class=\"error\">{}</p><p><a href=\"/\">Back to the page</a></p></body></html>\n",
        escape(message)
    );
    no_store(respond(status, "text/html; charset=utf-8", body))
}

fn no_store(mut response: Response<ResponseBody>) -> Response<ResponseBody> {
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The bar at the top of the page for a logged-in browser: the sweep running now (if any),
/// with how far it is, how long it has waited for production and a Cancel button; else a form
/// that previews a sweep (starting it takes a second, confirming click); and one that logs out.
/// Each form carries the session's CSRF token.
pub fn page_controls(state: &AdminState, session: &SessionView) -> String {
    let csrf = escape(&session.csrf);
    let mut out = String::from("<section id=\"session\" class=\"session\">");
    let running = state
        .sweeps
        .list()
        .into_iter()
        .find(|s| s.state.is_active())
        .and_then(|summary| state.sweeps.get(&summary.id));
    match running {
        Some(running) => {
            let _ = write!(
                out,
                "<p class=\"note\" id=\"sweep-running\">Sweep <a href=\"/sweeps/{id}\">{id}</a>: {line}.</p><form id=\"cancel-sweep\" method=\"post\" action=\"/page/sweep\" style=\"display:inline\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><input type=\"hidden\" name=\"action\" value=\"cancel\"><input type=\"hidden\" name=\"id\" value=\"{id}\"><button type=\"submit\">Cancel the sweep</button></form> ",
                id = escape(&running.id),
                line = escape(&running.progress_line()),
            );
        }
        None => {
            let _ = write!(
                out,
                "<form id=\"preview-sweep\" method=\"post\" action=\"/page/sweep\" style=\"display:inline\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><input type=\"hidden\" name=\"action\" value=\"preview\"><button type=\"submit\">Preview a sweep (default plan)…</button></form> "
            );
        }
    }
    let _ = write!(
        out,
        "<form method=\"post\" action=\"/logout\" style=\"display:inline\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><button type=\"submit\">Log out</button></form></section>"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn sessions_expire_and_are_bounded() {
        let sessions = Sessions::new(Duration::from_secs(60), 2);
        let first = sessions.open().unwrap();
        assert_eq!(first.id.len(), 64);
        assert_ne!(first.id, first.csrf);
        assert_eq!(sessions.find(&first.id).unwrap().csrf, first.csrf);
        tokio::time::advance(Duration::from_secs(1)).await;
        let second = sessions.open().unwrap();
        let third = sessions.open().unwrap();
        assert!(sessions.find(&first.id).is_none(), "the oldest made room");
        assert!(sessions.find(&second.id).is_some());
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(sessions.find(&third.id).is_none(), "expired");
        assert_eq!(sessions.open_count(), 0);
        let fourth = sessions.open().unwrap();
        sessions.close(&fourth.id);
        assert!(sessions.find(&fourth.id).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn failures_slow_an_address_and_memory_is_bounded() {
        let sessions = Sessions::new(Duration::from_secs(60), 2);
        let a = Some(IpAddr::from([127, 0, 0, 2]));
        assert!(sessions.wait_left(a).is_none());
        assert_eq!(sessions.failed(a), Duration::from_secs(1));
        assert!(sessions.wait_left(a).is_some());
        assert!(sessions
            .wait_left(Some(IpAddr::from([127, 0, 0, 3])))
            .is_none());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(sessions.wait_left(a).is_none());
        assert_eq!(sessions.failed(a), Duration::from_secs(2));
        for _ in 0..100 {
            sessions.failed(a);
        }
        assert_eq!(sessions.wait_left(a), Some(MAX_DELAY));
        sessions.succeeded(a);
        assert!(sessions.wait_left(a).is_none());
        for n in 0..(MAX_CLIENTS as u32 + 10) {
            sessions.failed(Some(IpAddr::from(n.to_be_bytes())));
        }
        assert!(lock(&sessions.inner).failures.len() <= MAX_CLIENTS);
        // A full table never makes an address with no failures of its own wait.
        assert!(sessions
            .wait_left(Some(IpAddr::from([10, 9, 8, 7])))
            .is_none());
        // The newest failures are kept, the oldest made room.
        let newest = Some(IpAddr::from((MAX_CLIENTS as u32 + 9).to_be_bytes()));
        assert!(sessions.wait_left(newest).is_some());
        assert!(sessions
            .wait_left(Some(IpAddr::from(0u32.to_be_bytes())))
            .is_none());
    }

    #[test]
    fn form_fields_and_cookies() {
        assert_eq!(
            form_field(b"a=1&token=s%3Dcret+x", "token").as_deref(),
            Some("s=cret x")
        );
        assert_eq!(form_field(b"token", "token").as_deref(), Some(""));
        assert_eq!(form_field(b"token=%zz", "token"), None);
        let request = Request::get("/")
            .header("cookie", "a=b; tokentap_session=abc; c=d")
            .body(())
            .unwrap();
        assert_eq!(cookie_id(&request), Some("abc"));
    }
}
