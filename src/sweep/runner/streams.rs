//! A cell's streams: the slot tasks (one stream at a time each, restarted when it completes),
//! the book they share with the runner (one lock, taken when a stream starts or ends, never per
//! event), the request bodies, stopping them (abort by rid, then disconnect), the server's
//! load and the sampler that reads it during a window.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::state::{
    Runner, BODY_FIELDS_BYTES, COMPLETIONS_PATH, CONTROL_TIMEOUT, SAMPLES_PER_WINDOW,
    SAMPLE_EVERY_MAX, SAMPLE_EVERY_MIN,
};
use crate::base::engine::{Abort, Engine, Tokenize};
use crate::base::json::push_json_string;
use crate::base::lock::lock;
use crate::sweep::shape::ContextShape;
use crate::synthetic::prompt::{mix, run_seed, token_ids, Prompt, PromptKind};
use crate::synthetic::{
    DataPath, LoadGauges, ServerLoad, StreamEnd, StreamPhase, StreamRequest, StreamSignals,
};

impl Runner {
    /// The engine's targeted abort (sglang `/abort_request` by rid), if it has one.
    pub(super) fn abort_route(&self) -> Option<Abort> {
        self.plan.engine.and_then(|engine| engine.spec().abort)
    }

    /// The tokenizer endpoints to count prompts with: the engine's, else those of a server it
    /// cannot name.
    pub(super) fn tokenizers(&self) -> &'static [Tokenize] {
        self.plan
            .engine
            .map(|engine| engine.spec().tokenize)
            .filter(|t| !t.is_empty())
            .unwrap_or(Engine::OPENAI.spec().tokenize)
    }

    /// The engine's targeted abort for each rid (never all requests), concurrently, bounded.
    pub(super) async fn abort_rids(&self, rids: &[Arc<str>]) {
        let Some(how) = self.abort_route() else {
            return;
        };
        if rids.is_empty() {
            return;
        }
        self.path.abort(how, rids, CONTROL_TIMEOUT).await;
    }

    /// How this sweep reads the server's running and queued gauges (`None` without them).
    pub(super) fn server_load_reader(&self) -> Option<ServerLoad> {
        let metrics = self.plan.engine?.spec().metrics;
        let running = metrics.running.first().copied()?;
        self.facts.has_running_gauge.then(|| ServerLoad {
            path: Arc::clone(&self.path),
            model: Arc::from(self.plan.model.as_str()),
            gauges: LoadGauges {
                running,
                queued: metrics.queued.first().copied(),
                timeout: CONTROL_TIMEOUT,
            },
        })
    }

    /// The server's running and queued gauges (None without metrics).
    pub(super) async fn server_load(&self) -> Option<(f64, f64)> {
        self.server_load_reader()?.read().await
    }

    /// Has the upstream's scraper read the server's whole state now (running, queued, KV cache,
    /// prefix hits: the requests' "server state" figures are means of what it read), so the
    /// state before a phase change does not stand for what follows it (`server_load`).
    pub(super) async fn refresh_server_state(&self) {
        let model: Arc<str> = Arc::from(self.plan.model.as_str());
        self.path.refresh_server_state(&model).await;
    }

    /// Samples the running gauge during the window (a task of its own, so a slow scrape never
    /// stretches the window).
    pub(super) fn spawn_sampler(&self, window: Duration) -> Sampler {
        let every = (window / SAMPLES_PER_WINDOW).clamp(SAMPLE_EVERY_MIN, SAMPLE_EVERY_MAX);
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let reader = self.server_load_reader();
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            let Some(reader) = reader else {
                return samples;
            };
            // Half a period in, so the samples sit in the middle of equal slices of the window.
            let mut next = Instant::now() + every / 2;
            loop {
                tokio::select! {
                    () = tokio::time::sleep_until(next) => {}
                    _ = stop_rx.changed() => return samples,
                }
                next += every;
                let at = Instant::now();
                if let Some((running, _)) = reader.read().await {
                    samples.push((at, running));
                }
                if *stop_rx.borrow() {
                    return samples;
                }
            }
        });
        Sampler {
            stop: stop_tx,
            task,
        }
    }
}

pub(super) struct Sampler {
    pub(super) stop: watch::Sender<bool>,
    pub(super) task: tokio::task::JoinHandle<Vec<(Instant, f64)>>,
}

impl Sampler {
    pub(super) async fn finish(self) -> Vec<(Instant, f64)> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// What the streams of one cell share with the runner. One lock: the slots take it when a
/// stream starts or ends (never per event), the runner when it polls for a failure.
#[derive(Default)]
pub(super) struct CellShared {
    pub(super) signals: Arc<StreamSignals>,
    pub(super) book: Mutex<CellBook>,
    /// Woken when a stream fails, so the window stops at once.
    pub(super) failed: Notify,
}

/// The cell's streams so far.
#[derive(Default)]
pub(super) struct CellBook {
    /// Tags (rids) of every stream started, in order, and whether it is still running.
    pub(super) streams: Vec<(Arc<str>, bool)>,
    /// When each stream that finished by itself did.
    pub(super) completions: Vec<Instant>,
    /// Why streams failed.
    pub(super) failures: Vec<String>,
}

/// What a cell's streams did, read once they have all ended.
pub(super) struct EndedStreams {
    pub(super) tags: Vec<Arc<str>>,
    pub(super) completions: Vec<Instant>,
    pub(super) failures: Vec<String>,
}

impl CellShared {
    pub(super) fn book(&self) -> std::sync::MutexGuard<'_, CellBook> {
        lock(&self.book)
    }

