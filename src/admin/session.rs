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
//! | `POST /page/sweep` | form field `csrf` (the session's own) and `action`: `preview` shows the plan of the fields `contexts`, `concurrency`, `cell_duration` and `like_production` (empty: the default plan's), `start` starts that plan (as `POST /sweeps` would), `cancel` cancels the running sweep |
//!
//! The cookie (`tokentap_session`) is `HttpOnly; SameSite=Strict; Path=/`, host-only (no
//! `Domain`), and carries a 256-bit random id from ring's `SystemRandom`; the token itself is
//! never in a URL, a cookie or a log. The admin listener speaks plain HTTP, so the cookie is not
//! `Secure` (a browser would drop it). Each session has its own CSRF token, a hidden field of the
//! page's forms: with `SameSite=Strict` another site cannot make the browser send the cookie,
//! and without the field a forged form is refused anyway. Sessions last `admin.session_ttl`
//! (12 h by default) and at most `admin.max_sessions` are kept (a login past it ends the
//! oldest). Failed logins are counted (`tokentap_admin_login_failures_total{reason}`) and
//! slowed per client address (an IPv6 client by its /64), each attempt counted before its body
//! is read: after the n-th failure in a row that address waits n seconds (at most
//! [`MAX_DELAY`]), and a wrong token it sends meanwhile gets 429 with `Retry-After`; so does
//! any wrong one past the listener's budget (`admin.max_failed_credentials_per_second`). The
//! right token always logs in. At most [`MAX_CLIENTS`] addresses are tracked (the oldest
//! waits make room). Sessions live in memory: a restart logs everyone out.

use std::fmt::Write as _;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;

use super::state::{constant_time_eq, json_error, read_body, respond, AdminState, MAX_FORM_BYTES};
pub use super::state::{
    cookie_id, too_many, Attempt, ClientAddr, LoginFailure, SessionView, Sessions, COOKIE,
    MAX_CLIENTS, MAX_DELAY,
};
use crate::base::escape::xml_escape as escape;
use crate::proxy::body::ResponseBody;
use crate::proxy::BoxError;

/// The live session this request's cookie names, when a token is configured.
pub fn session_of<B>(state: &AdminState, request: &Request<B>) -> Option<SessionView> {
    state.session_of(request)
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
    // Counted as a failure before the body is awaited: logins whose bodies come late cannot all
    // be checked as first attempts. While the address waits, the token is not even read (a
    // guesser learns nothing by sending more); a right one takes back its own failure below.
    let wait = match state.sessions.attempt(client) {
        Attempt::Throttled(left) => {
            state
                .metrics
                .count_login_failure(LoginFailure::Throttled.label());
            let seconds = left.as_secs() + u64::from(left.subsec_nanos() > 0);
            let mut response = login_page(
                StatusCode::TOO_MANY_REQUESTS,
                Some(&format!(
                    "Too many failed logins: try again in {seconds} s."
                )),
            );
            if let Ok(value) = HeaderValue::try_from(seconds.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            // Its body is never read: the connection goes with the answer.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return response;
        }
        Attempt::Counted(wait) => wait,
    };
    let body = match state.read_form(request, "the login form").await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let given = form_field(&body, "token").unwrap_or_default();
    if !constant_time_eq(given.as_bytes(), token.as_bytes()) {
        state
            .metrics
            .count_login_failure(LoginFailure::BadToken.label());
        tracing::warn!(client = ?client, wait_s = wait.as_secs(), "failed admin login");
        return login_page(
            StatusCode::UNAUTHORIZED,
            Some("That is not the admin token."),
        );
    }
    state.sessions.forgive_login(client);
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
/// plan of the form's fields would do and asks for a confirmation; `action=start` (that
/// confirmation, carrying the same fields) starts it, beside production only when its box was
/// ticked; `action=cancel` cancels the running sweep. A form without an action previews:
/// nothing starts from one click.
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
    if action == "cancel" {
        let id = form_field(&body, "id").unwrap_or_default();
        return match state.sweeps.cancel(&id) {
            Ok(()) => see_other("/"),
            Err(error) => message_page(StatusCode::CONFLICT, &error.to_string()),
        };
    }
    let fields = match PlanFields::read(&body) {
        Ok(fields) => fields,
        Err(message) => return message_page(StatusCode::BAD_REQUEST, &message),
    };
    if action == "start" {
        let request = crate::sweep::SweepRequest {
            beside_production: form_field(&body, "beside_production")
                .map(|v| v == "on" || v == "true"),
            ..fields.request()
        };
        return match state.sweeps.start(request).await {
            Ok(_) => see_other("/"),
            Err(error) => start_refused(error),
        };
    }
    match state.sweeps.preview(&fields.request()).await {
        Ok(preview) => preview_page(&preview, &fields, &session),
        Err(error) => start_refused(error),
    }
}

/// The plan fields of the page's sweep forms, as typed: contexts (`8K, 32K`), concurrency
/// levels (`1, 4, 16`), the cell duration (`10s`) and whether the cells are shaped like
/// production. Empty fields keep the default plan's; the same fields go from the preview to
/// the start, so what starts is what was shown.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlanFields {
    pub contexts: String,
    pub concurrency: String,
    pub cell_duration: String,
    pub like_production: bool,
}

