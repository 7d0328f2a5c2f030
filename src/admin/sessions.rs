//! The browser sessions and the failed-credential record of the admin listener, as data: the
//! session table (`admin.max_sessions` sessions of `admin.session_ttl`, each with its CSRF
//! token), per client address (an IPv6 client by its /64) the failures that make it wait, and
//! one budget of failed checks per second for the whole listener
//! (`admin.max_failed_credentials_per_second`). While an address waits, or once the budget is
//! spent, a credential from it is **not compared at all**, right or wrong (a guesser learns
//! nothing by sending more): [`Sessions::judge`] for bearer tokens, [`Sessions::attempt`] for a
//! login counted before its body arrives. A right credential never clears its address's record
//! (a right token sent from the same host as a guesser would reset the guesser's wait); only time
//! does, and a right login takes back just the failure it was counted as. No HTTP here:
//! `session.rs` serves the login routes and the page's forms with it, and `state.rs` checks
//! credentials against it.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use http::{header, Request};
use ring::rand::{SecureRandom, SystemRandom};
use tokio::time::Instant;

use crate::base::lock::lock;

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

/// The client's address, put in the request's extensions by the admin listener's service.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub IpAddr);

/// Why a login failed, the `reason` label of `tokentap_admin_login_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginFailure {
    /// The token given was not the configured one (or was missing).
    BadToken,
    /// A wrong token that came while its address was still waiting after earlier failures, or
    /// after the listener's budget of failed checks for this second was spent.
    Throttled,
}

/// What counting a credential attempt says: where a wrong credential stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Counted as a failure: the address now waits this long before its next wrong one is
    /// answered 401 rather than 429.
    Counted(Duration),
    /// Too soon: the address is still waiting, or the listener has spent its budget of failed
    /// checks; a wrong credential is answered 429 with this `Retry-After`.
    Throttled(Duration),
}

/// What judging a bearer credential says ([`Sessions::judge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    /// The right credential.
    Right,
    /// Wrong, and recorded: the address now waits this long before its next credential is
    /// compared.
    Wrong(Duration),
    /// Not compared: the address is still waiting, or the listener has spent its budget of
    /// failed checks; answered 429 with this `Retry-After`.
    Throttled(Duration),
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
    /// `retry_at` before the latest failure (what a right login, counted as a failure before
    /// its body came, puts back).
    retry_before: Instant,
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
    /// The listener's budget of failed checks (a token bucket), whatever the address.
    budget: Option<Bucket>,
}

/// A token bucket of `per_second` failed checks a second, at most one second's worth saved.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    per_second: f64,
    tokens: f64,
    filled_at: Instant,
}

impl Bucket {
    fn new(per_second: u32, now: Instant) -> Self {
        let per_second = f64::from(per_second.max(1));
        Self {
            per_second,
            tokens: per_second,
            filled_at: now,
        }
    }

    /// Whether one failure's worth is there, taking nothing; else how long until one is.
    fn available(&mut self, now: Instant) -> Result<(), Duration> {
        self.take(now)?;
        self.tokens += 1.0;
        Ok(())
    }

    /// Puts back one failure's worth taken for what turned out not to be one.
    fn give_back(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.per_second);
    }

    /// Takes one failure's worth; else how long until one is there.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.filled_at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.per_second);
        self.filled_at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - self.tokens) / self.per_second,
            ))
        }
    }
}

/// Who a failure is counted against: an IPv4 address, an IPv6 client's /64 (one machine's
/// usual share: counting each of its 2^64 addresses apart would be no limit), an IPv4-mapped
/// IPv6 address as the IPv4 one.
fn client_key(client: Option<IpAddr>) -> Option<IpAddr> {
    match client? {
        IpAddr::V4(v4) => Some(IpAddr::V4(v4)),
        IpAddr::V6(v6) => Some(match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let [a, b, c, d, ..] = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(a, b, c, d, 0, 0, 0, 0))
            }
        }),
    }
}

/// The browser sessions and the failed-login record of one admin listener.
#[derive(Debug)]
pub struct Sessions {
    ttl: Duration,
    max_sessions: usize,
    /// `admin.max_failed_credentials_per_second`.
    failures_per_second: u32,
    random: SystemRandom,
    inner: Mutex<Inner>,
    /// Credential checks begun ([`Sessions::attempt`] calls), throttled or not.
    attempts: AtomicU64,
}

/// A session found by its cookie.
#[derive(Debug, Clone)]
pub struct SessionView {
    pub id: String,
    /// The session's CSRF token, the hidden field of the page's forms.
    pub csrf: String,
}

