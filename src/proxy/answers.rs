//! What one read of an upstream's self-description answered ([`Answers`], `describe` makes it),
//! and what the answers say: the models it lists, the engine it is (`base::engine::detect`'s one
//! precedence), its version, the route table it is held to (`Engine::route_table`, by that
//! version and the frontend its version document names) and the routes it publishes
//! (`/openapi.json`) that no table classifies. Pure.

use serde_json::Value;

use crate::base::engine::{
    self, classify_route_served, Engine, Evidence, RouteVerdict, ServedRoutes,
};
use crate::base::exposition;

/// The answers of one read of an upstream (each `None` when it did not answer in time, or not
/// with 2xx JSON / text).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answers {
    /// The engine's server-info document, and the route that gave it.
    pub server_info: Option<(&'static str, Value)>,
    /// The engine's model-info document.
    pub model_info: Option<Value>,
    /// `/v1/models`.
    pub models: Option<Value>,
    /// The version document.
    pub version: Option<Value>,
    /// The Prometheus page (`metrics_path`).
    pub metrics: Option<String>,
    /// The routes its `/openapi.json` lists (FastAPI servers publish it unless docs are off),
    /// as (method, path template), at most [`MAX_PUBLISHED_ROUTES`].
    pub published_routes: Option<Vec<PublishedRoute>>,
}

/// A route a server publishes: an upper-case method and its path as the server's router
/// writes it (`/v1/responses/{response_id}`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct PublishedRoute {
    pub method: String,
    pub path: String,
}

impl std::fmt::Display for PublishedRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

/// The most routes kept from one `/openapi.json` (vLLM's and sglang's list about a hundred);
/// past it the rest are not looked at.
pub const MAX_PUBLISHED_ROUTES: usize = 1000;
/// The longest published path kept (longer ones are not a route anyone routes).
const MAX_PUBLISHED_PATH: usize = 256;

/// The (method, path) pairs of an OpenAPI document's `paths` (`{"/x": {"get": …, "post": …}}`),
/// sorted, at most [`MAX_PUBLISHED_ROUTES`]; `None` when it has no `paths` object.
pub fn published_routes(openapi: &Value) -> Option<Vec<PublishedRoute>> {
    const METHODS: [&str; 8] = [
        "get", "put", "post", "delete", "options", "head", "patch", "trace",
    ];
    let paths = openapi.get("paths")?.as_object()?;
    let mut routes = Vec::new();
    for (path, operations) in paths {
        // A path is visible ASCII (it is logged and shown as it is): anything else is not one.
        let visible = path.chars().all(|c| c.is_ascii_graphic());
        if !path.starts_with('/') || path.len() > MAX_PUBLISHED_PATH || !visible {
            continue;
        }
        let Some(operations) = operations.as_object() else {
            continue;
        };
        for method in METHODS.iter().filter(|m| operations.contains_key(**m)) {
            if routes.len() == MAX_PUBLISHED_ROUTES {
                break;
            }
            routes.push(PublishedRoute {
                method: method.to_ascii_uppercase(),
                path: path.clone(),
            });
        }
    }
    routes.sort();
    Some(routes)
}

impl Answers {
    /// Whether anything answered.
    pub fn any(&self) -> bool {
        self.server_info.is_some()
            || self.model_info.is_some()
            || self.models.is_some()
            || self.version.is_some()
            || self.metrics.is_some()
    }

    /// Which questions answered, by name.
    pub fn answered(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (name, present) in [
            ("server_info", self.server_info.is_some()),
            ("model_info", self.model_info.is_some()),
            ("models", self.models.is_some()),
            ("version", self.version.is_some()),
            ("metrics", self.metrics.is_some()),
        ] {
            if present {
                out.push(name);
            }
        }
        out
    }

