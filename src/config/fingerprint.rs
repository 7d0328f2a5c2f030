//! `[fingerprint]`: how often each upstream is asked what it is, and what the operator knows of
//! its hardware that a sidecar cannot see (docs/fleet.md).

use std::time::Duration;

use super::error::{ConfigError, Origins};
use super::raw::RawFingerprint;

/// `[fingerprint]`: how each upstream's configuration is read (docs/fleet.md).
#[derive(Debug, Clone, PartialEq)]
pub struct FingerprintConfig {
    /// How often each upstream is asked what it is (0: never; the label stays `unknown`).
    pub interval: Duration,
    /// Operator-given facts (empty: not given). `hardware` and `gpu_count` enter the
    /// fingerprint; `node` and `zone` are shown only (replicas of one configuration on other
    /// nodes share a fingerprint).
    pub hardware: String,
    pub gpu_count: u32,
    pub node: String,
    pub zone: String,
    /// How the server was started, when it does not say (vLLM has no launch command to
    /// read); shown redacted, never hashed. sglang's own `launch_command` wins.
    pub launch_command: String,
}

impl FingerprintConfig {
    pub(super) fn from_raw(raw: RawFingerprint, origins: &Origins) -> Result<Self, ConfigError> {
        if !raw.interval.is_zero() && raw.interval < Duration::from_secs(1) {
            return Err(origins.error("fingerprint.interval", "must be 0 (off) or at least 1s"));
        }
        Ok(FingerprintConfig {
            interval: raw.interval,
            hardware: raw.hardware.trim().to_owned(),
            gpu_count: raw.gpu_count,
            node: raw.node.trim().to_owned(),
            zone: raw.zone.trim().to_owned(),
            launch_command: raw.launch_command.trim().to_owned(),
        })
    }
}
