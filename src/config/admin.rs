//! `[admin]`: the admin listener, its token and its browser sessions.

use std::net::SocketAddr;
use std::time::Duration;

use super::error::{ConfigError, Origins};
use super::raw::RawAdmin;

#[derive(Debug, Clone, PartialEq)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// Bearer token; required when the admin listener is not on loopback, and for sweeps.
    pub token: Option<String>,
    /// Most connections open at once on the admin listener.
    pub max_connections: usize,
    /// How long a browser session (`POST /login`) lasts.
    pub session_ttl: Duration,
    /// Most browser sessions kept at once; a login past it ends the oldest.
    pub max_sessions: usize,
    /// Without a token, the `Host` names (besides loopback names and addresses) the admin
    /// answers to (lower case, without a port): a page elsewhere cannot reach the listener
    /// through a name that resolves to loopback (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Wrong bearer tokens and logins checked per second on the whole listener, whatever the
    /// address; past it a wrong one gets 429 (a right one is always admitted).
    pub max_failed_credentials_per_second: u32,
}

/// The shortest admin token accepted: with guesses throttled to about one a second per address
/// and `admin.max_failed_credentials_per_second` in all, 16 characters of any alphabet are out of
/// reach; `change-me`, `pin1234` or a word are not.
pub const MIN_TOKEN_CHARS: usize = 16;

impl AdminConfig {
    pub(super) fn from_raw(raw: RawAdmin, origins: &Origins) -> Result<Self, ConfigError> {
        let admin = AdminConfig {
            listen: raw.listen,
            token: raw.token.filter(|t| !t.is_empty()),
            max_connections: origins.nonzero("admin.max_connections", raw.max_connections)?,
            session_ttl: raw.session_ttl,
            max_sessions: origins.nonzero("admin.max_sessions", raw.max_sessions)?,
            max_failed_credentials_per_second: u32::try_from(origins.nonzero(
                "admin.max_failed_credentials_per_second",
                raw.max_failed_credentials_per_second,
            )?)
            .unwrap_or(u32::MAX),
            allowed_hosts: raw
                .allowed_hosts
                .iter()
                .map(|host| host.trim().to_ascii_lowercase())
                .collect(),
        };
        if let Some(bad) = admin
            .allowed_hosts
            .iter()
            .find(|host| host.is_empty() || host.contains(['/', ' ', '@']))
        {
            return Err(origins.error(
                "admin.allowed_hosts",
                format!("`{bad}` is not a host name or address (write names without a scheme or path, e.g. \"tokentap.internal\")"),
            ));
        }
        if let Some(token) = &admin.token {
            if token.chars().count() < MIN_TOKEN_CHARS {
                return Err(origins.error(
                    "admin.token",
                    format!(
                        "a token of {} characters is guessable: it needs at least {MIN_TOKEN_CHARS} (make one with `openssl rand -hex 24`)",
                        token.chars().count()
                    ),
                ));
            }
        }
        origins.positive("admin.session_ttl", admin.session_ttl)?;
        if !admin.listen.ip().is_loopback() && admin.token.is_none() {
            return Err(origins.error(
                "admin.token",
                format!(
                    "the admin listener {} is not on loopback, so it needs a bearer token (set admin.token or TOKENTAP_ADMIN__TOKEN)",
                    admin.listen
                ),
            ));
        }
        Ok(admin)
    }
}
