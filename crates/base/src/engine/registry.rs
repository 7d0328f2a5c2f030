//! The list of engines and the lookups over it: the built-in engines (one file each beside
//! this one, in the order detection asks them), the ones registered at run time ([`register`]),
//! and what every engine's facts answer together: which engine a server is ([`detect`]), what
//! a route is ([`classify_route`], or [`classify_route_served`] for an upstream held to one
//! table of its engine, which [`Engine::route_table`] picks from its version and frontend), the
//! fields run as code ([`code_fields`]), the sessions ([`sessions`]), the load metrics ([`load_metric_names`]) and the
//! self-description routes ([`server_info_routes`], [`model_info_routes`], [`version_routes`]).

use std::sync::RwLock;

use super::spec::{
    CodeField, Engine, EngineSpec, Evidence, RouteClass, RouteTable, RouteVerdict, SelfDescription,
    ServedRoutes, Sessions, TableFit,
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

    /// The route table a server of this engine is held to: its frontend's (the one whose
    /// version key its version document writes, as `writes_key` says, else the main
    /// server's), for the `version` it says. A table holds from its version to the next
    /// table's; a version newer than the newest table gets the newest, one older than the
    /// oldest the oldest, and a server that says none the newest, each fit told in the
    /// answer. `None` only for an engine that declares no table.
    pub fn route_table(
        self,
        version: Option<&str>,
        writes_key: impl Fn(&str) -> bool,
    ) -> Option<ServedRoutes> {
        let tables = self.spec().routes;
        let frontend = tables
            .iter()
            .map(|t| t.frontend)
            .find(|f| f.version_key.is_some_and(&writes_key))
            .or_else(|| {
                tables
                    .iter()
                    .map(|t| t.frontend)
                    .find(|f| f.version_key.is_none())
            })
            .or_else(|| tables.first().map(|t| t.frontend))?;
        let mut own: Vec<&'static RouteTable> =
            tables.iter().filter(|t| t.frontend == frontend).collect();
        own.sort_by_key(|t| release(t.version));
        let (&oldest, &newest) = (own.first()?, own.last()?);
        let served = |table, fit| {
            Some(ServedRoutes {
                engine: self,
                table,
                fit,
            })
        };
        if newest.version.is_empty() {
            // A protocol's table, for whatever server speaks it.
            return served(newest, TableFit::Exact);
        }
        let said = version.map(release).unwrap_or_default();
        // `0.0.0.dev1+g…`: a build from a source tree without release tags (setuptools-scm's
        // fallback) says no release at all.
        if said.is_empty() || said.iter().all(|n| *n == 0) {
            return served(newest, TableFit::VersionUnknown);
        }
        let Some(&table) = own.iter().rev().find(|t| release(t.version) <= said) else {
            return served(oldest, TableFit::OlderThanOldest);
        };
        let own_release = release(table.version);
        let fit = if std::ptr::eq(table, newest) && !said.starts_with(&own_release) {
            TableFit::NewerThanNewest
        } else {
            TableFit::Exact
        };
        served(table, fit)
    }
}