    /// Registers a new stream of `slot` and returns its index and tag. The serial in the tag
    /// counts the cell's streams in the order they started.
    pub(super) fn start_stream(
        &self,
        prefix: &str,
        slot: usize,
        restarts: usize,
    ) -> (usize, Arc<str>) {
        let mut book = self.book();
        let serial = book.streams.len();
        let tag: Arc<str> = Arc::from(format!("{prefix}{slot}-{restarts}-{serial}"));
        book.streams.push((Arc::clone(&tag), true));
        (serial, tag)
    }

    /// The stream `index` ended: completed at `completed` (by itself), or failed with a reason.
    pub(super) fn end_stream(
        &self,
        index: usize,
        completed: Option<Instant>,
        failure: Option<String>,
    ) {
        let mut book = self.book();
        if let Some((_, running)) = book.streams.get_mut(index) {
            *running = false;
        }
        book.completions.extend(completed);
        if let Some(reason) = failure {
            book.failures.push(reason);
            drop(book);
            self.failed.notify_waiters();
        }
    }

    pub(super) fn fail(&self, reason: String) {
        self.book().failures.push(reason);
        self.failed.notify_waiters();
    }

    pub(super) fn has_failed(&self) -> bool {
        !self.book().failures.is_empty()
    }

    /// Tags of the streams still running (to abort them by rid).
    pub(super) fn live(&self) -> Vec<Arc<str>> {
        self.book()
            .streams
            .iter()
            .filter(|(_, running)| *running)
            .map(|(tag, _)| Arc::clone(tag))
            .collect()
    }

    pub(super) fn ended(&self) -> EndedStreams {
        let book = self.book();
        EndedStreams {
            tags: book
                .streams
                .iter()
                .map(|(tag, _)| Arc::clone(tag))
                .collect(),
            completions: book.completions.clone(),
            failures: book.failures.clone(),
        }
    }
}

/// How a slot builds its requests.
pub(super) struct RequestTemplate {
    /// The `x-tokentap-slo` value every stream carries (the plan's), if any.
    pub(super) slo_header: Option<HeaderValue>,
    pub(super) model_json: String,
    pub(super) prompt: Prompt,
    pub(super) max_tokens: u64,
    /// The body field that carries the request id the engine aborts by, if it has one.
    pub(super) id_field: Option<&'static str>,
    /// The cell is shaped like production (`like_production`): each stream's cold tail and
    /// output length.
    pub(super) shape: Option<StreamShape>,
}

/// How a like-production cell's streams differ from one another (`sweep::shape`): the
/// prompt's first tokens shared (its cached share, warmed by the scout), the rest unique to
/// the stream, and an output length drawn from production's; each from the stream's tag, so
/// a restarted stream gets a fresh tail.
pub(super) struct StreamShape {
    /// The prompt's JSON up to its shared tokens, open (`[12,34,`), built once per cell.
    shared_json: Arc<str>,
    /// The whole prompt (the scout's: warm), for the streams that are warm.
    whole_json: Arc<str>,
    /// Tokens of the cold, unique rest.
    unique_tokens: u64,
    context: u64,
    /// The run's seed: the tails of two runs differ.
    seed: u64,
    pool: Option<Arc<[u64]>>,
    production: ContextShape,
}

impl StreamShape {
    /// The shape of a token-id `prompt` of `context` for `production`'s share (`None` for
    /// text prompts: their tokens cannot be cut apart; they keep the seed method's prompt).
    pub(super) fn new(
        prompt: &Prompt,
        context: u64,
        seed: u64,
        pool: Option<Arc<[u64]>>,
        production: &ContextShape,
    ) -> Option<Self> {
        if prompt.kind != PromptKind::TokenIds {
            return None;
        }
        let shared_tokens =
            ((prompt.tokens as f64) * production.cold_cached_share()).round() as u64;
        let shared_tokens = shared_tokens.min(prompt.tokens);
        let body = prompt.json.strip_prefix('[')?.strip_suffix(']')?;
        let mut shared_json = String::with_capacity(body.len() + 1);
        shared_json.push('[');
        for id in body.split(',').take(shared_tokens as usize) {
            shared_json.push_str(id);
            shared_json.push(',');
        }
        Some(Self {
            shared_json: Arc::from(shared_json),
            whole_json: Arc::clone(&prompt.json),
            unique_tokens: prompt.tokens - shared_tokens,
            context,
            seed,
            pool,
            production: production.clone(),
        })
    }

