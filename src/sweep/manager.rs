//! One sweep at a time: [`SweepManager`] asks the server what it is, resolves the plan, runs
//! the sweep on a task of its own, keeps its live status, persists it (every change, at most
//! once a second, and at the end), cancels it, and answers what `GET /sweeps` and
//! `GET /sweeps/{id}` show — the running sweep live, earlier ones from the store.
//!
//! The admin API, `tokentap sweep` and `tokentap demo` all go through this type. It knows
//! nothing of HTTP or tokens (the admin layer checks those), and reaches the data path only
//! through its door (`synthetic::DataPath`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::base::lock::lock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use super::discover::discover;
use super::latest::LatestMatrix;
use super::plan::{Plan, PlanError, SweepRequest};
use super::preview::PlanPreview;
use super::runner::{run, RunnerInput};
use super::shape::ProductionShape;
use super::status::{StatusCell, SweepState, SweepStatus, SweepSummary};
use super::store::{MemoryStore, SweepStore};
use crate::config::SweepConfig;
use crate::matrix::MatrixDoc;
use crate::store::StoreError;
use crate::synthetic::prompt::mix;
use crate::synthetic::DataPath;

/// Least time between two writes of a running sweep to the store.
const PERSIST_EVERY: Duration = Duration::from_secs(1);

/// Why a sweep did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("sweep {id} is running; one sweep at a time (cancel it with DELETE /sweeps/{id})")]
    Busy { id: String },
    #[error("the sweep plan cannot run")]
    Plan(#[from] PlanError),
    #[error("sweep {id} was interrupted before it started (tokentap is stopping)")]
    Interrupted { id: String },
    #[error("{in_flight} production request{s} in flight through this proxy: a sweep now would slow {them} and measure the interference, not the server. Drain this replica (take it out of the load balancer) and start again, or start beside production (`tokentap sweep --beside-production`, `\"beside_production\": true` in POST /sweeps, the page's checkbox): its cells then show the production they ran beside, and it pauses while more than sweep.production_guard are in flight", s = if *in_flight == 1 { " is" } else { "s are" }, them = if *in_flight == 1 { "it" } else { "them" })]
    ProductionInFlight { in_flight: u64 },
}

/// The slot of a sweep that has not started running yet: dropped before the run takes it
/// over (an error, or a task that never finished), it marks the sweep failed and frees the
/// slot, so a sweep can never stay `starting`.
struct Claim {
    manager: Arc<SweepManager>,
    active: Option<Arc<Active>>,
}

impl Claim {
    /// Frees the slot (the status says why already).
    fn release(&mut self) {
        if let Some(active) = self.active.take() {
            let mut current = lock(&self.manager.current);
            if current.as_ref().is_some_and(|a| a.id == active.id) {
                *current = None;
            }
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(active) = self.active.as_ref() {
            if active.status.state() == SweepState::Starting {
                active.status.update(|s| {
                    s.state = SweepState::Failed;
                    s.error = Some("the sweep was interrupted before it started".into());
                });
            }
        }
        self.release();
    }
}

/// Why a cancel did nothing.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("no sweep {id}")]
    Unknown { id: String },
    #[error("sweep {id} is not running (it is {state})")]
    NotRunning { id: String, state: &'static str },
}

#[derive(Debug)]
struct Active {
    id: String,
    status: Arc<StatusCell>,
    cancel: watch::Sender<bool>,
}

/// Starts, follows, cancels and lists sweeps.
#[derive(Debug)]
pub struct SweepManager {
    /// The one door to the data path.
    path: Arc<dyn DataPath>,
    config: SweepConfig,
    store: Arc<dyn SweepStore>,
    current: Mutex<Option<Arc<Active>>>,
    latest: Mutex<Option<MatrixDoc>>,
    /// The synthetic matrices the admin endpoints read: the last completed sweep's, and the
    /// running one's so far.
    synthetic: LatestMatrix,
    counter: AtomicU64,
    /// Production's matrix of a model, for sweeps shaped like it (`like_production`); none
    /// where no production passes this proxy (`tokentap sweep --target`).
    production: Mutex<Option<Production>>,
}

/// The production source, shown by name only.
#[derive(Clone)]
struct Production(ProductionSource);

impl std::fmt::Debug for Production {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProductionSource")
    }
}

