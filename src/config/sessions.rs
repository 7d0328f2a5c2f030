//! `[sessions]`: which request fields name a conversation, whether one is inferred from the
//! prompt, and how many are kept (`meter::conversation`, docs/metrics.md "Sessions and turns").

use std::time::Duration;

use http::HeaderName;

use super::error::{ConfigError, Origins};
use super::raw::RawSessions;
use crate::meter::conversation::ConversationLimits;

/// The body fields a session key can be read from: read in the one walk over the body's top
/// level that reads the request's other facts.
pub const BODY_KEYS: [&str; 3] = ["prompt_cache_key", "session_id", "user"];

/// Where a session key is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionKey {
    Header(HeaderName),
    /// One of [`BODY_KEYS`], by index.
    Body(usize),
}

/// `[sessions]`.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionsConfig {
    /// Off: no request is a turn of anything (no session series, no turn in records).
    pub enabled: bool,
    /// The first of these a request carries is its session key.
    pub keys: Vec<SessionKey>,
    pub limits: ConversationLimits,
}

impl SessionsConfig {
    pub(super) fn from_raw(raw: RawSessions, origins: &Origins) -> Result<Self, ConfigError> {
        let mut keys = Vec::with_capacity(raw.keys.len());
        for key in &raw.keys {
            let parsed = match key.split_once(':') {
                Some(("header", name)) => HeaderName::from_bytes(name.trim().as_bytes())
                    .ok()
                    .map(SessionKey::Header),
                Some(("body", field)) => BODY_KEYS
                    .iter()
                    .position(|known| *known == field.trim())
                    .map(SessionKey::Body),
                _ => None,
            };
            let Some(parsed) = parsed else {
                return Err(origins.error(
                    "sessions.keys",
                    format!(
                        "`{key}` is not a session key: use `header:<name>` or `body:<field>` \
                         with a field among {}",
                        BODY_KEYS.join(", ")
                    ),
                ));
            };
            keys.push(parsed);
        }
        let max_sessions = usize::try_from(raw.max_sessions).unwrap_or(usize::MAX);
        if max_sessions < 4 {
            return Err(origins.error("sessions.max_sessions", "must be at least 4"));
        }
        if raw.idle < Duration::from_secs(1) {
            return Err(origins.error("sessions.idle", "must be at least 1s"));
        }
        Ok(SessionsConfig {
            enabled: raw.enabled,
            keys,
            limits: ConversationLimits {
                max_sessions,
                idle: raw.idle,
                infer: raw.infer,
            },
        })
    }
}
