//! Who opened each engine session (sglang's `/open_session`), so that another caller cannot
//! close it or continue it. sglang closes a session for whoever names its id
//! (`/close_session`), and a `/generate` request with `session_params.id` is built on that
//! session's prompts and answers: knowing an id is enough to end another client's session or
//! to read its context. tokentap sees every session opened through it: the id is read from the
//! open answer as it passes and kept with the caller that asked, and a close or a continuation
//! of a session that another caller opened is refused (403, `fault="session_refused"`).
//!
//! The caller is the request's tenant when `[tenants]` names one, else its credential (the
//! `Authorization` header, else `x-api-key`): only a SHA-256 of either is kept, never the value.
//! A request with neither is no caller tokentap can tell apart from another: a session it
//! opens is not remembered, and it may close only sessions tokentap never saw opened. A
//! session tokentap did not see opened (before it started, directly at the engine, or one it
//! forgot) is forwarded whoever names it: failing closed there would refuse real clients'
//! own closes after a restart.
//!
//! Bounded: at most [`MAX_SESSIONS`] sessions, each a fixed 80 bytes and the map's overhead
//! whatever its id's length (the id is kept as its hash too), forgotten when closed or after
//! [`IDLE_FOR`] without a close or a continuation by its owner. A session opened while the table
//! is full is forwarded unremembered and counted (`fault="session_untracked"`). Pure state: the
//! phases of `Proxy::handle` ask it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use http::{header, HeaderMap};
use tokio::time::Instant;

use super::tenants::Tenants;
use crate::base::engine::Sessions;
use crate::base::lock::lock;
use crate::config::OTHER_TENANT;
use crate::stream::json;

/// Most sessions remembered at once (about 10 MiB with the map's overhead).
pub const MAX_SESSIONS: usize = 65_536;

/// How long a session is remembered after it was opened or its owner last continued it. sglang
/// keeps a session until it is closed, or until its own `timeout` (the open request's, none by
/// default) passes without a request.
pub const IDLE_FOR: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest open answer read for its session id (sglang's is a JSON string of 34 bytes, or
/// the id the client chose).
pub const MAX_OPEN_ANSWER: usize = 4096;

type Digest = [u8; 32];

/// Who asked: a hash of the tenant or of the credential, never the value itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller(Digest);

impl Caller {
    /// The caller of a request with these headers: its tenant when `[tenants]` counts it under
    /// one it names (not `other`), else its credential; `None` for a request with neither.
    pub fn of(headers: &HeaderMap, tenants: &Tenants) -> Option<Caller> {
        if let Some(tenant) = tenants.of(headers).filter(|t| &**t != OTHER_TENANT) {
            return Some(Caller(digest(b"tenant\0", tenant.as_bytes())));
        }
        let credential = headers
            .get(header::AUTHORIZATION)
            .or_else(|| headers.get("x-api-key"))
            .map(|value| value.as_bytes().trim_ascii())
            .filter(|value| !value.is_empty())?;
        Some(Caller(digest(b"credential\0", credential)))
    }
}

fn digest(domain: &[u8], value: &[u8]) -> Digest {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(domain);
    context.update(value);
    let mut out = [0u8; 32];
    out.copy_from_slice(context.finish().as_ref());
    out
}

/// A session's key: its upstream and its id, hashed (ids are the engine's per server).
fn key(upstream: &str, id: &str) -> Digest {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(upstream.as_bytes());
    context.update(b"\0");
    context.update(id.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(context.finish().as_ref());
    out
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    owner: Caller,
    used: Instant,
}

/// What a request naming a session is to the session's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// tokentap did not see it opened (or has forgotten it): forwarded.
    Unseen,
    /// The caller opened it.
    Own,
    /// Another caller opened it (or the request is no caller and it was opened by one).
    Other,
}

/// Whether a session was remembered when it was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remembered {
    Yes,
    /// The table was full even after the idle sessions were forgotten.
    Full,
}

/// The sessions opened through one proxy and who opened each.
#[derive(Debug)]
pub struct SessionOwners {
    table: Mutex<HashMap<Digest, Entry>>,
    /// The table's size, read without the lock by the requests that might name a session.
    len: AtomicUsize,
    max: usize,
}

impl Default for SessionOwners {
    fn default() -> Self {
        Self::with_capacity(MAX_SESSIONS)
    }
}

impl SessionOwners {
    pub fn with_capacity(max: usize) -> Self {
        Self {
            table: Mutex::new(HashMap::new()),
            len: AtomicUsize::new(0),
            max,
        }
    }

    /// No session is remembered: a generation request need not be read for one.
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    /// Sessions remembered now.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// `owner` opened session `id` on `upstream` (the engine said so): remembered, replacing
    /// whoever had that id before (the engine refuses to open an id still open, so the earlier
    /// one was closed or timed out there).
    pub fn opened(&self, upstream: &str, id: &str, owner: Caller, now: Instant) -> Remembered {
        let mut table = lock(&self.table);
        let key = key(upstream, id);
        if table.len() >= self.max && !table.contains_key(&key) {
            table.retain(|_, entry| now.saturating_duration_since(entry.used) < IDLE_FOR);
            if table.len() >= self.max {
                self.len.store(table.len(), Ordering::Relaxed);
                return Remembered::Full;
            }
        }
        table.insert(key, Entry { owner, used: now });
        self.len.store(table.len(), Ordering::Relaxed);
        Remembered::Yes
    }