impl PlanFields {
    /// The fields of a form body; a concurrency that is not a list of positive integers is
    /// refused with the reason (contexts and the cell duration are checked when the plan is
    /// resolved).
    pub fn read(body: &[u8]) -> Result<PlanFields, String> {
        let fields = PlanFields {
            contexts: form_field(body, "contexts")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            concurrency: form_field(body, "concurrency")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            cell_duration: form_field(body, "cell_duration")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            like_production: form_field(body, "like_production")
                .is_some_and(|v| v == "on" || v == "true"),
        };
        fields.levels()?;
        Ok(fields)
    }

    fn levels(&self) -> Result<Option<Vec<u32>>, String> {
        let items = list_items(&self.concurrency);
        if items.is_empty() {
            return Ok(None);
        }
        items
            .iter()
            .map(|item| match item.parse::<u32>() {
                Ok(level) if level > 0 => Ok(level),
                _ => Err(format!(
                    "concurrency: {item:?} is not a positive whole number (write levels like 1, 4, 16)"
                )),
            })
            .collect::<Result<Vec<u32>, String>>()
            .map(Some)
    }

    /// The sweep these fields ask for: the default plan with the fields that were filled in.
    pub fn request(&self) -> crate::sweep::SweepRequest {
        let contexts = list_items(&self.contexts);
        crate::sweep::SweepRequest {
            contexts: (!contexts.is_empty()).then(|| {
                contexts
                    .into_iter()
                    .map(|c| crate::sweep::request::TokensValue::Label(c.to_owned()))
                    .collect()
            }),
            concurrency: self.levels().ok().flatten(),
            cell_duration: (!self.cell_duration.is_empty())
                .then(|| crate::sweep::request::DurationValue::Text(self.cell_duration.clone())),
            // Unticked keeps the default (the seed method; a capacity search decides itself).
            like_production: self.like_production.then_some(true),
            ..crate::sweep::SweepRequest::default()
        }
    }

    /// The fields as inputs of a form: `editable` text boxes and a checkbox, or hidden inputs
    /// carrying exactly what was previewed.
    fn inputs(&self, editable: bool) -> String {
        if !editable {
            let mut out = format!(
                "<input type=\"hidden\" name=\"contexts\" value=\"{}\"><input type=\"hidden\" name=\"concurrency\" value=\"{}\"><input type=\"hidden\" name=\"cell_duration\" value=\"{}\">",
                escape(&self.contexts),
                escape(&self.concurrency),
                escape(&self.cell_duration)
            );
            if self.like_production {
                out.push_str("<input type=\"hidden\" name=\"like_production\" value=\"on\">");
            }
            return out;
        }
        format!(
            "<label>Contexts <input type=\"text\" name=\"contexts\" value=\"{}\" placeholder=\"default ladder, e.g. 8K, 32K\"></label> <label>Concurrency <input type=\"text\" name=\"concurrency\" value=\"{}\" placeholder=\"default 1, 2, 4 … 128\"></label> <label>Cell duration <input type=\"text\" name=\"cell_duration\" value=\"{}\" placeholder=\"default, e.g. 10s\"></label> <label><input type=\"checkbox\" name=\"like_production\" value=\"on\"{}> Like production</label>",
            escape(&self.contexts),
            escape(&self.concurrency),
            escape(&self.cell_duration),
            if self.like_production { " checked" } else { "" }
        )
    }
}