/// Production's matrix of the model named, when it has any.
pub type ProductionSource = Arc<dyn Fn(&str) -> Option<MatrixDoc> + Send + Sync>;

impl SweepManager {
    /// A manager for sweeps through `path`, keeping them in `store` and publishing the latest
    /// matrix in `synthetic`. Sweeps a previous process left running are marked interrupted.
    pub fn new(
        path: Arc<dyn DataPath>,
        config: SweepConfig,
        store: Arc<dyn SweepStore>,
        synthetic: LatestMatrix,
    ) -> Arc<Self> {
        match store.recover() {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                sweeps = n,
                "sweeps left running by the last process are marked interrupted"
            ),
            Err(error) => log_store_error(&error),
        }
        let latest = store
            .list()
            .ok()
            .and_then(|list| list.into_iter().find(|s| s.state == SweepState::Finished))
            .and_then(|summary| store.get(&summary.id).ok().flatten())
            .and_then(|status| status.matrix);
        if let Some(latest) = &latest {
            synthetic.set_completed(latest.clone());
        }
        Arc::new(Self {
            path,
            config,
            store,
            current: Mutex::new(None),
            latest: Mutex::new(latest),
            synthetic,
            counter: AtomicU64::new(0),
            production: Mutex::new(None),
        })
    }

    /// A manager that keeps sweeps in memory only.
    pub fn in_memory(path: Arc<dyn DataPath>, config: SweepConfig) -> Arc<Self> {
        Self::new(
            path,
            config,
            Arc::new(MemoryStore::default()),
            LatestMatrix::default(),
        )
    }

    /// Where sweeps shaped like production (`like_production`) read production's matrix.
    pub fn set_production(&self, source: ProductionSource) {
        *lock(&self.production) = Some(Production(source));
    }

    /// `plan` shaped like production when the request asks for it (`like_production`), or
    /// when it searches capacity and production has evidence for the model (unless the
    /// request says `false`). Asked for without evidence, an error naming the key.
    fn shape_plan(&self, request: &SweepRequest, mut plan: Plan) -> Result<Plan, PlanError> {
        let asked = request.like_production;
        let by_default = asked.is_none() && plan.capacity.is_some();
        if asked != Some(true) && !by_default {
            return Ok(plan);
        }
        let source = lock(&self.production).clone();
        let shape = source
            .and_then(|source| (source.0)(&plan.model))
            .and_then(|doc| ProductionShape::from_matrix(&doc));
        match shape {
            Some(shape) => {
                if by_default {
                    plan.notes.push(format!(
                        "The capacity search measures requests shaped like production's traffic, which has evidence for {}; --seed-method on the command line (`\"like_production\": false` in a POST /sweeps plan) keeps the seed method",
                        plan.model
                    ));
                }
                plan.like_production = Some(shape);
                Ok(plan)
            }
            None if by_default => Ok(plan),
            None => Err(PlanError::BadValue {
                field: "like_production".to_owned(),
                message: format!(
                    "production has no completed request of model `{}` through this proxy to shape the sweep like (its production matrix has no cell with requests)",
                    plan.model
                ),
            }),
        }
    }

    /// A fresh id: `<unix seconds in hex>-<4 hex>`, sortable by start time.
    fn new_id(&self) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let salt = mix(now.as_nanos() as u64 ^ mix(n) ^ u64::from(std::process::id()));
        format!("{:x}-{:04x}", now.as_secs(), salt & 0xffff)
    }

    /// The running sweep, if any.
    fn active(&self) -> Option<Arc<Active>> {
        lock(&self.current)
            .as_ref()
            .filter(|a| a.status.state().is_active())
            .cloned()
    }

    /// Starts a sweep: asks the server what it is, resolves the plan (errors name the field)
    /// and runs it in the background. Returns its id. One sweep at a time.
    ///
    /// Once the slot is claimed, the work runs in its own task: a caller that goes away (an
    /// admin client hanging up during discovery) leaves a sweep that starts, or fails, as if
    /// it had waited, and the slot is released whatever happens (`Claim`).
    pub async fn start(self: &Arc<Self>, request: SweepRequest) -> Result<String, StartError> {
        let in_flight = self.production_in_flight();
        if in_flight > 0 && !request.beside_production.unwrap_or(false) {
            return Err(StartError::ProductionInFlight { in_flight });
        }
        let id = self.new_id();
        let status = StatusCell::new(SweepStatus::new(id.clone(), request.clone()));
        let (cancel_tx, cancel_rx) = watch::channel(false);
        let active = Arc::new(Active {
            id: id.clone(),
            status: Arc::clone(&status),
            cancel: cancel_tx,
        });
        {
            let mut current = lock(&self.current);
            if let Some(running) = current.as_ref().filter(|a| a.status.state().is_active()) {
                return Err(StartError::Busy {
                    id: running.id.clone(),
                });
            }
            *current = Some(Arc::clone(&active));
        }
        let claim = Claim {
            manager: Arc::clone(self),
            active: Some(active),
        };
        let manager = Arc::clone(self);
        let begun = tokio::spawn(async move { manager.begin(claim, request, cancel_rx).await });
        match begun.await {
            Ok(result) => result,
            // The task ended without an answer (the runtime is stopping); the claim's drop
            // released the slot.
            Err(_) => Err(StartError::Interrupted { id }),
        }
    }

    /// Production requests in flight through this proxy now.
    pub fn production_in_flight(&self) -> u64 {
        self.path.production_in_flight()
    }

    /// What a sweep of `request` would do (`--dry-run`, `POST /sweeps?dry_run=true`): the
    /// server asked what it is, the plan resolved, nothing started.
    pub async fn preview(&self, request: &SweepRequest) -> Result<PlanPreview, StartError> {
        let facts = discover(&*self.path).await;
        let plan = Plan::resolve(request, &facts, &self.config)?;
        let plan = self.shape_plan(request, plan)?;
        Ok(PlanPreview::new(plan, self.production_in_flight()))
    }

    /// Discovery, the plan and the run of a claimed sweep.
    async fn begin(
        self: Arc<Self>,
        mut claim: Claim,
        request: SweepRequest,
        cancel_rx: watch::Receiver<bool>,
    ) -> Result<String, StartError> {
        let Some(active) = claim.active.clone() else {
            return Err(StartError::Interrupted { id: String::new() });
        };
        let id = active.id.clone();
        let status = Arc::clone(&active.status);
        let facts = discover(&*self.path).await;
        let plan = match Plan::resolve(&request, &facts, &self.config)
            .and_then(|plan| self.shape_plan(&request, plan))
        {
            Ok(plan) => plan,
            Err(error) => {
                status.update(|s| {
                    s.state = SweepState::Failed;
                    s.server = Some(facts);
                    s.error = Some(error.to_string());
                });
                claim.release();
                return Err(StartError::Plan(error));
            }
        };
        let total = plan.measurements();
        status.update(|s| {
            s.plan = Some(plan.clone());
            s.server = Some(facts.clone());
            s.progress.measurements_total = total;
        });
        tracing::info!(sweep = %id, model = %plan.model, measurements = total, "sweep started");
        self.persist_now(&status).await;

        let manager = Arc::clone(&self);
        let input = RunnerInput {
            path: Arc::clone(&self.path),
            id: id.clone(),
            plan,
            facts,
            production_guard: self.config.production_guard,
            status: Arc::clone(&status),
            latest: self.synthetic.clone(),
            cancel: cancel_rx,
        };
        // From here the run owns the slot: it ends in a final state, which frees it.
        claim.active = None;
        tokio::spawn(async move {
            let persister = manager.spawn_persister(Arc::clone(&status));
            let matrix = run(input).await;
            persister.abort();
            let state = status.state();
            // Only a finished sweep becomes the comparison; a cancelled, failed or
            // interrupted one stays in history with its state.
            let finished = (state == SweepState::Finished).then_some(matrix);
            manager.synthetic.end_running(finished.clone());
            if let Some(matrix) = finished {
                *lock(&manager.latest) = Some(matrix);
            }
            manager.persist_now(&status).await;
            tracing::info!(sweep = %active.id, state = state.as_str(), "sweep ended");
        });
        Ok(id)
    }

    /// Writes the status on every change, at most once per [`PERSIST_EVERY`].
    fn spawn_persister(self: &Arc<Self>, status: Arc<StatusCell>) -> tokio::task::JoinHandle<()> {
        let manager = Arc::clone(self);
        let mut changes = status.subscribe();
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                manager.persist_now(&status).await;
                tokio::time::sleep(PERSIST_EVERY).await;
            }
        })
    }

    async fn persist_now(&self, status: &StatusCell) {
        // The runner writes the page's slot itself, with every status it publishes.
        let snapshot = status.snapshot();
        let store = Arc::clone(&self.store);
        let result = tokio::task::spawn_blocking(move || store.put(&snapshot)).await;
        match result {
            Ok(Ok(())) => {}
            Ok(Err(error)) => log_store_error(&error),
            Err(error) => tracing::warn!(%error, "the sweep store task failed"),
        }
    }

    /// Asks the running sweep `id` to stop; its streams are aborted within a second.
    pub fn cancel(&self, id: &str) -> Result<(), CancelError> {
        match self.active() {
            Some(active) if active.id == id => {
                active.status.update(|s| s.state = SweepState::Cancelling);
                let _ = active.cancel.send(true);
                Ok(())
            }
            _ => match self.get(id) {
                Some(status) => Err(CancelError::NotRunning {
                    id: id.to_owned(),
                    state: status.state.as_str(),
                }),
                None => Err(CancelError::Unknown { id: id.to_owned() }),
            },
        }
    }

    /// The status of sweep `id`: live when it is the current one, else from the store.
    pub fn get(&self, id: &str) -> Option<SweepStatus> {
        if let Some(current) = lock(&self.current).as_ref().filter(|a| a.id == id) {
            return Some(current.status.snapshot());
        }
        match self.store.get(id) {
            Ok(status) => status,
            Err(error) => {
                log_store_error(&error);
                None
            }
        }
    }

    /// Every sweep, newest first (the current one live).
    pub fn list(&self) -> Vec<SweepSummary> {
        let mut list = self.store.list().unwrap_or_else(|error| {
            log_store_error(&error);
            Vec::new()
        });
        if let Some(current) = lock(&self.current).as_ref() {
            let live = current.status.snapshot().summary();
            match list.iter_mut().find(|s| s.id == live.id) {
                Some(slot) => *slot = live,
                None => list.insert(0, live),
            }
        }
        list
    }

    /// The id of the sweep that is running now.
    pub fn running(&self) -> Option<String> {
        self.active().map(|a| a.id.clone())
    }

    /// The matrix of the latest finished sweep (this process's, or the newest stored).
    pub fn latest_matrix(&self) -> Option<MatrixDoc> {
        lock(&self.latest).clone()
    }

    /// Changes of the current sweep `id` (for followers such as the CLI progress line).
    pub fn subscribe(&self, id: &str) -> Option<watch::Receiver<u64>> {
        lock(&self.current)
            .as_ref()
            .filter(|a| a.id == id)
            .map(|a| a.status.subscribe())
    }

    /// Waits until sweep `id` is no longer active, calling `on_change` with every new status.
    pub async fn follow(
        &self,
        id: &str,
        mut on_change: impl FnMut(&SweepStatus),
    ) -> Option<SweepStatus> {
        let Some(mut changes) = self.subscribe(id) else {
            return self.get(id);
        };
        loop {
            let status = self.get(id)?;
            on_change(&status);
            if !status.state.is_active() {
                return Some(status);
            }
            if changes.changed().await.is_err() {
                return self.get(id);
            }
        }
    }
}

fn log_store_error(error: &StoreError) {
    tracing::warn!(error = %crate::base::error::error_chain(error), "sweep store");
}
