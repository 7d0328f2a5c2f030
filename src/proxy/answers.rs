//! What one read of an upstream's self-description answered ([`Answers`], `describe` makes it),
//! and what the answers say: the models it lists, the engine it is (`base::engine::detect`'s one
//! precedence). Pure.

use serde_json::Value;

use crate::base::engine::{self, Engine, Evidence};
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
}