/// The plan fields and a button that previews them (nothing starts from it): the preview
/// page's "change the plan" form. (The admin page itself has only the button: it reloads
/// every few seconds, which would wipe what was typed.)
fn preview_form(csrf: &str, fields: &PlanFields) -> String {
    format!(
        "<form id=\"preview-sweep\" class=\"sweep-form\" method=\"post\" action=\"/page/sweep\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"action\" value=\"preview\">{}<button type=\"submit\">Preview a sweep…</button></form>",
        escape(csrf),
        fields.inputs(true)
    )
}

/// `8K, 32K` or `1 4 16` as items.
fn list_items(text: &str) -> Vec<&str> {
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|item| !item.is_empty())
        .collect()
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

/// What the plan of `fields` would do, each skipped cell named; the form that starts exactly
/// that plan; and the fields again, to change and preview anew.
fn preview_page(
    preview: &crate::sweep::PlanPreview,
    fields: &PlanFields,
    session: &SessionView,
) -> Response<ResponseBody> {
    let csrf = escape(&session.csrf);
    let what = if *fields == PlanFields::default() {
        "The default plan"
    } else {
        "The plan of these fields"
    };
    let mut body = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>tokentap · sweep preview</title>{FORM_STYLE}</head><body><h1>Sweep preview</h1><p>{what} against the server now. Nothing has started.</p><ul id=\"preview\">"
    );
    for line in preview.lines() {
        let _ = write!(body, "<li>{}</li>", escape(&line));
    }
    body.push_str("</ul><ul id=\"preview-cells\" class=\"cells\">");
    for cell in &preview.cells {
        let label = crate::matrix::units::context_label(cell.context_tokens);
        let _ = write!(
            body,
            "<li data-context=\"{}\" data-concurrency=\"{}\" data-runs=\"{}\">{} × {}{}</li>",
            escape(&label),
            cell.concurrency,
            if cell.runs { "yes" } else { "no" },
            escape(&label),
            cell.concurrency,
            if cell.runs {
                ""
            } else {
                ": skipped, over the KV budget"
            }
        );
    }
    body.push_str("</ul>");
    let _ = write!(
        body,
        "<form id=\"confirm\" method=\"post\" action=\"/page/sweep\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><input type=\"hidden\" name=\"action\" value=\"start\">{}",
        fields.inputs(false)
    );
    if preview.production_in_flight > 0 {
        let _ = write!(
            body,
            "<p class=\"error\">{} production requests are in flight: drain this replica first, or tick the box to run beside them (they slow down; its cells show the production they ran beside). The command line's flag is <code>--beside-production</code>.</p><label><input type=\"checkbox\" name=\"beside_production\" value=\"on\"> {}</label><br>",
            preview.production_in_flight,
            escape(crate::sweep::BESIDE_PRODUCTION_BOX)
        );
    }
    body.push_str("<button type=\"submit\">Start this sweep</button> <a href=\"/\">Back to the page</a></form>");
    let _ = write!(
        body,
        "<h2>Change the plan</h2>{}",
        preview_form(&session.csrf, fields).replace("Preview a sweep…", "Preview again")
    );
    body.push_str("</body></html>\n");
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

const FORM_STYLE: &str = "<style>body{font:15px system-ui,sans-serif;margin:40px auto;max-width:640px;padding:0 16px;color:#1f2328}input[type=password]{width:100%;padding:6px;font:inherit;box-sizing:border-box}input[type=text]{width:12em;padding:4px;font:inherit}label{margin-right:12px;white-space:nowrap}button{margin-top:12px;padding:6px 16px;font:inherit}.error{color:#cf222e}ul.cells{columns:3;font-size:13px}li[data-runs=no]{color:#8a4b00}h2{font-size:17px;margin-top:28px}</style>";

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

#[cfg(test)]
mod tests {
    use super::*;

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