    /// Fills what `self` lacks from `earlier` (an answer that timed out this time but came last
    /// time: a busy sglang answers its server info late, and its absence must not read as
    /// another configuration).
    pub fn or_from(mut self, earlier: &Answers) -> Answers {
        self.server_info = self.server_info.or_else(|| earlier.server_info.clone());
        self.model_info = self.model_info.or_else(|| earlier.model_info.clone());
        self.models = self.models.or_else(|| earlier.models.clone());
        self.version = self.version.or_else(|| earlier.version.clone());
        self.metrics = self.metrics.or_else(|| earlier.metrics.clone());
        self.published_routes = self
            .published_routes
            .or_else(|| earlier.published_routes.clone());
        self
    }

    /// The first model of `/v1/models`.
    pub fn first_model(&self) -> Option<&Value> {
        self.models.as_ref()?.get("data")?.as_array()?.first()
    }

    /// The ids `/v1/models` lists.
    pub fn model_ids(&self) -> Vec<&str> {
        self.models.as_ref().map(model_ids).unwrap_or_default()
    }

    /// The server-info document, if one answered.
    pub fn server_info(&self) -> Option<&Value> {
        self.server_info.as_ref().map(|(_, info)| info)
    }

    /// Which engine the answers name (`base::engine::detect`'s one precedence).
    pub fn engine(&self) -> Option<Engine> {
        let names: Vec<&str> = self
            .metrics
            .as_deref()
            .map(|page| exposition::samples(page).map(|s| s.name).collect())
            .unwrap_or_default();
        let mut routes: Vec<&str> = Vec::new();
        if let Some((route, _)) = &self.server_info {
            routes.push(route);
        }
        if self.model_info.is_some() {
            // Which engine's route gave it is not kept: every engine's counts as answered.
            routes.extend(engine::model_info_routes());
        }
        engine::detect(&Evidence {
            owned_by: self
                .first_model()
                .and_then(|m| m.get("owned_by"))
                .and_then(Value::as_str),
            metric_names: &names,
            answered: &routes,
            lists_models: self.models.is_some(),
        })
    }
}

impl Answers {
    /// The version the server says: its engine's server-info key, else its version document's
    /// `version`.
    pub fn engine_version(&self) -> Option<&str> {
        let key = self.engine().and_then(|e| e.spec().describe.version_key);
        key.and_then(|key| self.server_info()?.get(key)?.as_str())
            .or_else(|| self.version.as_ref()?.get("version")?.as_str())
    }

    /// The route table the server is held to: its engine's, for the version it says and the
    /// frontend its version document names (`None` until a read named the engine).
    pub fn served_routes(&self) -> Option<ServedRoutes> {
        let writes_key = |key: &str| {
            self.version
                .as_ref()
                .is_some_and(|version| version.get(key).is_some())
        };
        self.engine()?
            .route_table(self.engine_version(), writes_key)
    }

    /// The routes the server publishes that the data port would refuse as unknown behind
    /// `served` (no table of its engine, nor any other engine's, declares them); `None` when it
    /// published none.
    pub fn unclassified_routes(&self, served: Option<ServedRoutes>) -> Option<Vec<PublishedRoute>> {
        let published = self.published_routes.as_ref()?;
        Some(
            published
                .iter()
                .filter(|route| {
                    classify_route_served(&route.method, &route.path, served)
                        == RouteVerdict::Unknown
                })
                .cloned()
                .collect(),
        )
    }
}

/// What one read says of the upstream's routes: the table it is held to, the version it said
/// (visible ASCII, at most 64 characters), and the routes it publishes that no table
/// classifies (`None`: it published none, or the read could not tell).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteFacts {
    pub served: Option<ServedRoutes>,
    pub version: Option<String>,
    pub unclassified: Option<Vec<PublishedRoute>>,
}

impl RouteFacts {
    /// Whether the server publishes `method` on the normalised `path` and no table classifies
    /// it (`HEAD` is taken as `GET`, as the tables take it).
    pub fn publishes_unclassified(&self, method: &str, path: &str) -> bool {
        let method = if method == "HEAD" { "GET" } else { method };
        self.unclassified
            .iter()
            .flatten()
            .any(|route| route.method == method && engine::template_matches(&route.path, path))
    }
}

