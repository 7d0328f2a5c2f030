//! A context's scout: one request of `max_tokens` 1 with a cold prompt gives the prefill row
//! and warms the prompt cache; its prompt is the one the context's cells reuse. On the first
//! token-id request the server refuses (by the failure's type: a 4xx/5xx or an error event), a
//! `--prompt auto` sweep falls back to text prompts calibrated with the server's tokenizer.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use tokio::sync::watch;
use tokio::time::Instant;

use super::state::ScoutOutcome;
use super::state::{
    Runner, COMPLETIONS_PATH, SCOUT_LIMIT_BASE, SCOUT_MAX_TOKENS, SLOWEST_PREFILL_TOK_S,
};
use super::streams::RequestTemplate;
use crate::base::error::error_chain;
use crate::matrix::units::context_label;
use crate::matrix::{CellStatus, PrefillRow};
use crate::sweep::cell::prefill_row;
use crate::sweep::plan::{PrefillTarget, PromptMode};
use crate::sweep::status::SweepState;
use crate::synthetic::prompt::{
    calibrated_text_prompt, token_id_pool, token_id_prompt, Prompt, PromptKind,
};
use crate::synthetic::{StreamEnd, StreamFailure, StreamPhase, StreamRequest, StreamSignals};

impl Runner {
    /// Learns which token ids the served model has (its `/tokenize`), so that token-id prompts
    /// are valid on any vocabulary, not only on the large ones where 1000–9999 are.
    pub(super) async fn harvest_token_ids(&mut self) {
        match token_id_pool(&*self.path, self.tokenizers(), &self.plan.model, &self.id).await {
            Ok(pool) => {
                self.note(format!(
                    "Token-id prompts draw from {} ids the server's tokenizer produced ({}–{})",
                    pool.len(),
                    pool.first().copied().unwrap_or_default(),
                    pool.last().copied().unwrap_or_default()
                ));
                self.scout.id_pool = Some(Arc::from(pool));
            }
            Err(error) => self.note(format!(
                "Token-id prompts use ids 1000–9999: no vocabulary from /tokenize or /extras/tokenize ({error})"
            )),
        }
    }

    fn rid(&self, what: &str) -> Arc<str> {
        Arc::from(format!("{}{what}", self.tag_prefix))
    }

    /// How the requests of this sweep look for `prompt`.
    pub(super) fn template(&self, prompt: &Prompt, max_tokens: u64) -> RequestTemplate {
        RequestTemplate {
            slo_header: self
                .plan
                .slo_header
                .as_deref()
                .and_then(|text| HeaderValue::from_str(text).ok()),
            model_json: self.scout.model_json.clone(),
            prompt: prompt.clone(),
            max_tokens,
            id_field: self.abort_route().map(|abort| abort.id_field),
            shape: None,
        }
    }

    async fn make_prompt(&self, step: PrefillTarget) -> Result<Prompt, String> {
        match self.scout.kind {
            PromptKind::TokenIds => Ok(token_id_prompt(
                self.scout.seed,
                step.context,
                step.prompt_tokens,
                self.scout.id_pool.as_deref(),
            )),
            PromptKind::Text => calibrated_text_prompt(
                &*self.path,
                self.tokenizers(),
                &self.plan.model,
                &self.id,
                step.context,
                step.prompt_tokens,
            )
            .await
            .map_err(|error| error_chain(&error)),
        }
    }

