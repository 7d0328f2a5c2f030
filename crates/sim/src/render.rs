//! Turns scheduler events into the bytes of the request's API: one [`Renderer`] per request
//! holds the output state every API shares and the stream state of its own API, and hands
//! each step to that API's module. Pure: never touches the scheduler's state, never does I/O.
use super::api::{generate, messages, openai, responses};
use super::error_body::write_stream_error;
use super::output::{FinishReason, Output, OutputSpec, Progress};
use super::request::Api;
use super::scheduler::Event;

/// Per-request output state.
#[derive(Debug)]
pub struct Renderer {
    output: Output,
    stream: ApiStream,
}

/// What an API remembers between the events of one stream.
#[derive(Debug)]
enum ApiStream {
    /// Chat completions, completions and `/generate` remember nothing of their own.
    Stateless,
    Messages(messages::MessagesStream),
    Responses(responses::ResponsesStream),
}

impl Renderer {
    pub fn new(spec: OutputSpec) -> Renderer {
        let stream = match spec.api {
            Api::Messages => ApiStream::Messages(messages::MessagesStream::default()),
            Api::Responses => ApiStream::Responses(responses::ResponsesStream::default()),
            Api::Chat | Api::Completion | Api::Generate => ApiStream::Stateless,
        };
        Renderer {
            output: Output::new(spec),
            stream,
        }
    }

    /// What a stream sends before any token: Responses' `response.created` and
    /// `response.in_progress` (its headers go out at once); nothing on other APIs.
    pub fn stream_preamble(&mut self) -> String {
        let mut out = String::new();
        if let (true, ApiStream::Responses(stream)) = (self.output.spec.stream, &mut self.stream) {
            stream.write_preamble(&self.output, &mut out);
        }
        out
    }

    /// Render one scheduler event into `out` (SSE bytes when streaming; nothing when
    /// not streaming, where [`Renderer::body`] gives the whole response at the end).
    pub fn on_event(&mut self, event: Event, out: &mut String) -> Progress {
        let (new_tokens, cached_tokens, finish) = match event {
            Event::Output {
                new_tokens,
                cached_tokens,
                finish,
            } => (new_tokens, cached_tokens, finish),
            Event::Rejected { message } => {
                // Only reachable on APIs whose headers are already out (vLLM, /generate,
                // /v1/messages, /v1/responses).
                if self.output.spec.stream {
                    match &mut self.stream {
                        ApiStream::Messages(_) => {
                            messages::write_error_events(self.output.spec.dialect, &message, out)
                        }
                        ApiStream::Responses(stream) => stream.write_error(&message, out),
                        ApiStream::Stateless => write_stream_error(out, &message),
                    }
                }
                return Progress::Done;
            }
            Event::Shed(cause) => {
                // Aborted while it waited, on an API whose headers are already out: the
                // abort's message and its 503 in an error event, then the end.
                let message = shed_message(cause);
                if self.output.spec.stream {
                    match &mut self.stream {
                        ApiStream::Messages(_) => {
                            messages::write_error_events(self.output.spec.dialect, message, out)
                        }
                        ApiStream::Responses(stream) => stream.write_error(message, out),
                        ApiStream::Stateless => {
                            out.push_str("data: {\"error\":{\"message\":");
                            crate::json_out::push_json_str(out, message);
                            out.push_str(",\"code\":503}}\n\ndata: [DONE]\n\n");
                        }
                    }
                }
                return Progress::Done;
            }
        };
        let step = self.output.advance(new_tokens, cached_tokens, finish);
        if self.output.spec.stream {
            let o = &self.output;
            match (&mut self.stream, o.spec.api) {
                (ApiStream::Messages(stream), _) => stream.write_step(o, &step, out),
                (ApiStream::Responses(stream), _) => stream.write_step(o, &step, out),
                (ApiStream::Stateless, Api::Generate) => generate::write_step(o, &step, out),
                (ApiStream::Stateless, _) => openai::write_step(o, &step, out),
            }
        }
        match step.finish {
            Some(reason) => {
                self.output.finish = Some(reason);
                if step.stopped {
                    Progress::DoneByStopString
                } else {
                    Progress::Done
                }
            }
            None => Progress::Continue,
        }
    }

