//! The shape of an engine's facts ([`EngineSpec`]) and the [`Engine`] that names one: the
//! built-in engines (one file each beside this one) and any registered at run time
//! ([`register`]), asked in one order by [`detect`].

use std::sync::RwLock;

use super::{llamacpp, openai, sglang, vllm};

/// What tokentap knows of one inference engine. Everything engine-specific is here, declared
/// once in the engine's own file: how it is recognised, where it describes itself, its metric
/// names and how its data-parallel ranks fold, where its KV budget is read, how it reports
/// usage and cached tokens, how a request is aborted, its control routes.
#[derive(Debug)]
pub struct EngineSpec {
    /// The short name used in documents, labels and messages (`sglang`, `vllm`, …).
    pub name: &'static str,
    /// How its answers give it away.
    pub detect: Detection,
    /// The routes where it says what it is (besides `/v1/models`, which every
    /// OpenAI-compatible server answers).
    pub describe: SelfDescription,
    /// The server-info keys that enter the configuration's fingerprint (docs/fleet.md, "What
    /// enters the fingerprint").
    pub fingerprint: FingerprintKeys,
    /// Its Prometheus page.
    pub metrics: Metrics,
    /// Where its KV cache size (in tokens) is read.
    pub kv_budget: KvBudget,
    /// How it reports usage and cached prompt tokens.
    pub usage: UsageReport,
    /// How one of its requests is aborted on purpose (the sweep's targeted abort), if it can be.
    pub abort: Option<Abort>,
    /// Where it counts a prompt's tokens, tried in order (the next when one answers 404 or
    /// 405); the answer's `count`, else the length of its `tokens`.
    pub tokenize: &'static [Tokenize],
    /// The routes that change the server's state (caches, weights, profiling, scheduling,
    /// logging) or reach into it (weights, other clients' requests): refused on the data
    /// port unless `proxy.routes` opens them (docs/operations.md, "Routes").
    pub control_routes: &'static [ControlRoute],
    /// How it schedules by the request's `priority` field, if it can (docs/operations.md,
    /// "Priority scheduling").
    pub priority: Option<PriorityScheduling>,
}

/// An engine's priority scheduling: off unless started with `flag`; then the waiting requests
/// are taken by their `priority`, larger values first or smaller first.
#[derive(Debug, Clone, Copy)]
pub struct PriorityScheduling {
    /// The launch flag that turns it on.
    pub flag: &'static str,
    /// Larger values are served first (sglang's default); else smaller first (vLLM).
    pub larger_first: bool,
    /// The launch flag that reverses the order, where there is one.
    pub reverse_flag: Option<&'static str>,
}

impl PriorityScheduling {
    /// One sentence an operator reads beside per-priority figures.
    pub fn describe(&self, engine: &str) -> String {
        format!(
            "{engine} schedules by priority only when started with {}; it then serves {} values first{}.",
            self.flag,
            if self.larger_first { "larger" } else { "smaller" },
            self.reverse_flag
                .map_or_else(String::new, |flag| format!(" ({flag} reverses it)"))
        )
    }
}

/// The evidence that names an engine, in the order [`detect`] weighs it.
#[derive(Debug, Clone, Copy)]
pub struct Detection {
    /// `owned_by` of the models in its `/v1/models` (the strongest sign: the server wrote it).
    pub owned_by: &'static [&'static str],
    /// The prefix of its own metric names (`sglang:`).
    pub metric_prefix: Option<&'static str>,
    /// Whether a server that answers its self-description routes (server info, model info) is
    /// it: only it has them (sglang's); the weakest sign.
    pub by_self_description: bool,
}

/// Where an engine describes itself.
#[derive(Debug, Clone, Copy)]
pub struct SelfDescription {
    /// Its server-info document, under its current name then older ones (an older name is asked
    /// only when the newer answered something other than 2xx: the route is missing there).
    pub server_info: &'static [&'static str],
    /// Its model-info document.
    pub model_info: Option<&'static str>,
    /// Its version document (`{"version": …}`).
    pub version: Option<&'static str>,
    /// The server-info key holding its version.
    pub version_key: Option<&'static str>,
    /// The server-info key holding the path the weights were loaded from.
    pub model_path_key: Option<&'static str>,
    /// Whether `/v1/models`' `root` is the weights' path (vLLM), not the served name (sglang).
    pub models_root_is_path: bool,
    /// The server-info keys of its context length and of the longest prompt it accepts.
    pub context_length_key: Option<&'static str>,
    pub max_input_key: Option<&'static str>,
}

/// Server-info keys hashed into the fingerprint: by name, and by prefix (speculative decoding,
/// feature switches, …). Times, pids, ports, hosts, seeds and secrets never are.
#[derive(Debug, Clone, Copy)]
pub struct FingerprintKeys {
    pub names: &'static [&'static str],
    pub prefixes: &'static [&'static str],
}

impl FingerprintKeys {
    /// Whether `key` enters the fingerprint.
    pub fn contains(&self, key: &str) -> bool {
        self.names.contains(&key) || self.prefixes.iter().any(|p| key.starts_with(p))
    }
}

