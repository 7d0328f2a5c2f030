//! The list of engines and the lookups over it: the built-in engines (one file each beside
//! this one, in the order detection asks them), the ones registered at run time ([`register`]),
//! and what every engine's facts answer together: which engine a server is ([`detect`]), what
//! a route is ([`classify_route`]), the fields run as code ([`code_fields`]), the load metrics
//! ([`load_metric_names`]) and the self-description routes ([`server_info_routes`],
//! [`model_info_routes`], [`version_routes`]).

use std::sync::RwLock;

use super::spec::{
    CodeField, Engine, EngineSpec, Evidence, RouteClass, RouteVerdict, SelfDescription,
};
use super::{llamacpp, openai, sglang, vllm};

impl Engine {
    pub const SGLANG: Engine = Engine::of(&sglang::SPEC);
    pub const VLLM: Engine = Engine::of(&vllm::SPEC);
    pub const LLAMACPP: Engine = Engine::of(&llamacpp::SPEC);
    /// Any other OpenAI-compatible server.
    pub const OPENAI: Engine = Engine::of(&openai::SPEC);

    /// The built-in engines, in the order detection asks them (the generic one last).
    pub const BUILT_IN: [Engine; 4] = [
        Engine::SGLANG,
        Engine::VLLM,
        Engine::LLAMACPP,
        Engine::OPENAI,
    ];

    /// Every engine: the registered ones first (a newer engine that also answers like an
    /// older one is recognised as itself), then the built-in ones.
    pub fn all() -> Vec<Engine> {
        let mut all: Vec<Engine> = crate::lock::read(&REGISTERED)
            .iter()
            .map(|spec| Engine::of(spec))
            .collect();
        all.extend(Engine::BUILT_IN);
        all
    }

    /// The engine of this name, if tokentap knows one.
    pub fn named(name: &str) -> Option<Engine> {
        Engine::all().into_iter().find(|e| e.name() == name)
    }
}