    /// The scout of one context: the prefill row, and the prompt the cells reuse (or why
    /// there is none: the scout failed or was cancelled).
    pub(super) async fn scout_step(&mut self, step: PrefillTarget) -> ScoutOutcome {
        let mut tried_text = false;
        loop {
            let prompt = match self.make_prompt(step).await {
                Ok(prompt) => prompt,
                Err(reason) => {
                    self.finish_scout(step, prefill_row(step.context, None, Some(&reason)));
                    return ScoutOutcome::Failed(reason);
                }
            };
            let rid = self.rid(&format!("prefill-{}", step.context));
            let end = self
                .one_request(&prompt, SCOUT_MAX_TOKENS, Arc::clone(&rid))
                .await;
            let record = self.records.take(&rid);
            match end {
                StreamEnd::Stopped => return ScoutOutcome::Cancelled,
                StreamEnd::Failed(failure) => {
                    // A refusal: any 4xx/5xx (llama-cpp-python answers token ids with 500), or
                    // (vLLM) a 200 whose stream is only an error event. Only the first token-id
                    // request gets here, so a server fault is retried once, with text.
                    let reason = failure.to_string();
                    if self.plan.prompt == PromptMode::Auto
                        && self.scout.kind == PromptKind::TokenIds
                        && !self.scout.token_ids_work
                        && failure.is_refusal()
                        && !tried_text
                    {
                        tried_text = true;
                        self.scout.kind = PromptKind::Text;
                        self.note(format!(
                            "The server refused a token-id prompt ({reason}); prompts are text calibrated with its tokenizer (/tokenize, /extras/tokenize, else a probe request's usage)"
                        ));
                        continue;
                    }
                    self.finish_scout(step, prefill_row(step.context, None, Some(&reason)));
                    return ScoutOutcome::Failed(reason);
                }
                StreamEnd::Completed { .. } => {
                    if prompt.kind == PromptKind::TokenIds {
                        self.scout.token_ids_work = true;
                    }
                    let row = prefill_row(step.context, record.as_deref(), None);
                    if let Some(reported) = row.prompt_tokens {
                        if reported != prompt.tokens {
                            self.note(format!(
                                "{}: the server counted {reported} prompt tokens for a prompt of {} {}",
                                context_label(step.context),
                                prompt.tokens,
                                match prompt.kind {
                                    PromptKind::TokenIds => "token ids",
                                    PromptKind::Text => "tokens by its tokenizer",
                                }
                            ));
                        }
                    }
                    if let Some(rate) = row.prompt_tok_s {
                        self.progress.clock.prefill_tok_s = Some(rate);
                    }
                    let failure = match &row.status {
                        CellStatus::Error(reason) => Some(reason.clone()),
                        _ => None,
                    };
                    self.finish_scout(step, row);
                    return match failure {
                        None => ScoutOutcome::Ready(prompt),
                        Some(reason) => ScoutOutcome::Failed(reason),
                    };
                }
            }
        }
    }

    fn finish_scout(&mut self, step: PrefillTarget, row: PrefillRow) {
        self.set_prefill(row);
        if let Some(index) = self
            .progress
            .clock
            .scouts_left
            .iter()
            .position(|&t| t == step.prompt_tokens)
        {
            self.progress.clock.scouts_left.remove(index);
        }
        self.progress.clock.done += 1;
        self.publish(SweepState::Running, None);
    }

    /// One request to its end (the scout), cancellable.
    async fn one_request(&self, prompt: &Prompt, max_tokens: u64, rid: Arc<str>) -> StreamEnd {
        let (phase_tx, phase_rx) = watch::channel(StreamPhase::Running);
        let template = self.template(prompt, max_tokens);
        let request = StreamRequest {
            path: COMPLETIONS_PATH,
            body: template.body(&rid),
            tag: Arc::clone(&rid),
            slo_header: template.slo_header,
        };
        let signals = Arc::new(StreamSignals::default());
        let stream = self.path.stream(request, phase_rx, signals);
        tokio::pin!(stream);
        let mut cancel = self.cancel.clone();
        let limit = SCOUT_LIMIT_BASE + Duration::from_secs(prompt.tokens / SLOWEST_PREFILL_TOK_S);
        let deadline = Instant::now() + limit;
        loop {
            tokio::select! {
                end = &mut stream => return end,
                () = tokio::time::sleep_until(deadline) => {
                    self.abort_rids(std::slice::from_ref(&rid)).await;
                    let _ = phase_tx.send(StreamPhase::Disconnect);
                    let _ = (&mut stream).await;
                    return StreamEnd::Failed(StreamFailure::Timeout {
                        limit_s: limit.as_secs(),
                    });
                }
                changed = cancel.changed() => {
                    if changed.is_err() || *cancel.borrow() {
                        self.abort_rids(std::slice::from_ref(&rid)).await;
                        let _ = phase_tx.send(StreamPhase::Disconnect);
                        return (&mut stream).await;
                    }
                }
            }
        }
    }
}
