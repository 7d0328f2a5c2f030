//! Which paths the data port forwards (`proxy.routes`). It fails closed: every route of
//! every engine tokentap knows is declared in the engine home (`base::engine`: sglang 0.5.23's
//! and vLLM 0.32's, 0.33's and 0.34's whole route lists, vLLM's Rust frontend's, llama.cpp's
//! server, the OpenAI API), each as inference,
//! read or control. Inference and read routes are forwarded; control routes (cache flushes,
//! weight updates, LoRA loading, profiling, sleep, other clients' aborts) are not a client's
//! to call through a sidecar every client can reach, and a path no engine declares is not
//! either: both are refused with a 403 that names the setting and the path. A path of
//! tokentap's own admin listener ([`ADMIN_PATHS`]) is refused with a 403 that says this is the
//! data listener and where the admin listener is, not how to open it here.
//!
//! Paths are compared as the engine's server will read them: percent-decoded before routing
//! (uvicorn decodes with replacement, so `%FF` reads as U+FFFD and `%2F` as `/`), with empty
//! and `.` segments dropped, `..` applied, and no trailing slash (Starlette's redirect). A
//! target that cannot be read that way (no leading `/`, a `%` that does not start two hex
//! digits) is a 400. Requests tokentap makes itself (the sweep's targeted aborts, its
//! discovery reads) carry [`Internal`] and are not subject to the policy.
//!
//! Each upstream is held to the route table of its engine's version and frontend, as its
//! self-description names them (`proxy::answers::RouteFacts`; every table while it has not
//! said), and a path it publishes (`/openapi.json`) that no table classifies is refused with a
//! 403 that says the engine serves it.

use std::borrow::Cow;

use crate::base::engine::{classify_route_served, RouteVerdict, ServedRoutes};
use crate::config::RoutePolicyConfig;

use super::answers::RouteFacts;

/// Marks a request tokentap itself sends through the data path (set in-process only: no
/// client can set it).
#[derive(Debug, Clone, Copy, Default)]
pub struct Internal;

