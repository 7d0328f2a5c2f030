//! The simulated engine scheduler: one task per server that owns the wait queue, the
//! prefill queue, the cache-hit joiners and the running decode batch, and decides when
//! every request gets its tokens.
//!
//! It talks to request tasks only through channels: commands in (an unbounded mpsc),
//! per-request events out (one unbounded mpsc each), and a `watch` of counters for
//! `/metrics`. It never renders text or JSON, and never blocks: time passes only in
//! `sleep_until` against absolute deadlines, so a late wake-up is caught up on the next
//! step instead of accumulating.
//!
//! One scheduler iteration, like sglang's event loop:
//! 1. admit queued requests in queue order while both limits hold (first come first served,
//!    or by each request's `priority` under priority scheduling, ties by arrival: see
//!    [`QueueOrder`]):
//!    admitted < `max_running_requests`, and the KV reservation
//!    `Σ (prompt + min(max_new_tokens, 4096))` stays within `kv_tokens` (4096 is sglang's
//!    clip of the output estimate; the seed pages' "over capacity" rule is the same sum);
//!    a request that does not fit waits, and everything behind it waits too;
//! 2. each admitted prompt is looked up in the prefix cache ([`prefix_cache`]: blocks of
//!    `kv_block_size` tokens, `kv_tokens` of them at most, least recently used evicted
//!    first); it reports `cached_tokens` = its longest cached run of leading blocks, at most
//!    `prompt − 1` (sglang always recomputes the last prompt token);
//! 3. a prompt found whole (an identical prompt was cached) "joins": its first token comes
//!    `cached_ttft(context, batch)` after admission, where batch counts every admitted
//!    request (the largest seen while it joins), and it stalls nobody;
//! 4. any other prompt prefills its uncached tokens (`prompt − cached_tokens`: all of them
//!    when nothing was found) in chunks of at most `chunked_prefill_size` tokens (several
//!    requests may share a chunk), each chunk taking `tokens / prefill_rate(prompt)`, and
//!    its blocks enter the cache when its prefill ends; while chunks are pending no decode
//!    step runs, which is what makes TTFT and TBT rise when prompts arrive during decoding;
//! 5. otherwise one decode step of the whole running batch, lasting
//!    `step_time(mean prompt of the batch, batch size)`, gives each request its next accept
//!    length of tokens.
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::model::{natural_output_tokens, AcceptLengths, PerformanceModel};
use super::options::{QueueCaps, QueueOrder, ShedCause};
use super::profile::Profile;
use super::text::PrefixKeys;

pub mod prefix_cache;

use prefix_cache::PrefixCache;

/// sglang clips the output estimate used for admission at this many tokens
/// (`SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`).
pub const OUTPUT_RESERVATION_CLIP: u64 = 4096;

/// If the scheduler is this far behind its own schedule it restarts the schedule from now
/// instead of emitting a burst of catch-up steps.
const MAX_CATCH_UP: Duration = Duration::from_secs(1);

/// How a request ended, as the scheduler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// `max_new_tokens` reached.
    Length,
    /// The simulated model produced its end-of-sequence token.
    Eos,
    /// `/abort_request`.
    Abort,
}

/// What the scheduler tells one request.
#[derive(Debug)]
pub enum Event {
    /// `new_tokens` more tokens exist (the first event carries the first token).
    Output {
        new_tokens: u32,
        cached_tokens: u64,
        finish: Option<Finish>,
    },
    /// The request was refused before it ran (for example a duplicate `rid`).
    Rejected { message: String },
    /// The request was shed while it waited, before any token (sglang's abort of the
    /// least-preferred waiting request: [`QueueCaps::abort_least_preferred`]).
    Shed(ShedCause),
}

/// A request handed to the scheduler.
#[derive(Debug)]
pub struct Submission {
    pub id: u64,
    pub rid: String,
    pub prompt_tokens: u64,
    /// The prompt's block chain, looked up in and added to the prefix cache.
    pub prefix: PrefixKeys,
    pub max_new_tokens: u64,
    pub min_new_tokens: u64,
    pub ignore_eos: bool,
    /// Where it waits under priority scheduling (the engine's default already filled in for a
    /// request that named none); ignored under [`QueueOrder::Arrival`].
    pub priority: i64,
    /// Seeds the accept lengths and the natural output length (and, on the request side,
    /// the text), so identical requests behave identically under one server seed.
    pub request_seed: u64,
    pub events: mpsc::UnboundedSender<Event>,
    /// Answered at once: queued (`Ok`), or shed by a queue cap before it was queued.
    pub admission: oneshot::Sender<Result<(), ShedCause>>,
}

/// Commands from request tasks and the control routes.
#[derive(Debug)]
pub enum Command {
    Submit(Submission),
    /// The client went away or the request side finished it (stop string): free it now.
    Cancel(u64),
    AbortRid(String),
    AbortAll,
    /// Hand over (and reset) the schedule-lag samples, in microseconds.
    TakeLag(oneshot::Sender<Vec<u32>>),
}

