//! A scripted [`DataPath`] for the runner's tests: streams that run until the runner stops them
//! (or ignore its abort), `/tokenize` counting four characters a token, a record published
//! for every scout it completes (as the metering path would), production in flight and the
//! server's load as functions of what it has seen, aborts that answer or hang.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::base::{Route, Source};
use crate::meter::buckets::Ladder;
use crate::meter::record::{Interference, RequestRecord, Timing, Tokens};
use crate::meter::RecordSink;
use crate::synthetic::client::{Answer, CallError};
use crate::synthetic::{
    BoxFuture, DataPath, LoadGauges, SinkScope, StreamEnd, StreamPhase, StreamRequest,
    StreamSignals,
};

pub(super) type Production = Box<dyn Fn(&FakeState) -> u64 + Send + Sync>;
pub(super) type Load = Box<dyn Fn(&FakeState) -> Option<(f64, f64)> + Send + Sync>;

/// What the fake data path holds and has seen.
pub(super) struct FakeState {
    pub(super) started: Instant,
    /// Production in flight, asked at every look.
    pub(super) production: Production,
    /// The server's running and queued requests, asked at every look.
    pub(super) load: Load,
    /// How the next scouts end (a completed scout, with its record, once this is empty).
    pub(super) scouts: Mutex<VecDeque<StreamEnd>>,
    /// Decode streams end only on a disconnect (as if the server ignored the abort).
    pub(super) streams_ignore_abort: bool,
    /// An abort never answers (bounded only by the runner's grace).
    pub(super) abort_hangs: bool,
    pub(super) sinks: Mutex<Vec<Arc<dyn RecordSink>>>,
    pub(super) bodies: Mutex<Vec<String>>,
    pub(super) live_streams: AtomicUsize,
    pub(super) disconnected: AtomicUsize,
    pub(super) aborted: AtomicUsize,
    pub(super) tokens: AtomicU64,
}

#[derive(Clone)]
pub(super) struct Fake(pub(super) Arc<FakeState>);

impl fmt::Debug for Fake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fake").finish_non_exhaustive()
    }
}

impl Fake {
    pub(super) fn builder(production: Production, load: Load) -> FakeBuilder {
        FakeBuilder(FakeState {
            started: Instant::now(),
            production,
            load,
            scouts: Mutex::default(),
            streams_ignore_abort: false,
            abort_hangs: false,
            sinks: Mutex::default(),
            bodies: Mutex::default(),
            live_streams: AtomicUsize::new(0),
            disconnected: AtomicUsize::new(0),
            aborted: AtomicUsize::new(0),
            tokens: AtomicU64::new(0),
        })
    }

    pub(super) fn bodies(&self) -> Vec<String> {
        self.0.bodies.lock().unwrap().clone()
    }
}

pub(super) struct FakeBuilder(FakeState);

impl FakeBuilder {
    pub(super) fn scouts(self, ends: Vec<StreamEnd>) -> Self {
        *self.0.scouts.lock().unwrap() = ends.into();
        self
    }

    pub(super) fn deaf_to_aborts(mut self) -> Self {
        self.0.streams_ignore_abort = true;
        self.0.abort_hangs = true;
        self
    }

    pub(super) fn build(self) -> Fake {
        Fake(Arc::new(self.0))
    }
}