    /// What session `id` on `upstream` is to `caller`; the owner's use keeps it remembered.
    pub fn naming(&self, upstream: &str, id: &str, caller: Option<Caller>, now: Instant) -> Naming {
        let mut table = lock(&self.table);
        let key = key(upstream, id);
        let Some(entry) = table.get_mut(&key) else {
            return Naming::Unseen;
        };
        if now.saturating_duration_since(entry.used) >= IDLE_FOR {
            table.remove(&key);
            self.len.store(table.len(), Ordering::Relaxed);
            return Naming::Unseen;
        }
        if caller == Some(entry.owner) {
            entry.used = now;
            Naming::Own
        } else {
            Naming::Other
        }
    }

    /// Session `id` on `upstream` was closed: forgotten.
    pub fn closed(&self, upstream: &str, id: &str) {
        let mut table = lock(&self.table);
        table.remove(&key(upstream, id));
        self.len.store(table.len(), Ordering::Relaxed);
    }
}

/// A request body's session id as the engine reads it: a string member `field` of the
/// top-level object (names decoded, the last of a repeated one, as Python's `json` reads
/// them). `Ok(None)` when it names none (the member is absent, or not a string: the engine
/// takes no session from it); `Err` when the body is not one whole JSON value this reader can
/// read, so it cannot tell what the engine would see.
pub fn close_id(body: &[u8], field: &str) -> Result<Option<String>, &'static str> {
    let start = whole(body)?;
    Ok(json::get(body, start, field.as_bytes()).and_then(|span| string_at(body, span)))
}

/// The session a generation request continues (`session_params.id`, at the top of the body or
/// in its `parameters`), read as [`close_id`] reads one.
pub fn continued_id(body: &[u8], sessions: &Sessions) -> Result<Option<String>, &'static str> {
    let start = whole(body)?;
    let params = |at: usize| {
        json::get(body, at, sessions.params_field.as_bytes())
            .and_then(|params| json::get(body, params.start, sessions.params_id_field.as_bytes()))
            .and_then(|span| string_at(body, span))
    };
    Ok(params(start).or_else(|| {
        json::get(body, start, b"parameters").and_then(|parameters| params(parameters.start))
    }))
}

/// The session id of an open answer: a JSON string (sglang answers the id so), else `None`.
pub fn opened_id(answer: &[u8]) -> Option<String> {
    serde_json::from_slice::<String>(answer)
        .ok()
        .filter(|id| !id.is_empty())
}

/// Where the body's one JSON value starts, or why it cannot be read.
fn whole(body: &[u8]) -> Result<usize, &'static str> {
    let start = json::skip_ws(body, 0);
    let ends =
        json::value_end(body, start).is_some_and(|end| json::skip_ws(body, end) == body.len());
    if ends {
        Ok(start)
    } else {
        Err("its body is not one JSON value tokentap can read, so it cannot tell which session it names")
    }
}