/// Counters published after every scheduler iteration (read by `/metrics`, `/server_info`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SchedulerStats {
    pub running: usize,
    pub queued: usize,
    /// KV tokens held by admitted requests (prompt + generated).
    pub used_tokens: u64,
    pub kv_tokens: u64,
    /// Generated tokens per second over the last second or so.
    pub gen_throughput: f64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    /// Prompt tokens found in the prefix cache (`sglang:cached_tokens_total`,
    /// `vllm:prefix_cache_hits_total`); against `prompt_tokens_total`, the cache's hit rate in
    /// tokens, as both engines count it.
    pub cached_tokens_total: u64,
    /// Tokens the prefix cache holds now (at most `kv_tokens`).
    pub prefix_cache_tokens: u64,
    pub requests_total: u64,
    pub aborted_total: u64,
    /// Requests refused by [`QueueCaps::requests`] and by [`QueueCaps::tokens`]
    /// (`vllm:admission_rejections_total{reason}`).
    pub shed_by_requests: u64,
    pub shed_by_tokens: u64,
    /// Time admitted requests waited in the queue (`sglang:queue_time_seconds`,
    /// `vllm:request_queue_time_seconds`).
    pub queue_time: QueueTimes,
}

/// Every upper bound of sglang's `queue_time_seconds` and vLLM's request-latency buckets, in
/// order: the counts are kept per span between two of them, so each dialect's cumulative
/// buckets are sums of whole spans.
pub const QUEUE_TIME_BOUNDS: [f64; 46] = [
    0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0,
    10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 120.0, 200.0, 240.0, 300.0,
    400.0, 480.0, 500.0, 600.0, 700.0, 800.0, 900.0, 960.0, 1000.0, 1200.0, 1400.0, 1600.0, 1800.0,
    1920.0,
];

/// Queue times: count per span of [`QUEUE_TIME_BOUNDS`] (the last counts everything above),
/// their sum and number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueTimes {
    pub spans: [u64; QUEUE_TIME_BOUNDS.len() + 1],
    pub sum_s: f64,
    pub count: u64,
}

impl Default for QueueTimes {
    fn default() -> Self {
        Self {
            spans: [0; QUEUE_TIME_BOUNDS.len() + 1],
            sum_s: 0.0,
            count: 0,
        }
    }
}

impl QueueTimes {
    pub fn add(&mut self, seconds: f64) {
        let span = QUEUE_TIME_BOUNDS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(QUEUE_TIME_BOUNDS.len());
        self.spans[span] += 1;
        self.sum_s += seconds;
        self.count += 1;
    }

    /// Requests that waited at most `bound` seconds (`bound` one of [`QUEUE_TIME_BOUNDS`]).
    pub fn at_most(&self, bound: f64) -> u64 {
        QUEUE_TIME_BOUNDS
            .iter()
            .zip(&self.spans)
            .take_while(|(upper, _)| **upper <= bound)
            .map(|(_, count)| count)
            .sum()
    }
}

/// The handle request tasks use.
#[derive(Debug, Clone)]
pub struct SchedulerHandle {
    pub commands: mpsc::UnboundedSender<Command>,
    pub stats: watch::Receiver<SchedulerStats>,
}

/// Start the scheduler task on the current runtime; `order` is how it takes waiting requests,
/// `caps` when it sheds an arriving one.
pub fn spawn(
    profile: &Profile,
    seed: u64,
    order: QueueOrder,
    caps: QueueCaps,
) -> (SchedulerHandle, tokio::task::JoinHandle<()>) {
    let (commands, command_rx) = mpsc::unbounded_channel();
    let (stats_tx, stats) = watch::channel(SchedulerStats {
        kv_tokens: profile.capacity.kv_tokens,
        ..SchedulerStats::default()
    });
    let mut scheduler = Scheduler::new(profile, seed, order, command_rx, stats_tx);
    scheduler.caps = caps;
    let task = tokio::spawn(scheduler.run());
    (SchedulerHandle { commands, stats }, task)
}

struct Req {
    id: u64,
    rid: String,
    prompt_tokens: u64,
    /// Emptied once it is no longer needed (after the lookup of a whole hit, after the insert
    /// of a prefilled prompt).
    prefix: PrefixKeys,
    target: u64,
    finish_at_target: Finish,
    priority: i64,
    emitted: u64,
    reserved: u64,
    cached_tokens: u64,
    prefill_remaining: u64,
    join_started: Instant,
    join_batch: usize,
    /// When it joined the waiting queue.
    queued_at: Instant,
    accept: AcceptLengths,
    events: mpsc::UnboundedSender<Event>,
}

enum Activity {
    Prefill {
        end: Instant,
        chunk: Vec<(u64, u64)>,
    },
    Decode {
        end: Instant,
    },
}

impl Activity {
    fn end(&self) -> Instant {
        match self {
            Activity::Prefill { end, .. } | Activity::Decode { end } => *end,
        }
    }
}

struct Scheduler {
    model: Arc<PerformanceModel>,
    kv_tokens: u64,
    max_running: usize,
    chunk_size: u64,
    natural_mean: u32,
    seed: u64,
    order: QueueOrder,
    caps: QueueCaps,
    commands: mpsc::UnboundedReceiver<Command>,
    stats_tx: watch::Sender<SchedulerStats>,
    stats: SchedulerStats,
    /// Kept in admission order: arrival, or priority then arrival ([`Scheduler::enqueue`]).
    waiting: VecDeque<Req>,
    prefilling: VecDeque<Req>,
    joining: Vec<Req>,
    ready: Vec<Req>,
    running: Vec<Req>,
    rids: HashMap<String, u64>,
    reserved: u64,
    activity: Option<Activity>,
    cache: PrefixCache,
    lag_us: Vec<u32>,
    window_start: Instant,
    window_tokens: u64,
}