impl Answers {
    /// The route facts of this read.
    pub fn route_facts(&self) -> RouteFacts {
        let served = self.served_routes();
        RouteFacts {
            served,
            version: self.engine_version().map(|version| {
                version
                    .chars()
                    .filter(char::is_ascii_graphic)
                    .take(64)
                    .collect()
            }),
            unclassified: self.unclassified_routes(served),
        }
    }
}

/// The `id`s of an OpenAI-style model list (`{"data": [{"id": …}]}`).
pub fn model_ids(list: &Value) -> Vec<&str> {
    list.get("data")
        .and_then(Value::as_array)
        .map(|models| {
            models
                .iter()
                .filter_map(|m| m.get("id").and_then(Value::as_str))
                .filter(|id| !id.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_comes_from_the_answers_by_one_precedence() {
        let sglang_models = serde_json::json!({"object":"list","data":[{"id":"tiny-llama","object":"model","owned_by":"sglang","root":"tiny-llama","max_model_len":2048}]});
        let answers = Answers {
            models: Some(sglang_models),
            ..Answers::default()
        };
        assert_eq!(answers.engine(), Some(Engine::SGLANG));
        assert_eq!(answers.model_ids(), ["tiny-llama"]);
        // A model list that names no engine, with vLLM's gauges: vLLM.
        let answers = Answers {
            models: Some(serde_json::json!({"data":[{"id":"m","owned_by":"me"}]})),
            metrics: Some("vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0\n".into()),
            ..Answers::default()
        };
        assert_eq!(answers.engine(), Some(Engine::VLLM));
        // Only a model info document: sglang.
        let answers = Answers {
            model_info: Some(serde_json::json!({"model_path": "/m"})),
            ..Answers::default()
        };
        assert_eq!(answers.engine(), Some(Engine::SGLANG));
        assert_eq!(Answers::default().engine(), None);
    }

    fn vllm(version: Value) -> Answers {
        Answers {
            models: Some(serde_json::json!({"data":[{"id":"m","owned_by":"vllm"}]})),
            version: Some(version),
            ..Answers::default()
        }
    }

    #[test]
    fn the_version_document_picks_the_table_and_the_frontend() {
        let table = |answers: &Answers| {
            answers
                .served_routes()
                .map(|s| (s.table.version, s.table.frontend.name, s.fit.as_str()))
        };
        let python = vllm(serde_json::json!({"version": "0.33.0"}));
        assert_eq!(python.engine_version(), Some("0.33.0"));
        assert_eq!(table(&python), Some(("0.33", "python", "exact")));
        let rust =
            vllm(serde_json::json!({"version": "0.34.0", "rust_frontend_version": "0.34.0"}));
        assert_eq!(table(&rust), Some(("0.34", "rust", "exact")));
        let newer = vllm(serde_json::json!({"version": "0.40.1"}));
        assert_eq!(table(&newer), Some(("0.34", "python", "newer_than_newest")));
        assert_eq!(Answers::default().served_routes(), None);
    }

    #[test]
    fn published_routes_no_table_classifies_are_named() {
        let openapi = serde_json::json!({"openapi": "3.1.0", "paths": {
            "/v1/chat/completions": {"post": {}},
            "/v1/responses/{response_id}": {"get": {}},
            "/v1/secret_sauce": {"post": {}, "get": {}},
            "/reset_prefix_cache": {"post": {}},
            "not-a-path": {"get": {}},
        }});
        let mut answers = vllm(serde_json::json!({"version": "0.34.0"}));
        answers.published_routes = published_routes(&openapi);
        assert_eq!(answers.published_routes.as_ref().map(Vec::len), Some(5));
        let unclassified = answers.unclassified_routes(answers.served_routes());
        let named: Vec<String> = unclassified
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(named, ["GET /v1/secret_sauce", "POST /v1/secret_sauce"]);
        assert_eq!(published_routes(&serde_json::json!({"info": {}})), None);
    }
}