/// Serde for an `Option<Engine>` field, by name: a name tokentap does not know (a document from
/// a build with another engine, or an older `"unknown"`) reads as `None`.
pub mod by_name {
    use crate::engine::Engine;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(
        engine: &Option<Engine>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        engine.map(Engine::name).serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Engine>, D::Error> {
        let name: Option<String> = Option::deserialize(deserializer)?;
        Ok(name.and_then(|name| Engine::named(&name)))
    }
}

/// Engines registered at run time, besides the built-in ones.
static REGISTERED: RwLock<Vec<&'static EngineSpec>> = RwLock::new(Vec::new());

/// Adds an engine tokentap does not build in (its detection, metrics, aborts and control routes
/// then apply everywhere, as a built-in engine's do). Registering a name twice keeps the first.
pub fn register(spec: &'static EngineSpec) {
    let mut registered = crate::lock::write(&REGISTERED);
    if !registered.iter().any(|s| s.name == spec.name)
        && !Engine::BUILT_IN.iter().any(|e| e.name() == spec.name)
    {
        registered.push(spec);
    }
}

/// Which engine a server is, by one precedence: the `owned_by` its model list writes, else the
/// prefix of its metric names, else a route only one engine answers; a server that lists models
/// and says nothing more is an OpenAI-compatible one; a server that answered nothing, none.
pub fn detect(evidence: &Evidence<'_>) -> Option<Engine> {
    let engines = Engine::all();
    if let Some(owned_by) = evidence.owned_by {
        if let Some(engine) = engines
            .iter()
            .find(|e| e.spec().detect.owned_by.contains(&owned_by))
        {
            return Some(*engine);
        }
    }
    for name in evidence.metric_names {
        if let Some(engine) = engines.iter().find(|e| {
            e.spec()
                .detect
                .metric_prefix
                .is_some_and(|prefix| name.starts_with(prefix))
        }) {
            return Some(*engine);
        }
    }
    if let Some(engine) = engines.iter().find(|e| {
        let spec = e.spec();
        spec.detect.by_self_description
            && spec
                .describe
                .server_info
                .iter()
                .chain(&spec.describe.model_info)
                .any(|route| evidence.answered.contains(route))
    }) {
        return Some(*engine);
    }
    evidence.lists_models.then_some(Engine::OPENAI)
}

/// What a request of `method` to the normalised `path` is, by every engine's route table: a
/// control route of any engine wins; then an inference or read route that takes the method;
/// then a path some engine declares under other methods (refused when one of them is control);
/// else unknown.
pub fn classify_route(method: &str, path: &str) -> RouteVerdict {
    let mut taking = None;
    let mut other_method = None;
    let mut control_on_path = None;
    for engine in Engine::all() {
        let spec = engine.spec();
        for route in spec.routes.routes.iter().filter(|r| r.matches_path(path)) {
            match (route.class, route.takes(method)) {
                (RouteClass::Control, true) => return RouteVerdict::Control { engine: spec.name },
                (RouteClass::Control, false) => {
                    control_on_path.get_or_insert(spec.name);
                }
                (class, true) => {
                    taking.get_or_insert(class);
                }
                (class, false) => {
                    other_method.get_or_insert(class);
                }
            }
        }
    }
    match (taking, control_on_path, other_method) {
        (Some(class), _, _) => RouteVerdict::Forward(class),
        (None, Some(engine), _) => RouteVerdict::Control { engine },
        (None, None, Some(class)) => RouteVerdict::Forward(class),
        (None, None, None) => RouteVerdict::Unknown,
    }
}

/// The fields an engine runs as code that a request body to `path` may carry, with the engine.
pub fn code_fields(path: &str) -> impl Iterator<Item = (&'static str, CodeField)> + '_ {
    Engine::all().into_iter().flat_map(move |engine| {
        let spec = engine.spec();
        spec.code_fields
            .iter()
            .filter(move |field| field.routes.contains(&path))
            .map(move |field| (spec.name, *field))
    })
}

/// Every engine's running- and queued-request metric names: a server showing none of them above
/// zero holds no request.
pub fn load_metric_names() -> Vec<&'static str> {
    Engine::all()
        .into_iter()
        .flat_map(|e| {
            let metrics = e.spec().metrics;
            metrics.running.iter().chain(metrics.queued).copied()
        })
        .collect()
}

/// The server-info routes of every engine, deduplicated, in engine order: what one read of an
/// upstream asks (`proxy::describe`).
pub fn server_info_routes() -> Vec<&'static [&'static str]> {
    let mut out: Vec<&'static [&'static str]> = Vec::new();
    for engine in Engine::all() {
        let routes = engine.spec().describe.server_info;
        if !routes.is_empty() && !out.contains(&routes) {
            out.push(routes);
        }
    }
    out
}

/// The model-info routes of every engine, deduplicated, in engine order: what one read of an
/// upstream asks, all at once (`proxy::describe`; the first in this order that answers is the
/// model info).
pub fn model_info_routes() -> Vec<&'static str> {
    own_routes(|describe| describe.model_info)
}

/// The version routes of every engine, deduplicated, in engine order (asked as
/// [`model_info_routes`] are).
pub fn version_routes() -> Vec<&'static str> {
    own_routes(|describe| describe.version)
}