const MAX_LAG_SAMPLES: usize = 1 << 20;

impl Scheduler {
    fn new(
        profile: &Profile,
        seed: u64,
        order: QueueOrder,
        commands: mpsc::UnboundedReceiver<Command>,
        stats_tx: watch::Sender<SchedulerStats>,
    ) -> Scheduler {
        Scheduler {
            model: Arc::new(PerformanceModel::new(profile)),
            kv_tokens: profile.capacity.kv_tokens,
            max_running: profile.capacity.max_running_requests as usize,
            chunk_size: u64::from(profile.capacity.chunked_prefill_size),
            natural_mean: profile.model.natural_output_tokens,
            seed,
            order,
            caps: QueueCaps::default(),
            commands,
            stats_tx,
            stats: SchedulerStats {
                kv_tokens: profile.capacity.kv_tokens,
                ..SchedulerStats::default()
            },
            waiting: VecDeque::new(),
            prefilling: VecDeque::new(),
            joining: Vec::new(),
            ready: Vec::new(),
            running: Vec::new(),
            rids: HashMap::new(),
            reserved: 0,
            activity: None,
            cache: PrefixCache::new(profile.capacity.kv_tokens),
            lag_us: Vec::new(),
            window_start: Instant::now(),
            window_tokens: 0,
        }
    }

    async fn run(mut self) {
        loop {
            let wake = self.next_wake();
            tokio::select! {
                biased;
                command = self.commands.recv() => match command {
                    Some(command) => self.handle(command),
                    None => return,
                },
                () = sleep_until_opt(wake) => {}
            }
            while let Ok(command) = self.commands.try_recv() {
                self.handle(command);
            }
            self.advance(Instant::now());
            self.publish();
        }
    }

    fn admitted(&self) -> usize {
        self.prefilling.len() + self.joining.len() + self.ready.len() + self.running.len()
    }

    fn next_wake(&self) -> Option<Instant> {
        let joins = self.joining.iter().map(|r| self.join_deadline(r)).min();
        match (self.activity.as_ref().map(Activity::end), joins) {
            (Some(a), Some(j)) => Some(a.min(j)),
            (a, j) => a.or(j),
        }
    }

