//! Whether an upstream sends usage to streams that did not ask for it.
//!
//! sglang `--stream-response-default-include-usage` sends the final usage chunk to every stream;
//! vLLM `--enable-force-include-usage` sends usage on every chunk and the final usage chunk to
//! every stream. tokentap must then leave that usage to the client (it is the server's, not
//! tokentap's injection): the proxy passes [`super::upstream::Upstream::server_usage`] to
//! `stream::request::injection`. The setting is per upstream (`sends_usage_unasked`: `"final"`,
//! `"every_chunk"`); with `"auto"` each read of the upstream (`describe`) looks for the key its
//! engine says it under in its server info (`base::engine`'s `usage.unasked_key`: sglang's
//! `stream_response_default_include_usage`, meaning `"final"`). An engine that does not say
//! (vLLM does not expose its flag over HTTP) stays no, and the operator sets `"every_chunk"`.

use super::answers::Answers;

/// What the answers say of the flag: `Some(flag)` when the server's engine says it under its
/// key, `None` when it does not say.
pub fn from_answers(answers: &Answers) -> Option<bool> {
    let key = answers.engine()?.spec().usage.unasked_key?;
    answers.server_info()?.get(key)?.as_bool()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_info(info: serde_json::Value) -> Answers {
        Answers {
            server_info: Some(("/server_info", info)),
            ..Answers::default()
        }
    }

    #[test]
    fn reads_the_engines_flag_and_nothing_else() {
        let said = |v: serde_json::Value| from_answers(&with_info(v));
        assert_eq!(
            said(
                serde_json::json!({"stream_response_default_include_usage": true, "version": "0.5.6"})
            ),
            Some(true)
        );
        assert_eq!(
            said(serde_json::json!({"stream_response_default_include_usage": false})),
            Some(false)
        );
        assert_eq!(said(serde_json::json!({"version": "0.4.0"})), None);
        assert_eq!(
            said(serde_json::json!({"stream_response_default_include_usage": "yes"})),
            None
        );
        // Another engine's server info (vLLM's dev route) says nothing of it.
        let vllm = Answers {
            models: Some(serde_json::json!({"data":[{"id":"m","owned_by":"vllm"}]})),
            ..with_info(serde_json::json!({"stream_response_default_include_usage": true}))
        };
        assert_eq!(from_answers(&vllm), None);
    }
}
