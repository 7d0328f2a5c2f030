//! The types of the engine home: the shape of an engine's facts ([`EngineSpec`]), the
//! [`Engine`] that names one, and what the lookups over every engine take and answer
//! ([`Evidence`], [`RouteVerdict`]). This file names no engine: each engine's file fills an
//! [`EngineSpec`] from these types, and `registry.rs` lists the engines and looks them up.

/// What tokentap knows of one inference engine. Everything engine-specific is here, declared
/// once in the engine's own file: how it is recognised, where it describes itself, its metric
/// names and how its data-parallel ranks fold, where its KV budget is read, how it reports
/// usage and cached tokens, how a request is aborted, every route its server registers and
/// what each one is, the request fields it runs as code.
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
    /// Every route its server registers, each classified, one table per version range and
    /// frontend (each table holds from its version until the next table of the same frontend):
    /// inference and read routes are forwarded; control routes (caches, weights, LoRA
    /// load/unload, profiling, logging, memory, other clients' aborts, scale-out) are refused
    /// on the data port, and so is any path the tables do not declare, unless `proxy.routes`
    /// opens them (docs/operations.md, "Routes"). The server's self-description picks the
    /// table ([`Engine::route_table`]).
    pub routes: &'static [RouteTable],
    /// Request fields it runs as code when a launch flag allows: refused on the data port
    /// unless `proxy.code_fields` opens them.
    pub code_fields: &'static [CodeField],
    /// How it schedules by the request's `priority` field, if it can (docs/operations.md,
    /// "Priority scheduling").
    pub priority: Option<PriorityScheduling>,
    /// Its sessions (a context kept across requests), if it has them: which caller opened
    /// each one is remembered, and another caller's close or use of it refused
    /// (docs/operations.md, "Sessions").
    pub sessions: Option<Sessions>,
}

/// An engine's sessions: a request to `open` answers a new session's id (a JSON string); a
/// request to `close` names one in its body's `close_id_field`; a generation request on one of
/// `params_routes` continues one, named by the `params_id_field` of its `params_field` object
/// (at the top of the body, or in its `parameters`, as sglang's `/vertex_generate` hands them
/// on), and so reads that session's context: the prompts and answers before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sessions {
    pub open: &'static str,
    pub close: &'static str,
    pub close_id_field: &'static str,
    pub params_field: &'static str,
    pub params_id_field: &'static str,
    pub params_routes: &'static [&'static str],
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

/// The evidence that names an engine, in the order [`detect`](crate::engine::detect) weighs it.
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

/// What a route of an engine's server is to the data port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteClass {
    /// A client's own work: generation, chat, completions, responses (a client's own cancel
    /// included), embeddings, scoring, tokenizing, sessions. Forwarded.
    Inference,
    /// Harmless information: health, models, version, the metrics page. Forwarded.
    Read,
    /// Acts on the server or on other clients (caches, weights, LoRA adapters, profiling,
    /// logging, memory, other clients' aborts, scale-out), or hands out what a client should
    /// not read (server arguments with keys in them). Refused unless opened.
    Control,
}

impl RouteClass {
    pub fn as_str(self) -> &'static str {
        match self {
            RouteClass::Inference => "inference",
            RouteClass::Read => "read",
            RouteClass::Control => "control",
        }
    }
}

/// A route an engine's server registers: its methods and its path as the server's router
/// writes it (`{name}` one segment, `{name:path}` the rest of the path), or a mount (every
/// method, every path that starts with it, as Starlette's `Mount` takes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineRoute {
    pub class: RouteClass,
    /// Upper case; `HEAD` is taken as `GET`. Empty for a mount.
    pub methods: &'static [&'static str],
    pub path: &'static str,
    pub mount: bool,
}