/// The route `route` picks from each engine's self-description, where it has one,
/// deduplicated, in engine order.
fn own_routes(route: impl Fn(&SelfDescription) -> Option<&'static str>) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for engine in Engine::all() {
        if let Some(path) = route(&engine.spec().describe) {
            if !out.contains(&path) {
                out.push(path);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_classified_by_every_engine_s_table() {
        use RouteVerdict::{Control, Forward, Unknown};
        let control = |engine| Control { engine };
        assert_eq!(classify_route("POST", "/flush_cache"), control("sglang"));
        assert_eq!(classify_route("GET", "/flush_cache"), control("sglang"));
        // A method the path does not declare, on a control path: refused.
        assert_eq!(classify_route("GET", "/abort_request"), control("sglang"));
        assert_eq!(
            classify_route("POST", "/reset_prefix_cache"),
            control("vllm")
        );
        assert_eq!(classify_route("POST", "/slots/0"), control("llamacpp"));
        assert_eq!(classify_route("POST", "/adapters"), control("vllm"));
        assert_eq!(classify_route("DELETE", "/adapters/x"), control("vllm"));
        assert_eq!(
            classify_route("POST", "/inference/v1/abort_requests"),
            control("vllm")
        );
        assert_eq!(
            classify_route("POST", "/dumper/x\u{fffd}"),
            control("sglang")
        );
        // Reads of the same path are forwarded where an engine declares them.
        assert_eq!(
            classify_route("GET", "/lora-adapters"),
            Forward(RouteClass::Read)
        );
        assert_eq!(
            classify_route("POST", "/lora-adapters"),
            control("llamacpp")
        );
        // llama-server's slots show other clients' prompts.
        assert_eq!(classify_route("GET", "/slots"), control("llamacpp"));
        for (method, path) in [
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/completions"),
            ("POST", "/generate"),
            ("POST", "/v1/embeddings"),
            ("POST", "/tokenize"),
            ("POST", "/v1/responses/resp_1/cancel"),
            ("GET", "/v1/responses/resp_1"),
            ("OPTIONS", "/v1/chat/completions"),
        ] {
            assert_eq!(
                classify_route(method, path),
                Forward(RouteClass::Inference),
                "{method} {path}"
            );
        }
        for (method, path) in [
            ("GET", "/v1/models"),
            ("GET", "/v1/models/org/model"),
            ("GET", "/health"),
            ("HEAD", "/health"),
            ("GET", "/metrics"),
            ("GET", "/version"),
        ] {
            assert_eq!(
                classify_route(method, path),
                Forward(RouteClass::Read),
                "{method} {path}"
            );
        }
        for path in ["/FLUSH_CACHE", "/nope", "/v1", "/v1/chat", "/dumper"] {
            assert_eq!(classify_route("POST", path), Unknown, "{path}");
        }
    }

    #[test]
    fn each_self_description_route_is_listed_once_in_engine_order() {
        // The built-in engines: sglang's model info, vLLM's version document.
        assert_eq!(model_info_routes(), ["/model_info"]);
        assert_eq!(version_routes(), ["/version"]);
        let server_info = server_info_routes();
        assert_eq!(
            server_info.first().copied(),
            Some(Engine::SGLANG.spec().describe.server_info)
        );
    }

    #[test]
    fn every_engine_s_routes_are_absolute_paths() {
        for engine in Engine::all() {
            for route in engine.spec().routes.routes {
                assert!(route.path.starts_with('/'), "{engine}: {route:?}");
            }
        }
    }

    #[test]
    fn detection_has_one_precedence() {
        let none = Evidence::default();
        assert_eq!(detect(&none), None);
        let listing = Evidence {
            lists_models: true,
            ..Evidence::default()
        };
        assert_eq!(detect(&listing), Some(Engine::OPENAI));
        // owned_by wins over the metric names, which win over the routes.
        let both = Evidence {
            owned_by: Some("vllm"),
            metric_names: &["sglang:num_running_reqs"],
            answered: &["/model_info"],
            lists_models: true,
        };
        assert_eq!(detect(&both), Some(Engine::VLLM));
        let metrics = Evidence {
            owned_by: Some("someone"),
            metric_names: &["process_cpu_seconds_total", "vllm:num_requests_running"],
            answered: &["/model_info"],
            lists_models: true,
        };
        assert_eq!(detect(&metrics), Some(Engine::VLLM));
        let routes = Evidence {
            answered: &["/server_info"],
            ..Evidence::default()
        };
        assert_eq!(detect(&routes), Some(Engine::SGLANG));
        assert_eq!(Engine::named("llamacpp"), Some(Engine::LLAMACPP));
        assert_eq!(Engine::named("nope"), None);
    }
}