/// The string at `span`, its escapes decoded; `None` if it is not a string.
fn string_at(body: &[u8], span: json::Span) -> Option<String> {
    let raw = span.bytes(body);
    if raw.first() != Some(&b'"') {
        return None;
    }
    serde_json::from_slice::<String>(raw).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigLoader;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    fn tenants(toml: &str) -> Tenants {
        let config = ConfigLoader::new()
            .text(toml, "t.toml")
            .unwrap()
            .load()
            .unwrap();
        Tenants::new(config.tenants)
    }

    const SGLANG: Sessions = Sessions {
        open: "/open_session",
        close: "/close_session",
        close_id_field: "session_id",
        params_field: "session_params",
        params_id_field: "id",
        params_routes: &["/generate"],
    };

    #[test]
    fn the_caller_is_the_named_tenant_else_the_credential_else_none() {
        let off = Tenants::default();
        let a = Caller::of(&headers(&[("authorization", "Bearer sk-a")]), &off);
        let b = Caller::of(&headers(&[("authorization", "Bearer sk-b")]), &off);
        let a_key = Caller::of(&headers(&[("x-api-key", "sk-a")]), &off);
        assert!(a.is_some() && a != b && a != a_key);
        assert_eq!(
            a,
            Caller::of(&headers(&[("authorization", " Bearer sk-a ")]), &off)
        );
        assert_eq!(Caller::of(&HeaderMap::new(), &off), None);
        // The credential's value is not kept: only its hash.
        let shown = format!("{a:?}");
        assert!(!shown.contains("sk-a"), "{shown}");

        let on = tenants("[tenants]\nheader = \"x-tenant\"\nallow = [\"search\", \"chat\"]\n");
        let search_1 = Caller::of(
            &headers(&[("x-tenant", "search"), ("authorization", "Bearer 1")]),
            &on,
        );
        let search_2 = Caller::of(
            &headers(&[("x-tenant", "search"), ("authorization", "Bearer 2")]),
            &on,
        );
        assert_eq!(search_1, search_2, "one tenant, one caller");
        // `other` is everyone unnamed: the credential tells them apart.
        let other_1 = Caller::of(&headers(&[("authorization", "Bearer 1")]), &on);
        let other_2 = Caller::of(&headers(&[("authorization", "Bearer 2")]), &on);
        assert_ne!(other_1, other_2);
        assert_eq!(Caller::of(&headers(&[("x-tenant", "nobody")]), &on), None);
    }

    #[tokio::test(start_paused = true)]
    async fn owners_close_and_continue_their_own_and_nothing_else() {
        let owners = SessionOwners::default();
        let off = Tenants::default();
        let a = Caller::of(&headers(&[("authorization", "Bearer a")]), &off);
        let b = Caller::of(&headers(&[("authorization", "Bearer b")]), &off);
        let now = Instant::now();
        assert!(owners.is_empty());
        assert_eq!(
            owners.opened("default", "s1", a.unwrap(), now),
            Remembered::Yes
        );
        assert_eq!(owners.naming("default", "s1", a, now), Naming::Own);
        assert_eq!(owners.naming("default", "s1", b, now), Naming::Other);
        assert_eq!(owners.naming("default", "s1", None, now), Naming::Other);
        // Ids are the engine's per server.
        assert_eq!(owners.naming("other", "s1", b, now), Naming::Unseen);
        assert_eq!(owners.naming("default", "s2", b, now), Naming::Unseen);
        owners.closed("default", "s1");
        assert_eq!(owners.naming("default", "s1", b, now), Naming::Unseen);
        assert!(owners.is_empty());

        // Forgotten after IDLE_FOR without its owner's use; each use keeps it.
        owners.opened("default", "s3", a.unwrap(), now);
        let later = now + IDLE_FOR - Duration::from_secs(1);
        assert_eq!(owners.naming("default", "s3", a, later), Naming::Own);
        assert_eq!(
            owners.naming(
                "default",
                "s3",
                b,
                later + IDLE_FOR - Duration::from_secs(1)
            ),
            Naming::Other
        );
        assert_eq!(
            owners.naming("default", "s3", b, later + IDLE_FOR),
            Naming::Unseen
        );
        assert_eq!(owners.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_is_bounded_and_idle_sessions_make_room() {
        let owners = SessionOwners::with_capacity(2);
        let a = Caller([1; 32]);
        let now = Instant::now();
        assert_eq!(owners.opened("u", "1", a, now), Remembered::Yes);
        assert_eq!(owners.opened("u", "2", a, now), Remembered::Yes);
        assert_eq!(owners.opened("u", "3", a, now), Remembered::Full);
        assert_eq!(owners.len(), 2);
        // Opened again (a new owner): the same slot.
        assert_eq!(
            owners.opened("u", "2", Caller([2; 32]), now),
            Remembered::Yes
        );
        assert_eq!(owners.opened("u", "3", a, now + IDLE_FOR), Remembered::Yes);
        assert_eq!(owners.len(), 1);
        // An id of any length costs the same.
        let long = "x".repeat(1 << 20);
        assert_eq!(
            owners.opened("u", &long, a, now + IDLE_FOR),
            Remembered::Yes
        );
    }

    #[test]
    fn ids_are_read_as_the_engine_reads_them() {
        assert_eq!(
            close_id(br#"{"session_id": "abc"}"#, "session_id"),
            Ok(Some("abc".into()))
        );
        assert_eq!(
            close_id(
                br#"{"session_id":"x","session\u005fid":"a\u0062c"}"#,
                "session_id"
            ),
            Ok(Some("abc".into())),
            "the last, decoded"
        );
        assert_eq!(close_id(br#"{"session_id": 7}"#, "session_id"), Ok(None));
        assert_eq!(close_id(b"{}", "session_id"), Ok(None));
        assert!(close_id(br#"{"session_id": "abc""#, "session_id").is_err());
        assert_eq!(
            continued_id(
                br#"{"text":"hi","session_params":{"id":"s","rid":null}}"#,
                &SGLANG
            ),
            Ok(Some("s".into()))
        );
        assert_eq!(
            continued_id(
                br#"{"instances":[],"parameters":{"session_params":{"id":"v"}}}"#,
                &SGLANG
            ),
            Ok(Some("v".into()))
        );
        assert_eq!(
            continued_id(br#"{"text":"session_params id"}"#, &SGLANG),
            Ok(None)
        );
        assert_eq!(opened_id(br#""9f0c""#), Some("9f0c".into()));
        assert_eq!(opened_id(br#"{"error":"x"}"#), None);
        assert_eq!(opened_id(br#""""#), None);
    }
}