/// Counts a decode stream live while it runs.
pub(super) struct Live(Arc<FakeState>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.live_streams.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The record the metering path would publish for a scout that got its token in 50 ms.
pub(super) fn scout_record(tag: Arc<str>, prompt_tokens: u64) -> Arc<RequestRecord> {
    let ttft = Some(Duration::from_millis(50));
    Arc::new(RequestRecord {
        labels: crate::meter::RequestLabels {
            route: Route::Completions,
            source: Source::Synthetic,
            tag: Some(tag),
            ..crate::meter::RequestLabels::for_test()
        },
        timing: Timing {
            started_at: SystemTime::now(),
            ttft,
            to_first_delivery: ttft,
            duration: Duration::from_millis(50),
            ..Timing::default()
        },
        tokens: Tokens {
            prompt: Some(prompt_tokens),
            cached: Some(0),
            completion: 1,
            completion_exact: true,
            events: 1,
            coalesced_events: 0,
            max: Some(1),
            ..Tokens::default()
        },
        interference: Interference {
            average_active: 1.0,
            ..Interference::default()
        },
        ..RequestRecord::for_test()
    })
}

/// The prompt's length in tokens as the fake counts it: ids one a token, text four characters.
pub(super) fn prompt_tokens(body: &str) -> u64 {
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    match &value["prompt"] {
        serde_json::Value::Array(ids) => ids.len() as u64,
        serde_json::Value::String(text) => (text.len() as u64).div_ceil(4),
        _ => 0,
    }
}

impl DataPath for Fake {
    fn stream(
        &self,
        request: StreamRequest,
        mut phase: watch::Receiver<StreamPhase>,
        signals: Arc<StreamSignals>,
    ) -> BoxFuture<'static, StreamEnd> {
        let state = Arc::clone(&self.0);
        let body = String::from_utf8_lossy(&request.body).into_owned();
        state.bodies.lock().unwrap().push(body.clone());
        let scout = body.contains("\"max_tokens\":1,");
        Box::pin(async move {
            if scout {
                let scripted = state.scouts.lock().unwrap().pop_front();
                if let Some(end) = scripted {
                    return end;
                }
                let record = scout_record(Arc::clone(&request.tag), prompt_tokens(&body));
                for sink in state.sinks.lock().unwrap().iter() {
                    sink.record(&record);
                }
                return StreamEnd::Completed { at: Instant::now() };
            }
            state.live_streams.fetch_add(1, Ordering::SeqCst);
            let _live = Live(Arc::clone(&state));
            signals.first_outputs.fetch_add(1, Ordering::SeqCst);
            let deaf = state.streams_ignore_abort;
            let _ = phase
                .wait_for(|p| match p {
                    StreamPhase::Running => false,
                    StreamPhase::Aborting => !deaf,
                    StreamPhase::Disconnect => true,
                })
                .await;
            if *phase.borrow() == StreamPhase::Disconnect {
                state.disconnected.fetch_add(1, Ordering::SeqCst);
            }
            StreamEnd::Stopped
        })
    }

    fn call<'a>(
        &'a self,
        method: Method,
        path: &'a str,
        body: Option<Bytes>,
        _timeout: Duration,
    ) -> BoxFuture<'a, Result<Answer, CallError>> {
        Box::pin(async move {
            let body = String::from_utf8_lossy(&body.unwrap_or_default()).into_owned();
            let answer = if method == Method::POST && path == "/tokenize" {
                let count = prompt_tokens(&body);
                Answer {
                    status: StatusCode::OK,
                    body: Bytes::from(format!("{{\"count\":{count}}}")),
                }
            } else {
                Answer {
                    status: StatusCode::NOT_FOUND,
                    body: Bytes::from_static(b"{\"message\":\"not here\"}"),
                }
            };
            Ok(answer)
        })
    }

    fn collect(&self, sink: Arc<dyn RecordSink>) -> SinkScope {
        self.0.sinks.lock().unwrap().push(Arc::clone(&sink));
        let state = Arc::clone(&self.0);
        SinkScope::new(move || {
            state
                .sinks
                .lock()
                .unwrap()
                .retain(|s| !Arc::ptr_eq(s, &sink));
        })
    }

    fn production_in_flight(&self) -> u64 {
        (self.0.production)(&self.0)
    }

    fn synthetic_tokens(&self) -> u64 {
        // Ten tokens a look: every window sees output.
        self.0.tokens.fetch_add(10, Ordering::SeqCst)
    }

    fn ladders(&self) -> (Ladder, Ladder) {
        (
            Ladder::contexts(&[8192]).unwrap(),
            Ladder::concurrency(&[1, 2]).unwrap(),
        )
    }

    fn server_load<'a>(
        &'a self,
        _model: &'a Arc<str>,
        _gauges: &'a LoadGauges,
    ) -> BoxFuture<'a, Option<(f64, f64)>> {
        Box::pin(async move { (self.0.load)(&self.0) })
    }

    fn refresh_server_state<'a>(&'a self, _model: &'a Arc<str>) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    fn abort<'a>(
        &'a self,
        _how: crate::base::engine::Abort,
        rids: &'a [Arc<str>],
        _timeout: Duration,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.0.aborted.fetch_add(rids.len(), Ordering::SeqCst);
            if self.0.abort_hangs {
                std::future::pending::<()>().await;
            }
        })
    }

    fn describe(&self) -> BoxFuture<'_, crate::synthetic::Described> {
        Box::pin(async { crate::synthetic::Described::default() })
    }
}

/// Production in flight that is always `n`.
pub(super) fn production(n: u64) -> Production {
    Box::new(move |_| n)
}

/// A server that says it runs exactly what the sweep streams (and queues nothing).
pub(super) fn load_of_live_streams() -> Load {
    Box::new(|state| Some((state.live_streams.load(Ordering::SeqCst) as f64, 0.0)))
}