    /// The stream's seed from its tag.
    fn stream_seed(&self, rid: &str) -> u64 {
        mix(self.seed ^ run_seed(rid))
    }

    /// The stream's prompt: the scout's whole (warm) for production's share of warm streams,
    /// else the shared part, then its own ids. The serial is the tag's last number (the
    /// cell's streams in start order).
    fn prompt_json(&self, rid: &str) -> String {
        use std::fmt::Write as _;
        let serial = rid
            .rsplit('-')
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| self.stream_seed(rid));
        if self.production.warm_stream(serial) {
            return self.whole_json.to_string();
        }
        let mut json =
            String::with_capacity(self.shared_json.len() + self.unique_tokens as usize * 6 + 1);
        json.push_str(&self.shared_json);
        let ids = token_ids(
            self.stream_seed(rid),
            self.context,
            self.unique_tokens,
            self.pool.as_deref(),
        );
        for (i, id) in ids.enumerate() {
            if i > 0 {
                json.push(',');
            }
            let _ = write!(json, "{id}");
        }
        if self.unique_tokens == 0 {
            // The shared part ends with a comma; a prompt shared whole drops it.
            json.pop();
        }
        json.push(']');
        json
    }
}

impl RequestTemplate {
    pub(super) fn body(&self, rid: &str) -> Bytes {
        let mut body = String::with_capacity(self.prompt.json.len() + BODY_FIELDS_BYTES);
        let max_tokens = match &self.shape {
            Some(shape) => shape
                .production
                .output_for(shape.stream_seed(rid), self.max_tokens),
            None => self.max_tokens,
        };
        body.push_str("{\"model\":");
        body.push_str(&self.model_json);
        body.push_str(&format!(
            ",\"max_tokens\":{},\"temperature\":0,\"ignore_eos\":true,\"stream\":true,\"stream_options\":{{\"include_usage\":true,\"continuous_usage_stats\":true}}",
            max_tokens
        ));
        if let Some(field) = self.id_field {
            body.push(',');
            push_json_string(&mut body, field);
            body.push(':');
            push_json_string(&mut body, rid);
        }
        body.push_str(",\"prompt\":");
        match &self.shape {
            Some(shape) => body.push_str(&shape.prompt_json(rid)),
            None => body.push_str(&self.prompt.json),
        }
        body.push('}');
        Bytes::from(body)
    }
}

/// One of a cell's C streams: sends, and while the cell runs, restarts a stream that completes.
pub(super) async fn run_slot(
    path: Arc<dyn DataPath>,
    shared: Arc<CellShared>,
    phase: watch::Receiver<StreamPhase>,
    slot: usize,
    prefix: String,
    template: RequestTemplate,
) {
    let mut restarts = 0usize;
    loop {
        if *phase.borrow() != StreamPhase::Running {
            return;
        }
        let (index, tag) = shared.start_stream(&prefix, slot, restarts);
        let request = StreamRequest {
            path: COMPLETIONS_PATH,
            body: template.body(&tag),
            tag,
            slo_header: template.slo_header.clone(),
        };
        let end = path
            .stream(request, phase.clone(), Arc::clone(&shared.signals))
            .await;
        match end {
            StreamEnd::Completed { at } => {
                shared.end_stream(index, Some(at), None);
                restarts += 1;
            }
            StreamEnd::Stopped => {
                shared.end_stream(index, None, None);
                return;
            }
            StreamEnd::Failed(failure) => {
                shared.end_stream(index, None, Some(failure.to_string()));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cell_book_keeps_streams_in_start_order_and_wakes_the_window_on_a_failure() {
        let shared = CellShared::default();
        let (first, first_tag) = shared.start_stream("p-8192x2-", 0, 0);
        let (second, second_tag) = shared.start_stream("p-8192x2-", 1, 0);
        let (third, third_tag) = shared.start_stream("p-8192x2-", 0, 1);
        assert_eq!(&*first_tag, "p-8192x2-0-0-0");
        assert_eq!(&*second_tag, "p-8192x2-1-0-1");
        assert_eq!(&*third_tag, "p-8192x2-0-1-2");
        let at = Instant::now();
        shared.end_stream(first, Some(at), None);
        assert_eq!(
            shared.live(),
            [Arc::clone(&second_tag), Arc::clone(&third_tag)]
        );
        assert!(!shared.has_failed());

        let woken = shared.failed.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        shared.end_stream(second, None, Some("boom".to_owned()));
        assert!(shared.has_failed());
        tokio::time::timeout(Duration::from_secs(5), woken)
            .await
            .expect("a failure wakes the window");

        shared.end_stream(third, None, None);
        assert!(shared.live().is_empty());
        let ended = shared.ended();
        assert_eq!(ended.tags, [first_tag, second_tag, third_tag]);
        assert_eq!(ended.completions, [at]);
        assert_eq!(ended.failures, ["boom"]);
    }
}