    /// The whole non-streaming response body, once the request has finished.
    pub fn body(&self) -> String {
        let mut out = String::new();
        let finish = self.output.finish.clone().unwrap_or(FinishReason::Abort);
        let o = &self.output;
        match o.spec.api {
            Api::Generate => generate::write_body(o, &finish, &mut out),
            Api::Messages => messages::write_body(o, &finish, &mut out),
            Api::Responses => responses::write_body(o, &finish, &mut out),
            Api::Chat | Api::Completion => openai::write_body(o, &finish, &mut out),
        }
        out
    }
}

/// What an engine tells a request it shed while the request waited.
fn shed_message(cause: crate::options::ShedCause) -> &'static str {
    match cause {
        crate::options::ShedCause::PreferredArrival => crate::error_body::SGLANG_PREFERRED_ARRIVAL,
        crate::options::ShedCause::QueuedRequests | crate::options::ShedCause::QueuedTokens => {
            crate::error_body::SGLANG_QUEUE_FULL
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Dialect;
    use crate::scheduler::Finish;
    use tokio::time::Instant;

    fn spec(api: Api, dialect: Dialect) -> OutputSpec {
        OutputSpec {
            api,
            dialect,
            stream: true,
            id: "abc".into(),
            created: 1767225600,
            model: "m".into(),
            include_usage: true,
            continuous_usage: false,
            prompt_tokens: 12,
            reasoning_tokens: 0,
            stop: vec![],
            eos_token_id: 7,
            enable_cache_report: false,
            request_seed: 1,
            started: Instant::now(),
            fingerprint: "vllm-0.32.0-tokentap".into(),
        }
    }

    fn out(tokens: u32, finish: Option<Finish>) -> Event {
        Event::Output {
            new_tokens: tokens,
            cached_tokens: 0,
            finish,
        }
    }

    #[test]
    fn sglang_chat_stream_matches_the_reference_shape() {
        let mut r = Renderer::new(spec(Api::Chat, Dialect::Sglang));
        let mut s = String::new();
        assert_eq!(r.on_event(out(1, None), &mut s), Progress::Continue);
        assert_eq!(
            r.on_event(out(1, Some(Finish::Length)), &mut s),
            Progress::Done
        );
        let lines: Vec<&str> = s.split("\n\n").filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 6, "{s}");
        assert_eq!(lines[0], "data: {\"id\":\"abc\",\"object\":\"chat.completion.chunk\",\"created\":1767225600,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]}");
        assert!(lines[1].starts_with("data: {\"id\":\"abc\",\"object\":\"chat.completion.chunk\",\"created\":1767225600,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"content\":\" "));
        assert_eq!(lines[3], "data: {\"id\":\"abc\",\"object\":\"chat.completion.chunk\",\"created\":1767225600,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null},\"logprobs\":null,\"finish_reason\":\"length\",\"matched_stop\":null}]}");
        assert_eq!(lines[4], "data: {\"id\":\"abc\",\"object\":\"chat.completion.chunk\",\"created\":1767225600,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"total_tokens\":14,\"completion_tokens\":2,\"prompt_tokens_details\":null,\"reasoning_tokens\":0,\"completion_tokens_details\":null}}");
        assert_eq!(lines[5], "data: [DONE]");
        for line in &lines[..5] {
            let _: serde_json::Value = serde_json::from_str(&line[6..]).unwrap();
        }
    }

    #[test]
    fn stop_string_truncates_and_finishes() {
        let mut sp = spec(Api::Completion, Dialect::Sglang);
        sp.stop = vec![FILLER_PROBE.to_owned()];
        let mut r = Renderer::new(sp);
        let mut s = String::new();
        let mut progress = Progress::Continue;
        for _ in 0..2000 {
            progress = r.on_event(out(3, None), &mut s);
            if progress != Progress::Continue {
                break;
            }
        }
        assert_eq!(progress, Progress::DoneByStopString);
        assert!(s.contains("\"finish_reason\":\"stop\",\"matched_stop\":\"model\""));
        assert!(!s.contains(" model\""));
    }

    const FILLER_PROBE: &str = "model";

    #[test]
    fn messages_stream_has_sglangs_event_shapes() {
        let mut sp = spec(Api::Messages, Dialect::Sglang);
        sp.id = "msg_1".into();
        sp.reasoning_tokens = 1;
        let mut r = Renderer::new(sp);
        let mut s = String::new();
        assert!(r.stream_preamble().is_empty());
        r.on_event(out(1, None), &mut s);
        assert_eq!(
            r.on_event(out(1, Some(Finish::Length)), &mut s),
            Progress::Done
        );
        let blocks: Vec<&str> = s.split("\n\n").filter(|b| !b.is_empty()).collect();
        assert_eq!(blocks[0], "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"usage\":{\"input_tokens\":12,\"output_tokens\":0,\"cache_read_input_tokens\":0}}}");
        assert_eq!(blocks[1], "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"},\"index\":0}");
        assert!(blocks[2].starts_with("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\" "));
        assert_eq!(
            blocks[3],
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}"
        );
        assert!(blocks[4].ends_with("{\"type\":\"text\",\"text\":\"\"},\"index\":1}"));
        assert!(blocks[5].contains("{\"type\":\"text_delta\",\"text\":\" "));
        assert!(blocks[5].ends_with("\"},\"index\":1}"));
        assert_eq!(blocks[7], "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"input_tokens\":12,\"output_tokens\":2,\"cache_read_input_tokens\":0}}");
        assert_eq!(
            blocks[8],
            "event: message_stop\ndata: {\"type\":\"message_stop\"}"
        );
        assert_eq!(blocks.len(), 9, "{s}");
        assert!(!s.contains("[DONE]"));
    }

    #[test]
    fn responses_stream_numbers_its_events() {
        let mut sp = spec(Api::Responses, Dialect::Sglang);
        sp.id = "resp_1".into();
        let mut r = Renderer::new(sp);
        let mut s = r.stream_preamble();
        assert!(s.starts_with("event: response.created\ndata: {\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"created_at\":1767225600,\"model\":\"m\",\"output\":[],\"status\":\"in_progress\",\"incomplete_details\":null,\"usage\":null},\"sequence_number\":0,\"type\":\"response.created\"}\n\n"), "{s}");
        r.on_event(out(2, Some(Finish::Length)), &mut s);
        let blocks: Vec<&str> = s.split("\n\n").filter(|b| !b.is_empty()).collect();
        let kinds: Vec<&str> = blocks
            .iter()
            .map(|b| &b["event: ".len()..b.find('\n').unwrap()])
            .collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        for (i, block) in blocks.iter().enumerate() {
            let data: serde_json::Value =
                serde_json::from_str(&block[block.find("data: ").unwrap() + 6..]).unwrap();
            assert_eq!(data["sequence_number"], i as u64);
            assert_eq!(data["type"], kinds[i]);
        }
        assert!(blocks[8].contains("\"usage\":{\"input_tokens\":12,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":2,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":14}"));
        assert!(!s.contains("[DONE]"));
    }

    #[test]
    fn vllm_chat_stream_puts_finish_on_last_delta() {
        let mut sp = spec(Api::Chat, Dialect::Vllm);
        sp.include_usage = false;
        sp.id = "chatcmpl-1".into();
        let mut r = Renderer::new(sp);
        let mut s = String::new();
        r.on_event(out(1, None), &mut s);
        r.on_event(out(1, Some(Finish::Length)), &mut s);
        let lines: Vec<&str> = s.split("\n\n").filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 4, "{s}");
        assert!(lines[0]
            .ends_with("\"finish_reason\":null}],\"prompt_token_ids\":null,\"prompt_text\":null}"));
        assert!(lines[2].contains("\"finish_reason\":\"length\",\"stop_reason\":null,\"token_ids\":null}],\"system_fingerprint\":\"vllm-0.32.0-tokentap\"}"));
    }
}
