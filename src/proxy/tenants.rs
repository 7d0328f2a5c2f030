//! Who a request is counted under (`[tenants]`): its API key's hash, else the tenant header,
//! looked up in the allow list; anything else is `other`. The label set is the allow list plus
//! `other`, whatever clients send, so no client can create series.

use std::fmt::Write as _;
use std::sync::Arc;

use http::{header, HeaderMap};

use crate::config::{TenantsConfig, OTHER_TENANT};

/// The tenant resolver of one proxy (built once from `[tenants]`).
#[derive(Debug, Default)]
pub struct Tenants {
    config: TenantsConfig,
    other: Option<Arc<str>>,
}

impl Tenants {
    pub fn new(config: TenantsConfig) -> Self {
        let other = config.enabled().then(|| Arc::from(OTHER_TENANT));
        Self { config, other }
    }

    /// Tenants are counted.
    pub fn enabled(&self) -> bool {
        self.other.is_some()
    }

    /// `name` is a tenant requests can be counted under (allowed, or `other`).
    pub fn counts(&self, name: &str) -> bool {
        self.enabled() && (name == OTHER_TENANT || self.config.allow.iter().any(|t| &**t == name))
    }

    /// Every name requests are counted under: the allow list, then `other`; empty when off.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.config.allow.iter().map(|t| &**t).collect();
        if self.enabled() {
            names.push(OTHER_TENANT);
        }
        names
    }

    /// The tenant of a request with these headers; `None` when tenants are off. Once per
    /// request, at admission: a hash of the key when keys are mapped, a compare per allowed
    /// name.
    pub fn of(&self, headers: &HeaderMap) -> Option<Arc<str>> {
        let other = self.other.as_ref()?;
        if !self.config.keys.is_empty() {
            if let Some(key) = api_key(headers) {
                let digest = ring::digest::digest(&ring::digest::SHA256, key);
                if let Some((_, tenant)) = self
                    .config
                    .keys
                    .iter()
                    .find(|(hash, _)| hash.as_slice() == digest.as_ref())
                {
                    return Some(Arc::clone(tenant));
                }
            }
        }
        let named = self
            .config
            .header
            .as_ref()
            .and_then(|name| headers.get(name))
            .map(|value| value.as_bytes().trim_ascii());
        let allowed = named.and_then(|named| {
            self.config
                .allow
                .iter()
                .find(|tenant| tenant.as_bytes() == named)
        });
        Some(Arc::clone(allowed.unwrap_or(other)))
    }
}

/// The request's API key: the `Authorization: Bearer` token (OpenAI's clients), else
/// `x-api-key` (Anthropic's).
fn api_key(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let value = value.as_bytes().trim_ascii();
        let token = value
            .get(..7)
            .filter(|scheme| scheme.eq_ignore_ascii_case(b"bearer "))
            .and_then(|_| value.get(7..));
        if let Some(token) = token.map(<[u8]>::trim_ascii).filter(|t| !t.is_empty()) {
            return Some(token);
        }
    }
    headers
        .get("x-api-key")
        .map(|value| value.as_bytes().trim_ascii())
        .filter(|key| !key.is_empty())
}

/// The hash `[tenants.keys]` takes for `key`: `sha256:` and 64 hex digits.
pub fn key_hash(key: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, key);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for byte in digest.as_ref() {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigLoader;

    fn tenants(toml: &str) -> Tenants {
        let config = ConfigLoader::new()
            .text(toml, "t.toml")
            .unwrap()
            .load()
            .unwrap();
        Tenants::new(config.tenants)
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn off_by_default() {
        let off = tenants("");
        assert!(!off.enabled());
        assert_eq!(off.of(&headers(&[("x-tenant", "a")])), None);
    }

    #[test]
    fn the_header_names_an_allowed_tenant_and_anything_else_is_other() {
        let t = tenants("[tenants]\nheader = \"X-Tenant\"\nallow = [\"search\", \"chat\"]\n");
        let of = |value: &str| t.of(&headers(&[("x-tenant", value)])).unwrap().to_string();
        assert_eq!(of("search"), "search");
        assert_eq!(of(" chat "), "chat");
        assert_eq!(of("Search"), "other");
        assert_eq!(of("other"), "other");
        assert_eq!(of("x".repeat(500).as_str()), "other");
        assert_eq!(t.of(&HeaderMap::new()).unwrap().to_string(), "other");
    }

    #[test]
    fn a_key_is_matched_by_its_hash_before_the_header() {
        let hash = key_hash(b"sk-secret");
        assert_eq!(hash.len(), 7 + 64);
        let t = tenants(&format!(
            "[tenants]\nheader = \"x-tenant\"\nallow = [\"chat\"]\n[tenants.keys]\n\"{hash}\" = \"batch\"\n"
        ));
        let of = |pairs: &[(&'static str, &str)]| t.of(&headers(pairs)).unwrap().to_string();
        assert_eq!(of(&[("authorization", "Bearer sk-secret")]), "batch");
        assert_eq!(of(&[("authorization", "bearer  sk-secret ")]), "batch");
        assert_eq!(of(&[("x-api-key", "sk-secret")]), "batch");
        assert_eq!(
            of(&[("authorization", "Bearer sk-secret"), ("x-tenant", "chat")]),
            "batch"
        );
        assert_eq!(
            of(&[("authorization", "Bearer sk-other"), ("x-tenant", "chat")]),
            "chat"
        );
        assert_eq!(of(&[("authorization", "Bearer sk-other")]), "other");
    }

    #[test]
    fn bad_configurations_name_their_key() {
        for (toml, says) in [
            ("[tenants]\nheader = \"x-tenant\"\n", "tenants.allow"),
            ("[tenants]\nallow = [\"a\"]\n", "tenants.header"),
            (
                "[tenants]\nheader = \"authorization\"\nallow = [\"a\"]\n",
                "carries credentials",
            ),
            (
                "[tenants]\nheader = \"x t\"\nallow = [\"a\"]\n",
                "not an HTTP header name",
            ),
            (
                "[tenants]\nheader = \"x-t\"\nallow = [\"other\"]\n",
                "`other`",
            ),
            (
                "[tenants]\nheader = \"x-t\"\nallow = [\"a b\"]\n",
                "letters, digits",
            ),
            ("[tenants.keys]\n\"abc\" = \"a\"\n", "not a SHA-256 hash"),
        ] {
            let error = ConfigLoader::new()
                .text(toml, "t.toml")
                .unwrap()
                .load()
                .unwrap_err()
                .to_string();
            assert!(error.contains(says), "{toml:?}: {error}");
        }
    }
}