/// An engine's metric names. Each list holds every name a version of the engine has used;
/// counters are accepted with or without prometheus_client's `_total`.
#[derive(Debug, Clone, Copy)]
pub struct Metrics {
    /// Requests running now (a count: summed over ranks and engine cores).
    pub running: &'static [&'static str],
    /// Requests waiting in its queue now (a count: summed).
    pub queued: &'static [&'static str],
    /// The KV cache's share in use, 0–1 (a share: averaged over ranks).
    pub kv_usage: &'static [&'static str],
    /// The prefix cache's hit rate as a gauge, 0–1 (averaged).
    pub prefix_hit_rate: &'static [&'static str],
    /// Prefix-cache hits and queries as counters (summed; their increments give the rate).
    pub prefix_hits: &'static [&'static str],
    pub prefix_queries: &'static [&'static str],
    /// Prompt tokens served from the prefix cache, a counter (summed), and all prompt
    /// tokens, for the cached share where the answers do not report it.
    pub cached_prompt_tokens: &'static [&'static str],
    pub prompt_tokens: &'static [&'static str],
    /// The label that tells its data-parallel ranks or engine cores apart (series that differ
    /// only in it are one server's parts, folded as above).
    pub rank_label: Option<&'static str>,
}

/// Where an engine's KV budget is read.
#[derive(Debug, Clone, Copy)]
pub enum KvBudget {
    /// A server-info key, in tokens (sglang's `max_total_num_tokens`).
    ServerInfo(&'static str),
    /// An info metric's labels: blocks × block size, summed over the engine's ranks (each
    /// data-parallel rank has a cache of its own).
    InfoMetric {
        metric: &'static str,
        blocks: &'static str,
        block_size: &'static str,
    },
    /// It does not say.
    Unknown,
}

/// How an engine reports usage.
#[derive(Debug, Clone, Copy)]
pub struct UsageReport {
    /// The server-info key saying it sends the final usage chunk to streams that did not ask
    /// (sglang `stream_response_default_include_usage`).
    pub unasked_key: Option<&'static str>,
    /// The launch flag that makes it report cached prompt tokens in the answers' usage
    /// (`prompt_tokens_details.cached_tokens`), when that is not on by default.
    pub cache_report_flag: Option<&'static str>,
}

/// A targeted abort: `POST route` with `{"<id_field>": "<request id>"}`; the request id is
/// sent in the request body's `id_field` when the request starts.
#[derive(Debug, Clone, Copy)]
pub struct Abort {
    pub route: &'static str,
    pub id_field: &'static str,
}

/// A tokenizer endpoint: `POST route` with the text in `text_field` (and the model), and the
/// switch that leaves special tokens out, if it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokenize {
    pub route: &'static str,
    pub text_field: &'static str,
    pub special_tokens_field: Option<&'static str>,
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

/// An inference engine: one of the built-in ones, or one registered at run time.
#[derive(Clone, Copy)]
pub struct Engine(&'static EngineSpec);

impl Engine {
    pub const SGLANG: Engine = Engine(&sglang::SPEC);
    pub const VLLM: Engine = Engine(&vllm::SPEC);
    pub const LLAMACPP: Engine = Engine(&llamacpp::SPEC);
    /// Any other OpenAI-compatible server.
    pub const OPENAI: Engine = Engine(&openai::SPEC);

    /// The built-in engines, in the order detection asks them (the generic one last).
    pub const BUILT_IN: [Engine; 4] = [
        Engine::SGLANG,
        Engine::VLLM,
        Engine::LLAMACPP,
        Engine::OPENAI,
    ];

    /// What tokentap knows of this engine.
    pub const fn spec(self) -> &'static EngineSpec {
        self.0
    }

    /// The engine's short name.
    pub const fn name(self) -> &'static str {
        self.0.name
    }

    /// Every engine: the registered ones first (a newer engine that also answers like an
    /// older one is recognised as itself), then the built-in ones.
    pub fn all() -> Vec<Engine> {
        let mut all: Vec<Engine> = crate::lock::read(&REGISTERED)
            .iter()
            .map(|spec| Engine(spec))
            .collect();
        all.extend(Engine::BUILT_IN);
        all
    }

    /// The engine of this name, if tokentap knows one.
    pub fn named(name: &str) -> Option<Engine> {
        Engine::all().into_iter().find(|e| e.name() == name)
    }
}

impl PartialEq for Engine {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Engine {}

impl std::hash::Hash for Engine {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.name.hash(state);
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name)
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name)
    }
}

impl serde::Serialize for Engine {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0.name)
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

/// What a server's answers say of it, for [`detect`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Evidence<'a> {
    /// The `owned_by` of the first model of its `/v1/models`.
    pub owned_by: Option<&'a str>,
    /// Its metric names.
    pub metric_names: &'a [&'a str],
    /// The self-description routes that answered with 2xx JSON.
    pub answered: &'a [&'a str],
    /// Whether it answered `/v1/models` (an OpenAI-compatible server).
    pub lists_models: bool,
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

/// The control route of any engine that a request of `method` to the normalised `path` is,
/// and the engine's name. Engines share the data port's path space: a route one engine uses
/// for control is refused whatever engine serves (none uses it for inference).
pub fn control_route(method: &str, path: &str) -> Option<(&'static str, ControlRoute)> {
    Engine::all().into_iter().find_map(|engine| {
        let spec = engine.spec();
        spec.control_routes
            .iter()
            .find(|route| route.matches(method, path))
            .map(|route| (spec.name, *route))
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
        for engine in Engine::all() {
            for route in engine.spec().control_routes {
                assert!(route.path.starts_with('/'), "{route:?}");
                assert_eq!(route.prefix, route.path.ends_with('/'), "{route:?}");
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
