//! Which paths the data port forwards (`proxy.routes`): the engines' control routes (cache
//! flushes, weight updates, profiling, sleep, other clients' aborts: `base::engine`) are not
//! a client's to call through a sidecar that every client can reach, so by default they are
//! refused with a 403 that names the setting; everything else is forwarded untouched.
//!
//! Paths are compared as the engine's router will see them: percent-decoded (Starlette
//! decodes before routing, so `/flush%5Fcache` is `/flush_cache`), with empty and `.` segments
//! dropped, `..` applied, and no trailing slash. A path that cannot be decoded is compared as
//! sent. Requests tokentap makes itself (the sweep's targeted aborts, its discovery reads)
//! carry [`Internal`] and are not subject to the policy.

use std::borrow::Cow;

use crate::base::engine::{control_route, ControlRoute};
use crate::config::RoutePolicyConfig;

/// Marks a request tokentap itself sends through the data path (set in-process only: no
/// client can set it).
#[derive(Debug, Clone, Copy, Default)]
pub struct Internal;

/// What the data port forwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutePolicy {
    /// Everything (`proxy.routes = "all"`).
    All,
    /// Everything but the engines' control routes, plus these opened paths.
    Safe { opened: Vec<Pattern> },
    /// Only these paths.
    Only(Vec<Pattern>),
}

/// A configured path: exact, or every path under a prefix (written `/v1/*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    path: String,
    prefix: bool,
}

impl Pattern {
    /// `/x` or `/x/*` (validated by the configuration loader).
    pub fn parse(text: &str) -> Self {
        match text.strip_suffix('*') {
            Some(prefix) => Pattern {
                path: prefix.to_string(),
                prefix: true,
            },
            None => Pattern {
                path: normalise(text).into_owned(),
                prefix: false,
            },
        }
    }

    fn matches(&self, path: &str) -> bool {
        if self.prefix {
            // `/v1/*` also takes `/v1` itself.
            path.starts_with(&self.path) || self.path.strip_suffix('/') == Some(path)
        } else {
            path == self.path
        }
    }
}

/// Why a request was refused: the route and what opens it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The path as compared (normalised).
    pub path: String,
    /// The engine whose control route it is, when it is one.
    pub engine: Option<&'static str>,
}

impl RoutePolicy {
    pub fn from_config(config: &RoutePolicyConfig) -> Self {
        match config {
            RoutePolicyConfig::All => RoutePolicy::All,
            RoutePolicyConfig::Safe => RoutePolicy::Safe { opened: Vec::new() },
            RoutePolicyConfig::List { safe, paths } => {
                let patterns = paths.iter().map(|p| Pattern::parse(p)).collect();
                if *safe {
                    RoutePolicy::Safe { opened: patterns }
                } else {
                    RoutePolicy::Only(patterns)
                }
            }
        }
    }

    /// `Ok` when a request of `method` to `path` is forwarded, else why not.
    pub fn check(&self, method: &str, path: &str) -> Result<(), Refused> {
        if matches!(self, RoutePolicy::All) {
            return Ok(());
        }
        let path = normalise(path);
        let control: Option<(&'static str, ControlRoute)> = control_route(method, &path);
        let allowed = match self {
            RoutePolicy::All => true,
            RoutePolicy::Safe { opened } => {
                control.is_none() || opened.iter().any(|p| p.matches(&path))
            }
            RoutePolicy::Only(patterns) => patterns.iter().any(|p| p.matches(&path)),
        };
        if allowed {
            Ok(())
        } else {
            Err(Refused {
                path: path.into_owned(),
                engine: control.map(|(engine, _)| engine),
            })
        }
    }
}

/// `path` as an engine's router compares it (see the module's doc).
pub fn normalise(path: &str) -> Cow<'_, str> {
    let decoded = percent_encoding::percent_decode_str(path).decode_utf8();
    let decoded: Cow<'_, str> = match decoded {
        Ok(decoded) => decoded,
        Err(_) => Cow::Borrowed(path),
    };
    let clean = !decoded.contains("//")
        && !decoded.contains("/./")
        && !decoded.contains("/../")
        && !decoded.ends_with("/.")
        && !decoded.ends_with("/..")
        && (decoded.len() <= 1 || !decoded.ends_with('/'));
    if clean && decoded.starts_with('/') {
        return decoded;
    }
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            segment => segments.push(segment),
        }
    }
    Cow::Owned(format!("/{}", segments.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn safe() -> RoutePolicy {
        RoutePolicy::Safe { opened: Vec::new() }
    }

    #[test]
    fn the_default_refuses_control_routes_however_they_are_spelled() {
        let policy = safe();
        for path in [
            "/flush_cache",
            "/flush_cache/",
            "//flush_cache",
            "/./flush_cache",
            "/v1/../flush_cache",
            "/flush%5Fcache",
            "/%66lush_cache",
        ] {
            let refused = policy.check("POST", path).unwrap_err();
            assert_eq!(refused.path, "/flush_cache", "{path}");
            assert_eq!(refused.engine, Some("sglang"));
        }
        assert!(policy.check("POST", "/reset_prefix_cache").is_err());
        assert!(policy.check("POST", "/sleep").is_err());
        for path in [
            "/v1/chat/completions",
            "/generate",
            "/v1/models",
            "/metrics",
            "/health",
        ] {
            assert!(policy.check("POST", path).is_ok(), "{path}");
            assert!(policy.check("GET", path).is_ok(), "{path}");
        }
        // Not a control route by its letters: forwarded (the engine answers 404).
        assert!(policy.check("POST", "/FLUSH_CACHE").is_ok());
    }

    #[test]
    fn a_list_opens_what_it_names_and_all_opens_everything() {
        let opened = RoutePolicy::from_config(&RoutePolicyConfig::List {
            safe: true,
            paths: vec!["/flush_cache".into()],
        });
        assert!(opened.check("POST", "/flush_cache").is_ok());
        assert!(opened.check("POST", "/abort_request").is_err());
        let only = RoutePolicy::from_config(&RoutePolicyConfig::List {
            safe: false,
            paths: vec!["/v1/*".into(), "/health".into()],
        });
        assert!(only.check("POST", "/v1/chat/completions").is_ok());
        assert!(only.check("GET", "/health").is_ok());
        assert!(only.check("GET", "/metrics").is_err());
        assert!(only.check("POST", "/generate").is_err());
        assert!(RoutePolicy::All.check("POST", "/flush_cache").is_ok());
    }
}