impl Sessions {
    pub fn new(ttl: Duration, max_sessions: usize, failures_per_second: u32) -> Self {
        Self {
            ttl,
            max_sessions: max_sessions.max(1),
            failures_per_second: failures_per_second.max(1),
            random: SystemRandom::new(),
            inner: Mutex::default(),
            attempts: AtomicU64::new(0),
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

    /// Credential checks begun since start, throttled or not: a login counts when its head
    /// arrives, before its body (how a caller knows the heads it sent were read).
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::Relaxed)
    }

    /// How long this address must still wait before a wrong credential it sends is answered
    /// 401 rather than 429.
    pub fn wait_left(&self, client: Option<IpAddr>) -> Option<Duration> {
        let now = Instant::now();
        let inner = lock(&self.inner);
        let failures = inner.failures.get(&client_key(client))?;
        let left = failures.retry_at.saturating_duration_since(now);
        (!left.is_zero()).then_some(left)
    }

    /// A bearer credential judged under the throttle: while its address waits, or once the
    /// listener's budget of failed checks for this second is spent, not compared
    /// ([`Judged::Throttled`]); else compared by `is_right`, and a wrong one recorded (the
    /// address waits 1 s, 2 s, … up to [`MAX_DELAY`]). The check, the comparison and the record
    /// are one step: concurrent guesses from one address are compared one at a time.
    pub fn judge(&self, client: Option<IpAddr>, is_right: impl FnOnce() -> bool) -> Judged {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let key = client_key(client);
        let mut inner = lock(&self.inner);
        if let Some(failures) = inner.failures.get(&key) {
            let left = failures.retry_at.saturating_duration_since(now);
            if !left.is_zero() {
                return Judged::Throttled(left);
            }
        }
        let per_second = self.failures_per_second;
        let budget = inner
            .budget
            .get_or_insert_with(|| Bucket::new(per_second, now));
        if let Err(left) = budget.available(now) {
            return Judged::Throttled(left);
        }
        if is_right() {
            return Judged::Right;
        }
        if let Err(left) = budget.take(now) {
            return Judged::Throttled(left);
        }
        Judged::Wrong(Self::record_failure(&mut inner, key, now))
    }

    /// Counts a credential attempt whose credential is not read yet (a login counted before
    /// its body arrives; [`Sessions::forgive_login`] takes it back when it was right): judged as
    /// a wrong one, so while the address still waits, or once the listener's budget is spent, it
    /// is [`Attempt::Throttled`] (not recorded again); else it is recorded and the address waits
    /// 1 s, 2 s, … up to [`MAX_DELAY`].
    pub fn attempt(&self, client: Option<IpAddr>) -> Attempt {
        match self.judge(client, || false) {
            Judged::Wrong(wait) => Attempt::Counted(wait),
            Judged::Throttled(left) => Attempt::Throttled(left),
            // `|| false` is never right.
            Judged::Right => Attempt::Counted(Duration::ZERO),
        }
    }

