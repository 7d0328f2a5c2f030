//! The shape of an engine's facts ([`EngineSpec`]), the [`Engine`] that names one, and the
//! questions asked of all of them at once (is this route one of any engine's control routes?).

use super::{llamacpp, openai, sglang, vllm};

/// An inference engine tokentap knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Engine {
    Sglang,
    Vllm,
    LlamaCpp,
    /// Any other OpenAI-compatible server.
    OpenAi,
}

impl Engine {
    /// Every engine, in the order detection asks them.
    pub const ALL: [Engine; 4] = [
        Engine::Sglang,
        Engine::Vllm,
        Engine::LlamaCpp,
        Engine::OpenAi,
    ];

    /// What tokentap knows of this engine.
    pub fn spec(self) -> &'static EngineSpec {
        match self {
            Engine::Sglang => &sglang::SPEC,
            Engine::Vllm => &vllm::SPEC,
            Engine::LlamaCpp => &llamacpp::SPEC,
            Engine::OpenAi => &openai::SPEC,
        }
    }

    /// The engine's short name (`sglang`, `vllm`, `llamacpp`, `openai`).
    pub fn name(self) -> &'static str {
        self.spec().name
    }
}

/// What tokentap knows of one engine.
#[derive(Debug)]
pub struct EngineSpec {
    /// The short name used in documents, labels and messages.
    pub name: &'static str,
    /// The routes that change the server's state (caches, weights, profiling, scheduling,
    /// logging) or reach into it (weights, other clients' requests): refused on the data
    /// port unless `proxy.routes` opens them (docs/operations.md, "Routes").
    pub control_routes: &'static [ControlRoute],
}

/// Which methods of a route change state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Methods {
    /// Every method (the engine accepts GET and POST alike for the action).
    Any,
    /// Only these (upper case); the route's other methods only read.
    Only(&'static [&'static str]),
}

/// A control route of an engine: a path (exact, or every path under it when `prefix`) and
/// the methods that act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlRoute {
    pub path: &'static str,
    pub prefix: bool,
    pub methods: Methods,
}

impl ControlRoute {
    /// An exact path, acting on every method.
    pub const fn any(path: &'static str) -> Self {
        Self {
            path,
            prefix: false,
            methods: Methods::Any,
        }
    }

    /// An exact path, acting on these methods only.
    pub const fn only(path: &'static str, methods: &'static [&'static str]) -> Self {
        Self {
            path,
            prefix: false,
            methods: Methods::Only(methods),
        }
    }

    /// Every path under `path` (which ends in `/`), on these methods.
    pub const fn under(path: &'static str, methods: Methods) -> Self {
        Self {
            path,
            prefix: true,
            methods,
        }
    }

    /// Whether a request of `method` to `path` (normalised: decoded, no empty or dot segments,
    /// no trailing slash) is this route's.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        let on_path = if self.prefix {
            path.starts_with(self.path)
        } else {
            path == self.path
        };
        on_path
            && match self.methods {
                Methods::Any => true,
                Methods::Only(methods) => methods.iter().any(|m| m.eq_ignore_ascii_case(method)),
            }
    }
}

/// The control route of any engine that a request of `method` to the normalised `path` is,
/// and the engine's name. Engines share the data port's path space: a route one engine uses
/// for control is refused whatever engine serves (none uses it for inference).
pub fn control_route(method: &str, path: &str) -> Option<(&'static str, &'static ControlRoute)> {
    Engine::ALL.into_iter().find_map(|engine| {
        let spec = engine.spec();
        spec.control_routes
            .iter()
            .find(|route| route.matches(method, path))
            .map(|route| (spec.name, route))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_routes_match_their_methods_and_paths() {
        assert_eq!(
            control_route("POST", "/flush_cache").map(|(e, _)| e),
            Some("sglang")
        );
        assert_eq!(
            control_route("GET", "/flush_cache").map(|(e, _)| e),
            Some("sglang")
        );
        assert!(control_route("POST", "/reset_prefix_cache").is_some());
        assert!(control_route("POST", "/slots/0").is_some());
        // Reads of the same path are forwarded.
        assert!(control_route("GET", "/hicache/storage-backend").is_none());
        assert!(control_route("PUT", "/hicache/storage-backend").is_some());
        // Inference and read-only routes never are.
        for path in [
            "/v1/chat/completions",
            "/v1/completions",
            "/generate",
            "/v1/models",
            "/health",
            "/metrics",
            "/server_info",
            "/get_server_info",
            "/v1/embeddings",
            "/tokenize",
        ] {
            for method in ["GET", "POST"] {
                assert!(control_route(method, path).is_none(), "{method} {path}");
            }
        }
        // Every engine's routes are absolute paths, prefixes end in a slash.
        for engine in Engine::ALL {
            for route in engine.spec().control_routes {
                assert!(route.path.starts_with('/'), "{route:?}");
                assert_eq!(route.prefix, route.path.ends_with('/'), "{route:?}");
            }
        }
    }
}