impl EngineRoute {
    pub const fn new(
        class: RouteClass,
        methods: &'static [&'static str],
        path: &'static str,
    ) -> Self {
        Self {
            class,
            methods,
            path,
            mount: false,
        }
    }

    /// Every method and every path that starts with `path`.
    pub const fn mount(class: RouteClass, path: &'static str) -> Self {
        Self {
            class,
            methods: &[],
            path,
            mount: true,
        }
    }

    /// Whether `path` (normalised: decoded, no empty or dot segments, no trailing slash) is
    /// this route's.
    pub fn matches_path(&self, path: &str) -> bool {
        if self.mount {
            return path.starts_with(self.path);
        }
        // Every request's path is matched against every engine's routes (`classify_route`):
        // the template's literal part up to its first parameter must begin the path, which
        // turns most routes away without splitting either string, and a template with no
        // parameter matches only itself.
        let literal = self.path.find('{').map_or(self.path, |at| &self.path[..at]);
        if !path.starts_with(literal) {
            return false;
        }
        if literal.len() == self.path.len() {
            return path.len() == literal.len();
        }
        self.matches_segments(path)
    }

    /// The segment-by-segment match `matches_path` falls back on for a template with
    /// parameters.
    fn matches_segments(&self, path: &str) -> bool {
        template_matches(self.path, path)
    }

    /// Whether the route takes `method` (a mount takes every one).
    pub fn takes(&self, method: &str) -> bool {
        let method = if method == "HEAD" { "GET" } else { method };
        self.mount || self.methods.contains(&method)
    }
}

/// Whether the normalised `path` is one `template` (a router's path: `{name}` one segment,
/// `{name:path}` the rest) stands for, segment by segment. A template matches itself, so a
/// route list a server publishes (`/v1/responses/{response_id}`) is matched as it is written.
pub fn template_matches(template: &str, path: &str) -> bool {
    let mut template = template.split('/');
    let mut segments = path.split('/');
    loop {
        match (template.next(), segments.next()) {
            (None, None) => return true,
            (Some(part), Some(segment)) => {
                if part.starts_with('{') && part.ends_with(":path}") {
                    return !segment.is_empty();
                }
                let parameter = part.starts_with('{') && part.ends_with('}');
                if (parameter && segment.is_empty()) || (!parameter && part != segment) {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

/// Every route one version of an engine's server registers (with every flag that adds
/// routes), as read from its source: `tests/fixtures/engines/routes/` holds the same list as
/// data, which `conformance/routes.py` checks against the engine's own application and
/// `engine_tests` against this table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteTable {
    /// The server version the table was read from (`""`: a protocol, no one server). It holds
    /// for every release that starts with it (`0.34` for `0.34.1`) and every later one until
    /// the next table of the same frontend.
    pub version: &'static str,
    /// Which of the engine's servers registers these routes.
    pub frontend: Frontend,
    /// Its routes, in parts that tables of neighbouring versions share (a route a release
    /// added or moved is a part of its own).
    pub parts: &'static [&'static [EngineRoute]],
}

impl RouteTable {
    /// Every route of the table.
    pub fn routes(&self) -> impl Iterator<Item = &'static EngineRoute> {
        let parts = self.parts;
        parts.iter().flat_map(|part| part.iter())
    }
}

/// One of an engine's HTTP servers: its main one, or another frontend the same release ships
/// with a route set of its own (vLLM's Rust frontend, `VLLM_USE_RUST_FRONTEND=1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frontend {
    /// How messages and `/status` name it (`python`, `rust`).
    pub name: &'static str,
    /// The key of the engine's version document that only this frontend writes (vLLM's Rust
    /// frontend answers `/version` with `rust_frontend_version` beside `version`); `None` for
    /// the main server, which is what answers without any such key.
    pub version_key: Option<&'static str>,
}

impl Frontend {
    /// An engine's one server (the engines that ship a single frontend).
    pub const MAIN: Frontend = Frontend {
        name: "main",
        version_key: None,
    };
}

/// How a server's version falls among its engine's tables for its frontend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TableFit {
    /// The version is in the table's range (or the table is a protocol's, for any version).
    Exact,
    /// Newer than the newest table: the newest is used, and the routes the release added are
    /// refused until a table for it is declared.
    NewerThanNewest,
    /// Older than the oldest table: the oldest is used.
    OlderThanOldest,
    /// The server did not say its version: the newest table is used.
    VersionUnknown,
}

impl TableFit {
    pub fn as_str(self) -> &'static str {
        match self {
            TableFit::Exact => "exact",
            TableFit::NewerThanNewest => "newer_than_newest",
            TableFit::OlderThanOldest => "older_than_oldest",
            TableFit::VersionUnknown => "version_unknown",
        }
    }
}