    /// Records a failure against `key`: how long it must now wait. A full table first
    /// forgets what is past `FORGET_AFTER`, then the entry whose wait ended (or ends) first.
    fn record_failure(inner: &mut Inner, key: Option<IpAddr>, now: Instant) -> Duration {
        if !inner.failures.contains_key(&key) && inner.failures.len() >= MAX_CLIENTS {
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
        let entry = inner.failures.entry(key).or_insert(Failures {
            count: 0,
            retry_at: now,
            retry_before: now,
            serial,
        });
        if entry.retry_at + FORGET_AFTER <= now {
            entry.count = 0;
        }
        entry.serial = serial;
        entry.retry_before = entry.retry_at;
        entry.count = entry.count.saturating_add(1);
        let delay = Duration::from_secs(u64::from(entry.count)).min(MAX_DELAY);
        entry.retry_at = now + delay;
        delay
    }

    /// A login counted by [`Sessions::attempt`] before its body came turned out right: that one
    /// failure is taken back (the address's count and wait as before it), nothing else of the
    /// address's record.
    pub fn forgive_login(&self, client: Option<IpAddr>) {
        let mut inner = lock(&self.inner);
        if let Some(failures) = inner.failures.get_mut(&client_key(client)) {
            failures.count = failures.count.saturating_sub(1);
            failures.retry_at = failures.retry_before;
        }
        if let Some(budget) = inner.budget.as_mut() {
            budget.give_back();
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn sessions_expire_and_are_bounded() {
        let sessions = Sessions::new(Duration::from_secs(60), 2, 10);
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
        // A listener budget out of the way: this test is about the per-address record.
        let sessions = Sessions::new(Duration::from_secs(60), 2, 1_000_000);
        let a = Some(IpAddr::from([127, 0, 0, 2]));
        assert!(sessions.wait_left(a).is_none());
        assert_eq!(
            sessions.attempt(a),
            Attempt::Counted(Duration::from_secs(1))
        );
        assert!(matches!(sessions.attempt(a), Attempt::Throttled(_)));
        assert!(sessions
            .wait_left(Some(IpAddr::from([127, 0, 0, 3])))
            .is_none());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(sessions.wait_left(a).is_none());
        assert_eq!(
            sessions.attempt(a),
            Attempt::Counted(Duration::from_secs(2))
        );
        for _ in 0..100 {
            tokio::time::advance(MAX_DELAY).await;
            sessions.attempt(a);
        }
        assert_eq!(sessions.wait_left(a), Some(MAX_DELAY));
        // A right login takes back the one failure it was counted as, not the record.
        sessions.forgive_login(a);
        tokio::time::advance(MAX_DELAY).await;
        assert_eq!(
            sessions.attempt(a),
            Attempt::Counted(MAX_DELAY),
            "the address's record outlives a right login"
        );
        for n in 0..(MAX_CLIENTS as u32 + 10) {
            sessions.attempt(Some(IpAddr::from(n.to_be_bytes())));
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

    #[tokio::test(start_paused = true)]
    async fn the_listener_budget_bounds_failures_from_any_number_of_addresses() {
        let sessions = Sessions::new(Duration::from_secs(60), 2, 10);
        // 4,000 addresses, one wrong guess each, all within one second.
        let mut counted = 0;
        for n in 0..4_000u32 {
            if n % 400 == 0 && n > 0 {
                tokio::time::advance(Duration::from_millis(100)).await;
            }
            let from = Some(IpAddr::from((0x7f10_0000 + n).to_be_bytes()));
            match sessions.attempt(from) {
                Attempt::Counted(_) => counted += 1,
                Attempt::Throttled(left) => assert!(left <= Duration::from_millis(100)),
            }
        }
        // One second's worth at the start, then 10 a second over the 0.9 s that passed.
        assert!((10..=19).contains(&counted), "{counted} failures counted");
        // The budget fills again.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(matches!(
            sessions.attempt(Some(IpAddr::from([127, 9, 9, 9]))),
            Attempt::Counted(_)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn an_ipv6_client_is_counted_by_its_64() {
        let sessions = Sessions::new(Duration::from_secs(60), 2, 1_000);
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let same_64: IpAddr = "2001:db8:1:2:ffff:ffff:ffff:ffff".parse().unwrap();
        let other_64: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert!(matches!(sessions.attempt(Some(one)), Attempt::Counted(_)));
        assert!(matches!(
            sessions.attempt(Some(same_64)),
            Attempt::Throttled(_)
        ));
        assert!(sessions.wait_left(Some(other_64)).is_none());
        // An IPv4-mapped address is its IPv4 address.
        let v4: IpAddr = "127.0.0.5".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.5".parse().unwrap();
        sessions.attempt(Some(v4));
        assert!(sessions.wait_left(Some(mapped)).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_address_is_not_compared_and_a_right_token_clears_nothing() {
        let sessions = Sessions::new(Duration::from_secs(60), 2, 1_000);
        let guesser = Some(IpAddr::from([127, 0, 0, 9]));
        let mut compared = 0;
        assert_eq!(
            sessions.judge(guesser, || {
                compared += 1;
                false
            }),
            Judged::Wrong(Duration::from_secs(1))
        );
        // 10,000 more guesses within the wait: none compared, the right one neither.
        for _ in 0..10_000 {
            assert!(matches!(
                sessions.judge(guesser, || {
                    compared += 1;
                    false
                }),
                Judged::Throttled(_)
            ));
        }
        assert!(matches!(
            sessions.judge(guesser, || {
                compared += 1;
                true
            }),
            Judged::Throttled(_)
        ));
        assert_eq!(compared, 1);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(sessions.judge(guesser, || true), Judged::Right);
        // The right token forgot nothing: the next wrong one waits longer.
        assert_eq!(
            sessions.judge(guesser, || false),
            Judged::Wrong(Duration::from_secs(2))
        );
        // Another address is compared as usual.
        assert_eq!(
            sessions.judge(Some(IpAddr::from([127, 0, 0, 10])), || true),
            Judged::Right
        );
    }
}