    fn join_deadline(&self, req: &Req) -> Instant {
        req.join_started + self.model.cached_ttft(req.prompt_tokens, req.join_batch)
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit(submission) => self.submit(submission),
            Command::Cancel(id) => {
                if let Some(req) = self.remove(id) {
                    self.release(&req);
                }
            }
            Command::AbortRid(rid) => {
                if let Some(id) = self.rids.get(&rid).copied() {
                    self.abort(id);
                }
            }
            Command::AbortAll => {
                let ids: Vec<u64> = self.rids.values().copied().collect();
                for id in ids {
                    self.abort(id);
                }
            }
            Command::TakeLag(reply) => {
                let _ = reply.send(std::mem::take(&mut self.lag_us));
            }
        }
    }

    fn submit(&mut self, s: Submission) {
        let waiting_tokens: u64 = self.waiting.iter().map(|r| r.prompt_tokens).sum();
        let shed = self
            .caps
            .shed(self.waiting.len() as u64, waiting_tokens, s.prompt_tokens);
        let shed = match shed {
            Some(ShedCause::QueuedRequests) if self.abort_least_preferred_for(s.priority) => None,
            other => other,
        };
        if let Some(cause) = shed {
            match cause {
                ShedCause::QueuedRequests | ShedCause::PreferredArrival => {
                    self.stats.shed_by_requests += 1
                }
                ShedCause::QueuedTokens => self.stats.shed_by_tokens += 1,
            }
            let _ = s.admission.send(Err(cause));
            return;
        }
        let _ = s.admission.send(Ok(()));
        if self.rids.contains_key(&s.rid) {
            let _ = s.events.send(Event::Rejected {
                message: format!("Duplicate request ID detected: {}", s.rid),
            });
            return;
        }
        let natural = if s.ignore_eos {
            u64::MAX
        } else {
            u64::from(natural_output_tokens(s.request_seed, self.natural_mean))
                .max(s.min_new_tokens)
        };
        let (target, finish_at_target) = if natural < s.max_new_tokens {
            (natural, Finish::Eos)
        } else {
            (s.max_new_tokens, Finish::Length)
        };
        let reserved =
            (s.prompt_tokens + s.max_new_tokens.min(OUTPUT_RESERVATION_CLIP)).min(self.kv_tokens);
        self.rids.insert(s.rid.clone(), s.id);
        self.stats.requests_total += 1;
        self.enqueue(Req {
            id: s.id,
            rid: s.rid,
            prompt_tokens: s.prompt_tokens,
            prefix: s.prefix,
            target,
            finish_at_target,
            priority: s.priority,
            emitted: 0,
            reserved,
            cached_tokens: 0,
            prefill_remaining: s.prompt_tokens.max(1),
            join_started: Instant::now(),
            join_batch: 1,
            queued_at: Instant::now(),
            accept: self.model.accept_lengths(s.request_seed ^ self.seed),
            events: s.events,
        });
    }

    /// At a full queue under sglang's priority scheduling: whether an arrival of `priority` is
    /// preferred to the least-preferred waiting request (the queue's last: ties go by arrival),
    /// which is then aborted, its client told why, to make room.
    fn abort_least_preferred_for(&mut self, priority: i64) -> bool {
        if !self.caps.abort_least_preferred {
            return false;
        }
        let Some(last) = self.waiting.back() else {
            return false;
        };
        let preferred = match self.order {
            QueueOrder::Arrival => false,
            QueueOrder::LargerFirst => priority > last.priority,
            QueueOrder::SmallerFirst => priority < last.priority,
        };
        if !preferred {
            return false;
        }
        let id = last.id;
        if let Some(req) = self.remove(id) {
            self.stats.shed_by_requests += 1;
            let _ = req.events.send(Event::Shed(ShedCause::PreferredArrival));
            self.release(&req);
        }
        true
    }

    /// Put a new request in the waiting queue at its place. Arrival order: at the back, as
    /// before priority scheduling existed. Priority order: behind every request that goes
    /// before it or ties with it, so equal priorities keep arrival order, the same order
    /// sglang's sort by (priority, queue entry time) and vLLM's heap of (priority, arrival)
    /// give. Only the waiting queue is ordered: an admitted request is never preempted for a
    /// later, more urgent one (both engines can preempt under priority scheduling; the
    /// simulator does not model it).
    fn enqueue(&mut self, req: Req) {
        let at = match self.order {
            QueueOrder::Arrival => self.waiting.len(),
            QueueOrder::LargerFirst => self
                .waiting
                .partition_point(|queued| queued.priority >= req.priority),
            QueueOrder::SmallerFirst => self
                .waiting
                .partition_point(|queued| queued.priority <= req.priority),
        };
        self.waiting.insert(at, req);
    }

    /// Take a request out of whichever collection holds it.
    fn remove(&mut self, id: u64) -> Option<Req> {
        if let Some(i) = self.running.iter().position(|r| r.id == id) {
            return Some(self.running.swap_remove(i));
        }
        if let Some(i) = self.ready.iter().position(|r| r.id == id) {
            return Some(self.ready.swap_remove(i));
        }
        if let Some(i) = self.joining.iter().position(|r| r.id == id) {
            return Some(self.joining.swap_remove(i));
        }
        if let Some(i) = self.prefilling.iter().position(|r| r.id == id) {
            return self.prefilling.remove(i);
        }
        if let Some(i) = self.waiting.iter().position(|r| r.id == id) {
            // A waiting request holds no KV reservation yet.
            let req = self.waiting.remove(i);
            if let Some(req) = &req {
                self.rids.remove(&req.rid);
            }
            return req.map(|mut r| {
                r.reserved = 0;
                r.prompt_tokens = 0;
                r.emitted = 0;
                r
            });
        }
        None
    }

    fn release(&mut self, req: &Req) {
        self.reserved = self.reserved.saturating_sub(req.reserved);
        self.stats.used_tokens = self
            .stats
            .used_tokens
            .saturating_sub(req.prompt_tokens + req.emitted);
        self.rids.remove(&req.rid);
    }

    fn abort(&mut self, id: u64) {
        if let Some(req) = self.remove(id) {
            self.stats.aborted_total += 1;
            let _ = req.events.send(Event::Output {
                new_tokens: 0,
                cached_tokens: req.cached_tokens,
                finish: Some(Finish::Abort),
            });
            self.release(&req);
        }
    }

    /// Move time forward to `now`: finish whatever is due, then start what comes next.
    fn advance(&mut self, now: Instant) {
        self.complete_joins(now);
        loop {
            match self.activity.take() {
                Some(activity) if activity.end() <= now => {
                    let planned = activity.end();
                    self.finish_activity(activity);
                    self.admit(now);
                    // Back to back: the next step is planned where this one ended.
                    let planned = if now.saturating_duration_since(planned) > MAX_CATCH_UP {
                        now
                    } else {
                        planned
                    };
                    self.record_lag(now.saturating_duration_since(planned));
                    if !self.start_next(planned) {
                        break;
                    }
                }
                Some(activity) => {
                    self.activity = Some(activity);
                    self.admit(now);
                    break;
                }
                None => {
                    self.admit(now);
                    if !self.start_next(now) {
                        break;
                    }
                }
            }
            self.complete_joins(now);
        }
    }

    fn record_lag(&mut self, lag: Duration) {
        if self.lag_us.len() < MAX_LAG_SAMPLES {
            self.lag_us
                .push(u32::try_from(lag.as_micros()).unwrap_or(u32::MAX));
        }
    }

    fn admit(&mut self, now: Instant) {
        while let Some(front) = self.waiting.front() {
            if self.admitted() >= self.max_running
                || self.reserved + front.reserved > self.kv_tokens
            {
                break;
            }
            let Some(mut req) = self.waiting.pop_front() else {
                break;
            };
            self.reserved += req.reserved;
            self.stats
                .queue_time
                .add(now.saturating_duration_since(req.queued_at).as_secs_f64());
            self.stats.used_tokens += req.prompt_tokens;
            self.stats.prompt_tokens_total += req.prompt_tokens;
            let found = self.cache.lookup(&req.prefix);
            // sglang's radix cache always recomputes the last prompt token.
            req.cached_tokens = found.tokens.min(req.prompt_tokens.saturating_sub(1));
            self.stats.cached_tokens_total += req.cached_tokens;
            if found.whole {
                req.prefix = PrefixKeys::default();
                req.join_started = now;
                req.join_batch = self.admitted() + 1;
                self.joining.push(req);
            } else {
                req.prefill_remaining = req.prompt_tokens.saturating_sub(req.cached_tokens).max(1);
                self.prefilling.push_back(req);
            }
        }
        let batch = self.admitted();
        for req in &mut self.joining {
            req.join_batch = req.join_batch.max(batch);
        }
    }

    fn complete_joins(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.joining.len() {
            if self.join_deadline(&self.joining[i]) <= now {
                let req = self.joining.swap_remove(i);
                self.first_token(req);
            } else {
                i += 1;
            }
        }
    }

    /// Start the next prefill chunk or decode step at `planned`. False when idle.
    fn start_next(&mut self, planned: Instant) -> bool {
        if !self.prefilling.is_empty() {
            let mut budget = self.chunk_size;
            let mut chunk = Vec::new();
            let mut duration = Duration::ZERO;
            for req in &self.prefilling {
                if budget == 0 {
                    break;
                }
                let take = req.prefill_remaining.min(budget);
                budget -= take;
                duration += self.model.prefill_time(take, req.prompt_tokens);
                chunk.push((req.id, take));
            }
            self.activity = Some(Activity::Prefill {
                end: planned + duration,
                chunk,
            });
            return true;
        }
        self.running.append(&mut self.ready);
        if self.running.is_empty() {
            return false;
        }
        let mean_context = self
            .running
            .iter()
            .map(|r| r.prompt_tokens as f64)
            .sum::<f64>()
            / self.running.len() as f64;
        let duration = self
            .model
            .decode_step_time(mean_context, self.running.len());
        self.activity = Some(Activity::Decode {
            end: planned + duration,
        });
        true
    }

    fn finish_activity(&mut self, activity: Activity) {
        match activity {
            Activity::Prefill { chunk, .. } => {
                for (id, take) in chunk {
                    if let Some(req) = self.prefilling.iter_mut().find(|r| r.id == id) {
                        req.prefill_remaining = req.prefill_remaining.saturating_sub(take);
                    }
                }
                while self
                    .prefilling
                    .front()
                    .is_some_and(|r| r.prefill_remaining == 0)
                {
                    if let Some(mut req) = self.prefilling.pop_front() {
                        self.cache.insert(&std::mem::take(&mut req.prefix));
                        self.first_token(req);
                    }
                }
            }
            Activity::Decode { .. } => self.decode_step_done(),
        }
    }

    fn first_token(&mut self, mut req: Req) {
        let new_tokens = req.target.min(1);
        req.emitted = new_tokens;
        self.count_generated(new_tokens);
        let finished = req.emitted >= req.target;
        let sent = req
            .events
            .send(Event::Output {
                new_tokens: new_tokens as u32,
                cached_tokens: req.cached_tokens,
                finish: finished.then_some(req.finish_at_target),
            })
            .is_ok();
        if finished || !sent {
            self.release(&req);
        } else {
            self.ready.push(req);
        }
    }

    fn decode_step_done(&mut self) {
        let mut generated = 0u64;
        let mut released: Vec<Req> = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            let req = &mut self.running[i];
            let step = u64::from(req.accept.next_step());
            let new_tokens = step.min(req.target.saturating_sub(req.emitted));
            req.emitted += new_tokens;
            generated += new_tokens;
            let finished = req.emitted >= req.target;
            let sent = req
                .events
                .send(Event::Output {
                    new_tokens: new_tokens as u32,
                    cached_tokens: req.cached_tokens,
                    finish: finished.then_some(req.finish_at_target),
                })
                .is_ok();
            if finished || !sent {
                released.push(self.running.swap_remove(i));
            } else {
                i += 1;
            }
        }
        self.count_generated(generated);
        for req in &released {
            self.release(req);
        }
    }

    fn count_generated(&mut self, tokens: u64) {
        self.stats.generation_tokens_total += tokens;
        self.stats.used_tokens += tokens;
        self.window_tokens += tokens;
    }

    fn publish(&mut self) {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed >= Duration::from_secs(1) {
            self.stats.gen_throughput = self.window_tokens as f64 / elapsed.as_secs_f64();
            self.window_tokens = 0;
            self.window_start = now;
        }
        self.stats.running = self.admitted();
        self.stats.queued = self.waiting.len();
        self.stats.prefix_cache_tokens = self.cache.tokens();
        let stats = self.stats;
        self.stats_tx.send_if_modified(|current| {
            if *current == stats {
                false
            } else {
                *current = stats;
                true
            }
        });
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{Dialect, SimOptions};
    use crate::profile::BUILTIN_PROFILES;

    /// Virtual time (the runtime's clock is paused): only a stuck scheduler reaches it.
    const PATIENCE: Duration = Duration::from_secs(3600);

    /// A built-in profile that admits one request at a time, so everything sent while one
    /// runs has to queue.
    fn one_at_a_time() -> Profile {
        let mut profile = Profile::builtin(BUILTIN_PROFILES[0].0).unwrap();
        profile.capacity.max_running_requests = 1;
        profile
    }

    /// The block chain of a token-id prompt of `len` ids; equal seeds, equal prompts.
    fn prompt(seed: u64, len: u64) -> PrefixKeys {
        let ids: Vec<u64> = (0..len)
            .map(|i| 1000 + (seed * 7919 + i * 31) % 9000)
            .collect();
        crate::text::token_ids_key(&serde_json::json!(ids), 16)
            .unwrap()
            .prefix
    }

    fn submission(
        id: u64,
        max_new_tokens: u64,
        priority: i64,
        events: mpsc::UnboundedSender<Event>,
    ) -> Submission {
        Submission {
            id,
            rid: format!("r{id}"),
            prompt_tokens: 100,
            // Distinct prompts: no cache hit joins out of turn.
            prefix: prompt(id, 100),
            max_new_tokens,
            min_new_tokens: 0,
            ignore_eos: true,
            priority,
            request_seed: id,
            events,
            admission: oneshot::channel().0,
        }
    }

    /// Occupy the batch with one long request, then submit one request per entry of
    /// `priorities` at the same instant, and return their indexes in the order their first
    /// tokens came.
    async fn first_token_order(options: &SimOptions, priorities: &[Option<i64>]) -> Vec<usize> {
        let (handle, task) = spawn(
            &one_at_a_time(),
            7,
            options.queue_order(),
            QueueCaps::default(),
        );
        let (blocker_tx, mut blocker) = mpsc::unbounded_channel();
        handle
            .commands
            .send(Command::Submit(submission(0, 64, 0, blocker_tx)))
            .unwrap();
        // Its first token: admitted, and the only place is taken for its 64 tokens.
        let first = tokio::time::timeout(PATIENCE, blocker.recv())
            .await
            .unwrap();
        assert!(matches!(first, Some(Event::Output { finish: None, .. })));

        let (done_tx, mut done) = mpsc::unbounded_channel();
        for (index, requested) in priorities.iter().enumerate() {
            let (tx, mut events) = mpsc::unbounded_channel();
            let priority = options.request_priority(*requested);
            handle
                .commands
                .send(Command::Submit(submission(
                    index as u64 + 1,
                    2,
                    priority,
                    tx,
                )))
                .unwrap();
            let done_tx = done_tx.clone();
            tokio::spawn(async move {
                if let Some(Event::Output { .. }) = events.recv().await {
                    let _ = done_tx.send(index);
                }
                // Drain to the end so the request finishes and frees its place.
                while events.recv().await.is_some() {}
            });
        }
        // The queue is longer than the batch: all of them wait behind the blocker at once.
        let mut stats = handle.stats.clone();
        let queued = stats.wait_for(|s| s.running == 1 && s.queued == priorities.len());
        tokio::time::timeout(PATIENCE, queued)
            .await
            .unwrap()
            .unwrap();
        let mut order = Vec::new();
        while order.len() < priorities.len() {
            let index = tokio::time::timeout(PATIENCE, done.recv()).await.unwrap();
            order.push(index.unwrap());
        }
        task.abort();
        order
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_past_a_queue_cap_is_shed_and_never_queued() {
        let caps = QueueCaps {
            requests: Some(2),
            tokens: Some(250),
            ..QueueCaps::default()
        };
        let (handle, task) = spawn(&one_at_a_time(), 7, QueueOrder::Arrival, caps);
        let (blocker_tx, mut blocker) = mpsc::unbounded_channel();
        handle
            .commands
            .send(Command::Submit(submission(0, 64, 0, blocker_tx)))
            .unwrap();
        let first = tokio::time::timeout(PATIENCE, blocker.recv())
            .await
            .unwrap();
        assert!(matches!(first, Some(Event::Output { finish: None, .. })));
        // Each waits with 100 prompt tokens: the second fits both caps, the third neither
        // (two wait already), and once one left, 100 + 100 + 100 > 250 tokens.
        let mut answers = Vec::new();
        let mut keep = Vec::new();
        for id in 1..=3 {
            let (tx, events) = mpsc::unbounded_channel();
            let (admission, answer) = oneshot::channel();
            handle
                .commands
                .send(Command::Submit(Submission {
                    admission,
                    ..submission(id, 2, 0, tx)
                }))
                .unwrap();
            keep.push(events);
            answers.push(
                tokio::time::timeout(PATIENCE, answer)
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        assert_eq!(answers, [Ok(()), Ok(()), Err(ShedCause::QueuedRequests)]);
        let mut watch = handle.stats.clone();
        let stats = *tokio::time::timeout(PATIENCE, watch.wait_for(|s| s.shed_by_requests > 0))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((stats.shed_by_requests, stats.shed_by_tokens), (1, 0));
        assert_eq!(stats.requests_total, 3, "the shed request was never queued");
        task.abort();
    }

    /// sglang under priority scheduling, at a full queue: an arrival preferred to the
    /// least-preferred waiting request aborts that one (its client hears why) and is queued; one
    /// that is not preferred is shed itself.
    #[tokio::test(start_paused = true)]
    async fn a_preferred_arrival_at_a_full_queue_aborts_the_least_preferred_waiting_request() {
        let caps = QueueCaps {
            requests: Some(1),
            abort_least_preferred: true,
            ..QueueCaps::default()
        };
        let (handle, task) = spawn(&one_at_a_time(), 7, QueueOrder::LargerFirst, caps);
        let (blocker_tx, mut blocker) = mpsc::unbounded_channel();
        handle
            .commands
            .send(Command::Submit(submission(0, 64, 0, blocker_tx)))
            .unwrap();
        let first = tokio::time::timeout(PATIENCE, blocker.recv())
            .await
            .unwrap();
        assert!(matches!(first, Some(Event::Output { finish: None, .. })));
        // (id, priority): 1 waits; 2 is preferred (5 > 1) and takes its place; 3 ties with 2
        // and is not preferred, so it is shed at the door.
        let mut answers = Vec::new();
        let mut events = Vec::new();
        for (id, priority) in [(1, 1), (2, 5), (3, 5)] {
            let (tx, rx) = mpsc::unbounded_channel();
            let (admission, answer) = oneshot::channel();
            handle
                .commands
                .send(Command::Submit(Submission {
                    admission,
                    ..submission(id, 2, priority, tx)
                }))
                .unwrap();
            events.push(rx);
            answers.push(
                tokio::time::timeout(PATIENCE, answer)
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        assert_eq!(answers, [Ok(()), Ok(()), Err(ShedCause::QueuedRequests)]);
        let aborted = tokio::time::timeout(PATIENCE, events[0].recv())
            .await
            .unwrap();
        assert!(
            matches!(aborted, Some(Event::Shed(ShedCause::PreferredArrival))),
            "{aborted:?}"
        );
        // The preferred one runs once the first is done.
        let next = tokio::time::timeout(PATIENCE, events[1].recv())
            .await
            .unwrap();
        assert!(matches!(next, Some(Event::Output { .. })), "{next:?}");
        let mut watch = handle.stats.clone();
        let stats = *tokio::time::timeout(PATIENCE, watch.wait_for(|s| s.shed_by_requests >= 2))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stats.shed_by_requests, 2);
        task.abort();
    }

    fn options(dialect: Dialect, priority_scheduling: bool, low_first: bool) -> SimOptions {
        SimOptions {
            dialect,
            priority_scheduling,
            low_priority_values_first: low_first,
            ..SimOptions::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn sglang_priority_scheduling_serves_larger_values_first() {
        let sglang = options(Dialect::Sglang, true, false);
        let order = first_token_order(&sglang, &[Some(1), Some(10), None, Some(5), Some(10)]).await;
        // 10 and 10 by arrival, then 5, 1, and the request without a priority last.
        assert_eq!(order, [1, 4, 3, 0, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn sglang_low_priority_values_first_serves_smaller_values_first() {
        let sglang = options(Dialect::Sglang, true, true);
        let order = first_token_order(&sglang, &[Some(3), None, Some(-1), Some(3)]).await;
        // -1, then 3 and 3 by arrival; without a priority still last.
        assert_eq!(order, [2, 0, 3, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn vllm_priority_policy_serves_smaller_values_first() {
        // `low_priority_values_first` is sglang's option: the vLLM dialect ignores it.
        for low_first in [false, true] {
            let vllm = options(Dialect::Vllm, true, low_first);
            let order =
                first_token_order(&vllm, &[Some(5), None, Some(-2), Some(5), Some(0)]).await;
            // -2, then 0 and the request without a priority (vLLM's default 0) by arrival, then 5, 5.
            assert_eq!(order, [2, 1, 4, 0, 3]);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn without_priority_scheduling_the_queue_stays_first_come_first_served() {
        for dialect in [Dialect::Sglang, Dialect::Vllm] {
            let off = options(dialect, false, true);
            let order = first_token_order(&off, &[Some(1), Some(10), None, Some(-5)]).await;
            assert_eq!(order, [0, 1, 2, 3], "{dialect:?}");
        }
    }

    /// A built-in profile whose prefix cache holds `kv_tokens`.
    fn with_kv(kv_tokens: u64) -> Profile {
        let mut profile = Profile::builtin(BUILTIN_PROFILES[0].0).unwrap();
        profile.capacity.kv_tokens = kv_tokens;
        profile
    }

    /// What one request saw: its `cached_tokens` and its time to first token.
    #[derive(Debug)]
    struct Turn {
        cached_tokens: u64,
        ttft: Duration,
    }

    /// Send one request of `prompt` (two output tokens) and wait for its end.
    async fn turn(handle: &SchedulerHandle, id: u64, prompt: PrefixKeys) -> Turn {
        let (tx, mut events) = mpsc::unbounded_channel();
        let sent = Instant::now();
        handle
            .commands
            .send(Command::Submit(Submission {
                prompt_tokens: prompt.prompt_tokens(),
                prefix: prompt,
                ..submission(id, 2, 0, tx)
            }))
            .unwrap();
        let first = tokio::time::timeout(PATIENCE, events.recv()).await.unwrap();
        let Some(Event::Output { cached_tokens, .. }) = first else {
            panic!("{first:?}");
        };
        let ttft = sent.elapsed();
        while tokio::time::timeout(PATIENCE, events.recv())
            .await
            .unwrap()
            .is_some()
        {}
        Turn {
            cached_tokens,
            ttft,
        }
    }

    /// `ids` as a token-id prompt's chain (block 16, the built-in profiles' block size).
    fn chain(ids: &[u64]) -> PrefixKeys {
        crate::text::token_ids_key(&serde_json::json!(ids), 16)
            .unwrap()
            .prefix
    }

    fn ids(seed: u64, len: u64) -> Vec<u64> {
        (0..len)
            .map(|i| 1000 + (seed * 7919 + i * 31) % 9000)
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_that_extends_the_previous_prompt_prefills_only_what_is_new() {
        let (handle, task) = spawn(
            &with_kv(1 << 20),
            7,
            QueueOrder::Arrival,
            QueueCaps::default(),
        );
        let first = ids(1, 4000);
        let cold = turn(&handle, 1, chain(&first)).await;
        assert_eq!(cold.cached_tokens, 0);
        // Turn 2: turn 1's prompt and 1,000 more tokens. Its shared full blocks are cached
        // (4,000 = 250 blocks of 16), and only the rest is prefilled.
        let mut second = first.clone();
        second.extend(ids(2, 1000));
        let warm = turn(&handle, 2, chain(&second)).await;
        assert_eq!(warm.cached_tokens, 4000);
        let unrelated = turn(&handle, 3, chain(&ids(3, 5000))).await;
        assert_eq!(unrelated.cached_tokens, 0, "an unrelated prompt misses");
        assert!(
            warm.ttft * 3 < unrelated.ttft,
            "{warm:?} against the cold {unrelated:?}"
        );
        // The identical prompt again: all but its last token, and it joins.
        let again = turn(&handle, 4, chain(&second)).await;
        assert_eq!(again.cached_tokens, 4999);
        let stats = *handle.stats.borrow();
        assert_eq!(stats.cached_tokens_total, 4000 + 4999);
        assert_eq!(stats.prompt_tokens_total, 4000 + 5000 + 5000 + 5000);
        assert_eq!(stats.prefix_cache_tokens, 4000 + 1000 + 5000);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_conversation_loses_its_prefix_once_other_traffic_fills_the_cache() {
        // Room for four 1,000-token prompts.
        let kv_tokens = 4096;
        let (handle, task) = spawn(
            &with_kv(kv_tokens),
            7,
            QueueOrder::Arrival,
            QueueCaps::default(),
        );
        let mut conversation = ids(1, 1000);
        assert_eq!(
            turn(&handle, 1, chain(&conversation)).await.cached_tokens,
            0
        );
        let mut id = 10;
        let mut other_traffic = |handle: &SchedulerHandle, prompts: u64| {
            let handle = handle.clone();
            let first = id;
            id += prompts;
            async move {
                for seed in first..first + prompts {
                    turn(&handle, seed, chain(&ids(seed, 1000))).await;
                    let held = handle.stats.borrow().prefix_cache_tokens;
                    assert!(held <= kv_tokens, "{held} > {kv_tokens}");
                }
            }
        };
        // Two other prompts: the cache still holds the conversation, and its next turn hits
        // for the first turn's full blocks (62 of 16 tokens).
        other_traffic(&handle, 2).await;
        conversation.extend(ids(2, 200));
        assert_eq!(
            turn(&handle, 2, chain(&conversation)).await.cached_tokens,
            992
        );
        // Two more: the oldest entries go first, and the conversation was used last.
        other_traffic(&handle, 2).await;
        conversation.extend(ids(3, 200));
        assert_eq!(
            turn(&handle, 3, chain(&conversation)).await.cached_tokens,
            1200
        );
        // Five more (5,000 tokens through a 4,096-token cache): its prefix is evicted, and
        // the next turn misses.
        other_traffic(&handle, 5).await;
        conversation.extend(ids(4, 200));
        assert_eq!(
            turn(&handle, 4, chain(&conversation)).await.cached_tokens,
            0
        );
        assert!(handle.stats.borrow().prefix_cache_tokens <= kv_tokens);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn empty_and_oversized_prompts_are_served() {
        let (handle, task) = spawn(&with_kv(4096), 7, QueueOrder::Arrival, QueueCaps::default());
        for id in 1..=2 {
            assert_eq!(turn(&handle, id, chain(&[])).await.cached_tokens, 0);
        }
        // Larger than the whole cache: its leading 4,096 tokens are kept.
        let huge = ids(1, 10_000);
        assert_eq!(turn(&handle, 3, chain(&huge)).await.cached_tokens, 0);
        assert_eq!(handle.stats.borrow().prefix_cache_tokens, 4096);
        assert_eq!(turn(&handle, 4, chain(&huge)).await.cached_tokens, 4096);
        task.abort();
    }
}
