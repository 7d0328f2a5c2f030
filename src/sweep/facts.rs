//! What the server says about itself ([`ServerFacts`]): what `discover.rs` reads through the
//! sweep's door, what `resolve.rs` plans from, and what a sweep's status and matrix show.

use serde::{Deserialize, Serialize};

use crate::base::engine::Engine;

/// What the server says about itself (`/v1/models`, `/server_info` or `/get_server_info`,
/// `/metrics`); `discover.rs` asks for them, `resolve.rs` plans from them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerFacts {
    /// Which engine answers (`base::engine`); `None` when nothing said.
    #[serde(default, with = "crate::base::engine::by_name")]
    pub engine: Option<Engine>,
    pub engine_version: Option<String>,
    /// The first model `/v1/models` lists.
    pub served_model: Option<String>,
    pub model_path: Option<String>,
    /// Max prompt + output tokens (`max_model_len`, `context_length`).
    pub context_length: Option<u64>,
    /// sglang's `max_req_input_len`: a prompt must be shorter than this (context − 5 when the
    /// KV cache holds a whole context).
    #[serde(default)]
    pub max_input_tokens: Option<u64>,
    /// KV cache in tokens, and where that figure came from.
    pub kv_budget_tokens: Option<u64>,
    pub kv_source: Option<String>,
    /// The engine's running-requests gauge answers on `/metrics`.
    pub has_running_gauge: bool,
    /// Any of the discovery requests got a successful answer.
    #[serde(default)]
    pub answered: bool,
    /// Labels a server may offer (the simulator does).
    pub hardware: Option<String>,
    pub gpu_count: Option<u32>,
    pub quantization: Option<String>,
    /// The upstream's configuration id (`upstream_identity`) when the sweep began, if read.
    #[serde(default)]
    pub fingerprint: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_read_back_by_engine_name_and_older_documents_still_read() {
        let facts = ServerFacts {
            engine: Some(Engine::VLLM),
            context_length: Some(32_768),
            answered: true,
            ..ServerFacts::default()
        };
        let text = serde_json::to_string(&facts).unwrap();
        assert!(text.contains(r#""engine":"vllm""#), "{text}");
        assert_eq!(serde_json::from_str::<ServerFacts>(&text).unwrap(), facts);
        // A document from before `answered`, `max_input_tokens` and `fingerprint`, naming an
        // engine this build does not know.
        let older = r#"{"engine":"someday","engine_version":null,"served_model":"m","model_path":null,"context_length":4096,"kv_budget_tokens":null,"kv_source":null,"has_running_gauge":true,"hardware":null,"gpu_count":null,"quantization":null}"#;
        let read: ServerFacts = serde_json::from_str(older).unwrap();
        assert_eq!(read.engine, None);
        assert_eq!(read.context_length, Some(4096));
        assert!(read.has_running_gauge && !read.answered);
        assert_eq!((read.max_input_tokens, read.fingerprint), (None, None));
    }
}
