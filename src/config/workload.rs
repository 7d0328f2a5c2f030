//! `[workload]`: the opt-in capture of request shapes for replay, its bounds and its salt.

use std::time::Duration;

use super::error::{ConfigError, Origins};
use super::raw::RawWorkload;

/// `[workload]`: the opt-in capture of request shapes for replay.
#[derive(Clone, PartialEq)]
pub struct WorkloadConfig {
    /// Keep one shape row per production request (never text).
    pub capture: bool,
    /// Most captured requests kept; the oldest go first.
    pub max_requests: u64,
    /// Captured requests older than this are deleted; zero keeps them until `max_requests`.
    pub max_age: Duration,
    /// Secret the prefix fingerprints are keyed with; `None`: a random one per process.
    pub salt: Option<String>,
    /// Most `GET /workload` exports running at once; one more is answered 503.
    pub max_exports: usize,
}

impl std::fmt::Debug for WorkloadConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The salt is a secret: never logged.
        f.debug_struct("WorkloadConfig")
            .field("capture", &self.capture)
            .field("max_requests", &self.max_requests)
            .field("max_age", &self.max_age)
            .field("salt", &self.salt.as_ref().map(|_| "<set>"))
            .field("max_exports", &self.max_exports)
            .finish()
    }
}

impl WorkloadConfig {
    pub(super) fn from_raw(raw: RawWorkload, origins: &Origins) -> Result<Self, ConfigError> {
        let workload = WorkloadConfig {
            capture: raw.capture,
            max_requests: raw.max_requests,
            max_age: raw.max_age,
            salt: Some(raw.salt).filter(|s| !s.is_empty()),
            max_exports: origins.nonzero("workload.max_exports", raw.max_exports)?,
        };
        if workload.max_requests == 0 {
            return Err(origins.error("workload.max_requests", "must be greater than zero"));
        }
        Ok(workload)
    }
}