/// The route table one upstream is held to: its engine's table for the version and frontend
/// its self-description names, and how the version fits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServedRoutes {
    pub engine: Engine,
    pub table: &'static RouteTable,
    pub fit: TableFit,
}

/// A request field an engine runs as code (sglang's `custom_logit_processor`: a pickled
/// callable it unpickles), the routes whose bodies it is read from, and the engine's launch
/// flag that turns it on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeField {
    pub field: &'static str,
    pub routes: &'static [&'static str],
    pub opened_by: &'static str,
}

/// What the engines' route tables say of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteVerdict {
    /// An inference or read route of some engine (or a path some engine serves, with a method
    /// none declares: the engine answers it, 405 or an `OPTIONS` preflight).
    Forward(RouteClass),
    /// A control route of this engine (a route one engine uses for control is refused
    /// whatever engine serves: the engines share the data port's path space).
    Control { engine: &'static str },
    /// No engine declares this path.
    Unknown,
}

/// An inference engine: one of the built-in ones, or one registered at run time (the list is
/// `registry.rs`'s).
#[derive(Clone, Copy)]
pub struct Engine(&'static EngineSpec);

impl Engine {
    /// The engine these facts describe (for the registry, which lists the engines).
    pub(super) const fn of(spec: &'static EngineSpec) -> Self {
        Self(spec)
    }

    /// What tokentap knows of this engine.
    pub const fn spec(self) -> &'static EngineSpec {
        self.0
    }

    /// The engine's short name.
    pub const fn name(self) -> &'static str {
        self.0.name
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

/// What a server's answers say of it, for [`detect`](crate::engine::detect).
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn templates_match_one_segment_a_path_tail_or_a_mount() {
        let one = EngineRoute::new(RouteClass::Read, &["GET"], "/a/{id}/b");
        assert!(one.matches_path("/a/1/b"));
        assert!(!one.matches_path("/a/b"));
        assert!(!one.matches_path("/a/1/2/b"));
        let tail = EngineRoute::new(RouteClass::Read, &["GET"], "/m/{x:path}");
        assert!(tail.matches_path("/m/a/b/c"));
        assert!(!tail.matches_path("/m"));
        let mount = EngineRoute::mount(RouteClass::Read, "/metrics");
        assert!(mount.matches_path("/metrics") && mount.matches_path("/metrics/x"));
        assert!(mount.takes("DELETE"));
        assert!(one.takes("HEAD") && !one.takes("POST"));
    }

    /// Segments of the built-in routes' paths and a few others.
    const PIECES: &[&str] = &[
        "v1",
        "chat",
        "completions",
        "models",
        "generate",
        "slots",
        "adapters",
        "metrics",
        "{id}",
        "x",
        "0",
        "v2",
        "tokenize",
    ];

    proptest! {
        /// The literal-prefix shortcut answers as the segment walk does, for every built-in
        /// route and paths made of route pieces, empty segments and arbitrary ones.
        #[test]
        fn the_shortcut_agrees_with_the_segment_walk(
            route in 0usize..1_000,
            segments in proptest::collection::vec(
                prop_oneof![
                    Just(String::new()),
                    "[a-z0-9_{}:.-]{1,12}",
                    proptest::sample::select(PIECES).prop_map(String::from),
                ],
                0..6,
            ),
        ) {
            let routes: Vec<&EngineRoute> = crate::engine::Engine::all()
                .into_iter()
                .flat_map(|engine| engine.spec().routes.iter())
                .flat_map(RouteTable::routes)
                .filter(|route| !route.mount)
                .collect();
            let route = routes[route % routes.len()];
            let path = format!("/{}", segments.join("/"));
            prop_assert_eq!(
                route.matches_path(&path),
                route.matches_segments(&path),
                "{} against {}",
                path,
                route.path
            );
            prop_assert!(route.matches_path(route.path));
            // The route's own path with its parameters filled in, and with a segment more.
            let filled: Vec<&str> = route
                .path
                .split('/')
                .map(|part| if part.starts_with('{') { "p" } else { part })
                .collect();
            let own = filled.join("/");
            prop_assert!(route.matches_path(&own), "{} against {}", own, route.path);
            let longer = format!("{own}/{}", segments.first().map_or("q", String::as_str));
            prop_assert_eq!(route.matches_path(&longer), route.matches_segments(&longer));
        }
    }
}