/// A version's release numbers (`v0.34.1rc2` → 0, 34, 1), read up to the first part that does
/// not start with a digit, for ordering tables and versions (`0.34` ≤ `0.34.1` < `0.35`).
fn release(version: &str) -> Vec<u64> {
    let mut numbers = Vec::new();
    let version = version.trim();
    let version = version.strip_prefix('v').unwrap_or(version);
    for part in version.split('.') {
        let digits = part.len() - part.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let Ok(number) = part[..digits].parse::<u64>() else {
            break;
        };
        numbers.push(number);
        if digits < part.len() {
            // `0rc1`: what follows the number is not a release part.
            break;
        }
    }
    numbers
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

/// What a request of `method` to the normalised `path` is, by every route table of every
/// engine (an upstream that has not said what it is): see [`classify_route_served`].
pub fn classify_route(method: &str, path: &str) -> RouteVerdict {
    classify_route_served(method, path, None)
}

/// What a request of `method` to the normalised `path` is, for an upstream held to `served`
/// (its engine's one table; `None`: not known yet, every table): its own engine by that table,
/// every other engine by all of its tables (they share the data port's path space). A control
/// route wins; then an inference or read route that takes the method; then a path declared
/// under other methods (refused when one of them is control); else unknown.
pub fn classify_route_served(
    method: &str,
    path: &str,
    served: Option<ServedRoutes>,
) -> RouteVerdict {
    let mut taking = None;
    let mut other_method = None;
    let mut control_on_path = None;
    for engine in Engine::all() {
        let spec = engine.spec();
        let tables = match served {
            Some(served) if served.engine == engine => std::slice::from_ref(served.table),
            _ => spec.routes,
        };
        let routes = tables.iter().flat_map(RouteTable::routes);
        for route in routes.filter(|r| r.matches_path(path)) {
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

/// Every engine's sessions, with the engine.
pub fn sessions() -> impl Iterator<Item = (&'static str, Sessions)> {
    Engine::all()
        .into_iter()
        .filter_map(|engine| Some((engine.spec().name, engine.spec().sessions?)))
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
    fn a_server_s_version_and_frontend_pick_its_route_table() {
        let python = |version: Option<&str>| {
            Engine::VLLM
                .route_table(version, |_| false)
                .map(|served| (served.table.version, served.table.frontend.name, served.fit))
        };
        use TableFit::{Exact, NewerThanNewest, OlderThanOldest, VersionUnknown};
        assert_eq!(python(Some("0.32.0")), Some(("0.32", "python", Exact)));
        assert_eq!(python(Some("0.32.4")), Some(("0.32", "python", Exact)));
        assert_eq!(python(Some("0.33.0")), Some(("0.33", "python", Exact)));
        assert_eq!(python(Some("v0.34.1rc2")), Some(("0.34", "python", Exact)));
        assert_eq!(
            python(Some("0.35.0")),
            Some(("0.34", "python", NewerThanNewest))
        );
        assert_eq!(
            python(Some("1.0.0")),
            Some(("0.34", "python", NewerThanNewest))
        );
        assert_eq!(
            python(Some("0.31.9")),
            Some(("0.32", "python", OlderThanOldest))
        );
        assert_eq!(python(None), Some(("0.34", "python", VersionUnknown)));
        assert_eq!(
            python(Some("dev")),
            Some(("0.34", "python", VersionUnknown))
        );
        // A source build without release tags (the embedded simulator says so too).
        assert_eq!(
            python(Some("0.0.0.dev1+gf92199b56")),
            Some(("0.34", "python", VersionUnknown))
        );
        // The Rust frontend's own key in its version document picks its table.
        let rust = Engine::VLLM
            .route_table(Some("0.34.0"), |key| key == "rust_frontend_version")
            .map(|served| (served.table.frontend.name, served.fit));
        assert_eq!(rust, Some(("rust", Exact)));
        // A protocol's table holds for any version.
        let llamacpp = Engine::LLAMACPP.route_table(Some("b4000"), |_| false);
        assert_eq!(llamacpp.map(|s| s.fit), Some(Exact));
        // sglang's one table: a later release uses it and says so.
        let sglang = Engine::SGLANG.route_table(Some("0.5.24"), |_| false);
        assert_eq!(sglang.map(|s| s.fit), Some(NewerThanNewest));
        let post = Engine::SGLANG.route_table(Some("0.5.23.post1"), |_| false);
        assert_eq!(post.map(|s| s.fit), Some(Exact));
    }

    #[test]
    fn an_upstream_is_held_to_its_own_table_and_every_other_engine_s() {
        use RouteVerdict::{Control, Forward, Unknown};
        let vllm = |version| Engine::VLLM.route_table(Some(version), |_| false);
        let inference = Forward(RouteClass::Inference);
        // 0.33 added `/v1/decisions`: not in 0.32's table, in 0.33's and 0.34's. sglang
        // serves the same path, so it is forwarded behind 0.32 as well (the engines share the
        // data port's path space; vLLM 0.32 answers it 404).
        let declares = |version, path: &str| {
            vllm(version).is_some_and(|served| {
                served
                    .table
                    .routes()
                    .any(|r| r.matches_path(path) && r.takes("POST"))
            })
        };
        assert!(!declares("0.32.0", "/v1/decisions"));
        assert!(declares("0.33.0", "/v1/decisions") && declares("0.34.0", "/v1/decisions"));
        assert_eq!(
            classify_route_served("POST", "/v1/decisions", vllm("0.32.0")),
            inference
        );
        for version in ["0.33.0", "0.34.0"] {
            assert_eq!(
                classify_route_served("POST", "/v1/decisions", vllm(version)),
                inference,
                "{version}"
            );
        }
        // 0.34's checkpoint routes and the fault-tolerance routes, wherever they live.
        for (path, versions) in [
            ("/checkpoint/prepare", ["0.34.0"].as_slice()),
            ("/v1/fault_tolerance/apply", &["0.34.0"]),
            ("/fault_tolerance/apply", &["0.32.0", "0.33.0"]),
        ] {
            for version in versions {
                assert_eq!(
                    classify_route_served("POST", path, vllm(version)),
                    Control { engine: "vllm" },
                    "{path} behind {version}"
                );
            }
        }
        // A path another version uses for control is unknown to this one's table: refused
        // either way.
        assert_eq!(
            classify_route_served("POST", "/checkpoint/prepare", vllm("0.32.0")),
            Unknown
        );
        // Another engine's control routes stay refused behind vLLM, its inference forwarded.
        assert_eq!(
            classify_route_served("POST", "/flush_cache", vllm("0.32.0")),
            Control { engine: "sglang" }
        );
        assert_eq!(
            classify_route_served("POST", "/generate", vllm("0.32.0")),
            inference
        );
        // Not known yet: every table of every engine.
        assert_eq!(classify_route("POST", "/v1/decisions"), inference);
        assert_eq!(
            classify_route("POST", "/checkpoint/restore"),
            Control { engine: "vllm" }
        );
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
            for table in engine.spec().routes {
                for route in table.routes() {
                    assert!(route.path.starts_with('/'), "{engine}: {route:?}");
                }
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
