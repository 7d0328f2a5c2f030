//! `[tenants]`: who a request is counted under — a request header naming the tenant, or a map
//! from API-key hashes to tenant names — and the allow list that bounds the `tenant` label
//! (docs/metrics.md, "Tenants"). Off by default.

use std::sync::Arc;

use super::error::{ConfigError, Origins};
use super::raw::RawTenants;

/// Most tenant names: each multiplies the cell series and the matrix's accumulators.
pub const MAX_TENANTS: usize = 64;

/// Longest tenant name.
pub const MAX_TENANT_NAME: usize = 64;

/// The tenant every request outside the allow list (or naming none) is counted under.
pub const OTHER_TENANT: &str = "other";

/// `[tenants]`, validated.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TenantsConfig {
    /// The request header whose value names the tenant (lower case); `None`: not read.
    pub header: Option<http::HeaderName>,
    /// The names counted as themselves: `allow` and every name `keys` maps to.
    pub allow: Vec<Arc<str>>,
    /// SHA-256 of an API key (the `Authorization: Bearer` token, or `x-api-key`) → its
    /// tenant. Only hashes are configured, so the keys are never stored or shown.
    pub keys: Vec<([u8; 32], Arc<str>)>,
}

impl TenantsConfig {
    /// Tenants are counted: a header is read or keys are mapped.
    pub fn enabled(&self) -> bool {
        self.header.is_some() || !self.keys.is_empty()
    }

    pub(super) fn from_raw(raw: RawTenants, origins: &Origins) -> Result<Self, ConfigError> {
        let header = match raw.header.trim() {
            "" => None,
            name => Some(
                http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()).map_err(
                    |_| {
                        origins.error(
                            "tenants.header",
                            format!("`{name}` is not an HTTP header name"),
                        )
                    },
                )?,
            ),
        };
        if let Some(name) = &header {
            if matches!(
                name.as_str(),
                "authorization" | "x-api-key" | "cookie" | "proxy-authorization"
            ) {
                return Err(origins.error(
                    "tenants.header",
                    format!("`{name}` carries credentials: map key hashes with [tenants.keys] instead, so no key is ever a label"),
                ));
            }
        }
        let mut allow: Vec<Arc<str>> = Vec::new();
        let mut add = |name: &str, key: &str| -> Result<(), ConfigError> {
            let name = name.trim();
            check_name(name).map_err(|why| origins.error(key, why))?;
            if !allow.iter().any(|known| &**known == name) {
                allow.push(Arc::from(name));
            }
            Ok(())
        };
        for name in &raw.allow {
            add(name, "tenants.allow")?;
        }
        let mut keys = Vec::with_capacity(raw.keys.len());
        for (hash, name) in &raw.keys {
            let digest = parse_hash(hash).ok_or_else(|| {
                origins.error(
                    "tenants.keys",
                    format!("`{hash}` is not a SHA-256 hash (64 hex digits, optionally after `sha256:`): `tokentap tenants hash-key` prints one from a key on standard input"),
                )
            })?;
            add(name, "tenants.keys")?;
            keys.push((digest, Arc::from(name.trim())));
        }
        if allow.len() > MAX_TENANTS {
            return Err(origins.error(
                "tenants.allow",
                format!(
                    "{} tenant names; at most {MAX_TENANTS} (each multiplies the cell series)",
                    allow.len()
                ),
            ));
        }
        if header.is_some() && allow.is_empty() {
            return Err(origins.error(
                "tenants.allow",
                "is empty while tenants.header is set: every request would count as `other`; list the tenant names to count",
            ));
        }
        if header.is_none() && keys.is_empty() && !allow.is_empty() {
            return Err(origins.error(
                "tenants.header",
                "is not set and tenants.keys is empty: nothing names a tenant, so tenants.allow has no effect",
            ));
        }
        Ok(TenantsConfig {
            header,
            allow,
            keys,
        })
    }
}

/// A name a label may carry: letters, digits, `.`, `_`, `-`, at most [`MAX_TENANT_NAME`], and
/// not `other` (the name of everything else).
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_TENANT_NAME {
        return Err(format!(
            "tenant name `{name}` must have 1 to {MAX_TENANT_NAME} characters"
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(format!(
            "tenant name `{name}` may hold only letters, digits, `.`, `_` and `-`"
        ));
    }
    if name == OTHER_TENANT {
        return Err(format!(
            "`{OTHER_TENANT}` is the name of every tenant outside the list: choose another"
        ));
    }
    Ok(())
}

/// 64 hex digits, optionally after `sha256:`, as the digest's bytes.
fn parse_hash(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    let hex = text.strip_prefix("sha256:").unwrap_or(text);
    if hex.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (byte, pair) in digest.iter_mut().zip(hex.as_bytes().chunks(2)) {
        let pair = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(digest)
}