/// What the data port forwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutePolicy {
    /// Everything (`proxy.routes = "all"`).
    All,
    /// The engines' inference and read routes, plus these opened paths.
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
                path: normalise(text).map_or_else(|_| text.to_string(), Cow::into_owned),
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
pub enum Refused {
    /// Not forwarded (a 403): the path as compared (normalised), and why.
    Route { path: String, why: NotForwarded },
    /// The target cannot be read as the engine would (a 400).
    Unreadable { target: String, why: &'static str },
}

/// Why a readable path is not forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotForwarded {
    /// A control route of this engine.
    Control(&'static str),
    /// No engine tokentap knows declares it.
    Unknown,
    /// The upstream publishes it (its `/openapi.json`), but no route table classifies it: the
    /// table the upstream is held to, if it has said what it is.
    Unclassified(Option<ServedRoutes>),
    /// `proxy.routes` is a list without `"safe"`, and this path is not in it.
    NotListed,
    /// No engine declares it (or it is not listed), and it is one of tokentap's own admin
    /// routes ([`ADMIN_PATHS`]): a request meant for the admin listener.
    Admin,
}

/// tokentap's own admin routes that no engine serves (`/metrics` and `/` are left out: an
/// engine serves a `/metrics` of its own, and the data port forwards it), as the data port
/// tells a request for one that it came to the wrong listener; a path ending in `/` takes
/// every path one segment under it. `admin::routes` holds its route table to this list.
pub const ADMIN_PATHS: &[&str] = &[
    "/healthz",
    "/readyz",
    "/login",
    "/logout",
    "/page/sweep",
    "/matrix",
    "/workload",
    "/capacity",
    "/status",
    "/sweeps",
    "/sweeps/",
    "/reference",
];

/// Whether `path` (normalised) is one of [`ADMIN_PATHS`].
pub fn is_admin_path(path: &str) -> bool {
    ADMIN_PATHS
        .iter()
        .any(|admin| match admin.strip_suffix('/') {
            Some(_) => {
                path.len() > admin.len()
                    && path.starts_with(admin)
                    && !path[admin.len()..].contains('/')
            }
            None => path == *admin,
        })
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

    /// `Ok` when a request of `method` to `path` is forwarded to an upstream of which the
    /// latest read says `upstream`, else why not.
    pub fn check(&self, method: &str, path: &str, upstream: &RouteFacts) -> Result<(), Refused> {
        if matches!(self, RoutePolicy::All) {
            return Ok(());
        }
        let path = normalise(path).map_err(|why| Refused::Unreadable {
            target: path.chars().take(200).collect(),
            why,
        })?;
        let why = match self {
            RoutePolicy::All => return Ok(()),
            RoutePolicy::Safe { opened } => {
                if opened.iter().any(|p| p.matches(&path)) {
                    return Ok(());
                }
                match classify_route_served(method, &path, upstream.served) {
                    RouteVerdict::Forward(_) => return Ok(()),
                    RouteVerdict::Control { engine } => NotForwarded::Control(engine),
                    RouteVerdict::Unknown if upstream.publishes_unclassified(method, &path) => {
                        NotForwarded::Unclassified(upstream.served)
                    }
                    RouteVerdict::Unknown if is_admin_path(&path) => NotForwarded::Admin,
                    RouteVerdict::Unknown => NotForwarded::Unknown,
                }
            }
            RoutePolicy::Only(patterns) => {
                if patterns.iter().any(|p| p.matches(&path)) {
                    return Ok(());
                }
                if is_admin_path(&path) {
                    NotForwarded::Admin
                } else {
                    NotForwarded::NotListed
                }
            }
        };
        Err(Refused::Route {
            path: path.chars().take(200).collect(),
            why,
        })
    }
}

/// `path` as an engine's server routes it (see the module's doc), or why it cannot be read.
pub fn normalise(path: &str) -> Result<Cow<'_, str>, &'static str> {
    if !path.starts_with('/') {
        return Err("a request target is a path that starts with `/`");
    }
    let escapes_well_formed = path.split('%').skip(1).all(|after| {
        after
            .as_bytes()
            .get(..2)
            .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if !escapes_well_formed {
        return Err("every `%` in a path starts a two-digit hex escape");
    }
    // uvicorn's `unquote`: bytes that are not UTF-8 read as U+FFFD.
    let decoded: Cow<'_, str> = match percent_encoding::percent_decode_str(path).into() {
        Cow::Borrowed(bytes) => String::from_utf8_lossy(bytes),
        Cow::Owned(bytes) => Cow::Owned(String::from_utf8_lossy(&bytes).into_owned()),
    };
    let clean = !decoded.contains("//")
        && !decoded.contains("/./")
        && !decoded.contains("/../")
        && !decoded.ends_with("/.")
        && !decoded.ends_with("/..")
        && (decoded.len() <= 1 || !decoded.ends_with('/'));
    if clean && decoded.starts_with('/') {
        return Ok(decoded);
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
    Ok(Cow::Owned(format!("/{}", segments.join("/"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn safe() -> RoutePolicy {
        RoutePolicy::Safe { opened: Vec::new() }
    }

    #[test]
    fn tokentaps_own_admin_routes_are_told_apart_from_unknown_paths() {
        assert_eq!(why(&safe(), "GET", "/status"), Some(NotForwarded::Admin));
        assert_eq!(why(&safe(), "GET", "/status/"), Some(NotForwarded::Admin));
        assert_eq!(
            why(&safe(), "DELETE", "/sweeps/0-0000"),
            Some(NotForwarded::Admin)
        );
        assert_eq!(
            why(&safe(), "GET", "/sweeps/a/b"),
            Some(NotForwarded::Unknown)
        );
        assert_eq!(why(&safe(), "GET", "/statusx"), Some(NotForwarded::Unknown));
        let listed = RoutePolicy::Only(vec![Pattern::parse("/v1/*")]);
        assert_eq!(why(&listed, "GET", "/capacity"), Some(NotForwarded::Admin));
        assert_eq!(why(&listed, "GET", "/other"), Some(NotForwarded::NotListed));
        // An engine's own `/metrics` is forwarded, not taken for tokentap's.
        assert_eq!(why(&safe(), "GET", "/metrics"), None);
    }

    fn why(policy: &RoutePolicy, method: &str, path: &str) -> Option<NotForwarded> {
        match policy.check(method, path, &RouteFacts::default()) {
            Ok(()) => None,
            Err(Refused::Route { why, .. }) => Some(why),
            Err(Refused::Unreadable { target, why }) => panic!("{target}: {why}"),
        }
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
            let Err(Refused::Route { path: seen, why }) =
                policy.check("POST", path, &RouteFacts::default())
            else {
                panic!("{path} forwarded");
            };
            assert_eq!(seen, "/flush_cache", "{path}");
            assert_eq!(why, NotForwarded::Control("sglang"));
        }
        assert!(policy
            .check("POST", "/reset_prefix_cache", &RouteFacts::default())
            .is_err());
        assert!(policy
            .check("POST", "/sleep", &RouteFacts::default())
            .is_err());
        // uvicorn reads `%FF` as U+FFFD: still sglang's dumper.
        assert_eq!(
            why(&policy, "POST", "/%64umper/x%FF"),
            Some(NotForwarded::Control("sglang"))
        );
        for path in [
            "/v1/chat/completions",
            "/v1%2Fchat%2Fcompletions",
            "/generate",
            "/v1/models",
            "/metrics",
        ] {
            assert!(
                policy.check("POST", path, &RouteFacts::default()).is_ok(),
                "{path}"
            );
            assert!(
                policy.check("GET", path, &RouteFacts::default()).is_ok(),
                "{path}"
            );
        }
        assert!(policy
            .check("GET", "/health", &RouteFacts::default())
            .is_ok());
    }

    #[test]
    fn a_path_no_engine_declares_is_refused() {
        let policy = safe();
        for path in [
            "/FLUSH_CACHE",
            "/nope",
            "/v1/chat/completions/extra",
            "/admin",
        ] {
            assert_eq!(
                why(&policy, "POST", path),
                Some(NotForwarded::Unknown),
                "{path}"
            );
        }
    }

    /// An upstream's facts as a read of a vLLM server saying `version` (and publishing
    /// `published`) would give them.
    fn vllm(version: &str, published: &[(&str, &str)]) -> RouteFacts {
        use crate::proxy::answers::{Answers, PublishedRoute};
        Answers {
            models: Some(serde_json::json!({"data": [{"id": "m", "owned_by": "vllm"}]})),
            version: Some(serde_json::json!({ "version": version })),
            published_routes: Some(
                published
                    .iter()
                    .map(|(method, path)| PublishedRoute {
                        method: (*method).into(),
                        path: (*path).into(),
                    })
                    .collect(),
            ),
            ..Answers::default()
        }
        .route_facts()
    }

    #[test]
    fn each_upstream_is_held_to_its_version_s_table() {
        let policy = safe();
        let refused = |facts: &RouteFacts, method, path| match policy.check(method, path, facts) {
            Ok(()) => None,
            Err(Refused::Route { why, .. }) => Some(why),
            Err(Refused::Unreadable { target, why }) => panic!("{target}: {why}"),
        };
        let v032 = vllm("0.32.0", &[]);
        let v034 = vllm("0.34.0", &[]);
        let control = Some(NotForwarded::Control("vllm"));
        assert_eq!(refused(&v034, "POST", "/checkpoint/prepare"), control);
        assert_eq!(refused(&v034, "POST", "/v1/fault_tolerance/apply"), control);
        assert_eq!(refused(&v032, "POST", "/fault_tolerance/apply"), control);
        // 0.34's control routes are paths 0.32's table does not have: refused as unknown.
        assert_eq!(
            refused(&v032, "POST", "/checkpoint/prepare"),
            Some(NotForwarded::Unknown)
        );
        assert_eq!(refused(&v034, "POST", "/v1/decisions"), None);
    }

    #[test]
    fn a_route_the_upstream_publishes_and_no_table_classifies_is_named_as_served() {
        let policy = safe();
        let facts = vllm(
            "0.34.0",
            &[
                ("POST", "/v1/secret_sauce/{id}"),
                ("POST", "/v1/chat/completions"),
            ],
        );
        assert_eq!(
            facts.unclassified.as_deref().map(<[_]>::len),
            Some(1),
            "{facts:?}"
        );
        let Err(Refused::Route { why, .. }) = policy.check("POST", "/v1/secret_sauce/7", &facts)
        else {
            panic!("forwarded");
        };
        assert_eq!(why, NotForwarded::Unclassified(facts.served));
        // Another method of the same path is not what it publishes.
        assert_eq!(
            why_with(&policy, "GET", "/v1/secret_sauce/7", &facts),
            Some(NotForwarded::Unknown)
        );
    }

    fn why_with(
        policy: &RoutePolicy,
        method: &str,
        path: &str,
        facts: &RouteFacts,
    ) -> Option<NotForwarded> {
        match policy.check(method, path, facts) {
            Ok(()) => None,
            Err(Refused::Route { why, .. }) => Some(why),
            Err(Refused::Unreadable { target, why }) => panic!("{target}: {why}"),
        }
    }

    #[test]
    fn an_unreadable_target_is_refused_as_such() {
        for target in ["*", "v1/chat/completions", "", "/a%zz", "/a%4"] {
            assert!(
                matches!(
                    safe().check("POST", target, &RouteFacts::default()),
                    Err(Refused::Unreadable { .. })
                ),
                "{target}"
            );
        }
        assert!(RoutePolicy::All
            .check("POST", "*", &RouteFacts::default())
            .is_ok());
    }

    #[test]
    fn a_list_opens_what_it_names_and_all_opens_everything() {
        let opened = RoutePolicy::from_config(&RoutePolicyConfig::List {
            safe: true,
            paths: vec!["/flush_cache".into(), "/custom/*".into()],
        });
        assert!(opened
            .check("POST", "/flush_cache", &RouteFacts::default())
            .is_ok());
        assert!(opened
            .check("POST", "/custom/route", &RouteFacts::default())
            .is_ok());
        assert!(opened
            .check("POST", "/abort_request", &RouteFacts::default())
            .is_err());
        let only = RoutePolicy::from_config(&RoutePolicyConfig::List {
            safe: false,
            paths: vec!["/v1/*".into(), "/health".into()],
        });
        assert!(only
            .check("POST", "/v1/chat/completions", &RouteFacts::default())
            .is_ok());
        assert!(only.check("GET", "/health", &RouteFacts::default()).is_ok());
        assert_eq!(why(&only, "GET", "/metrics"), Some(NotForwarded::NotListed));
        assert!(only
            .check("POST", "/generate", &RouteFacts::default())
            .is_err());
        assert!(RoutePolicy::All
            .check("POST", "/flush_cache", &RouteFacts::default())
            .is_ok());
        assert!(RoutePolicy::All
            .check("POST", "/anything", &RouteFacts::default())
            .is_ok());
    }
}
