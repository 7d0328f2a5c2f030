//! The state of one sweep as the world sees it: the JSON of `GET /sweeps/{id}` (state,
//! progress with the current cell and an ETA, the plan, the server's facts, the partial
//! matrix), the summaries of `GET /sweeps`, and the shared cell the runner writes and the
//! manager, the store and followers read.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::matrix::capacity::CapacityReport;
use tokio::sync::watch;

use super::plan::{Plan, ServerFacts, SweepRequest};
use crate::base::duration::human_duration;
use crate::base::lock;
use crate::base::wallclock::format_rfc3339;
use crate::matrix::units::context_label;
use crate::matrix::MatrixDoc;

/// Where a sweep is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SweepState {
    /// Asking the server what it is and resolving the plan.
    Starting,
    Running,
    /// Waiting for production traffic to fall to the guard.
    Paused,
    /// A cancel arrived; streams are being aborted.
    Cancelling,
    Cancelled,
    Finished,
    /// The sweep could not run at all (its error says why).
    Failed,
    /// The process stopped while the sweep ran (seen after a restart).
    Interrupted,
}

impl SweepState {
    /// Still running (or about to): it holds the one-sweep slot.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            SweepState::Starting
                | SweepState::Running
                | SweepState::Paused
                | SweepState::Cancelling
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SweepState::Starting => "starting",
            SweepState::Running => "running",
            SweepState::Paused => "paused",
            SweepState::Cancelling => "cancelling",
            SweepState::Cancelled => "cancelled",
            SweepState::Finished => "finished",
            SweepState::Failed => "failed",
            SweepState::Interrupted => "interrupted",
        }
    }
}

/// What the runner is doing right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepPhase {
    /// The scout request of a context (prefill sample, warms the prompt cache).
    Prefill,
    /// Streams started; waiting until the server runs all of them.
    WarmUp,
    /// The measurement window.
    Window,
    /// Aborting the cell's streams and waiting for the server to drain.
    Drain,
    /// Waiting for production traffic to fall to the guard.
    Paused,
}

/// The measurement in progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurrentStep {
    pub phase: StepPhase,
    pub context_tokens: u64,
    /// `None` for a prefill scout.
    pub concurrency: Option<u32>,
    /// `8K × 4` or `prefill 8K`.
    pub label: String,
}

impl CurrentStep {
    pub fn new(phase: StepPhase, context_tokens: u64, concurrency: Option<u32>) -> Self {
        let label = match concurrency {
            Some(c) => format!("{} × {c}", context_label(context_tokens)),
            None => format!("prefill {}", context_label(context_tokens)),
        };
        Self {
            phase,
            context_tokens,
            concurrency,
            label,
        }
    }
}

/// How far a sweep has come.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub current: Option<CurrentStep>,
    /// Measurements taken: prefill scouts plus decode cells that ran (over-capacity cells are
    /// not measurements).
    pub measurements_done: usize,
    pub measurements_total: usize,
    /// Estimated seconds until the sweep ends: the work left, stretched by the share of the
    /// time so far spent paused for production traffic (`sweep::estimate`).
    pub eta_s: Option<f64>,
    pub elapsed_s: f64,
    /// Seconds spent paused for production traffic, the pause going on now included.
    pub paused_s: f64,
    /// While paused: how long this pause has lasted so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_now_s: Option<f64>,
}

/// Everything about one sweep: the JSON of `GET /sweeps/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepStatus {
    pub id: String,
    pub state: SweepState,
    /// RFC 3339.
    pub created_at: String,
    pub updated_at: String,
    pub request: SweepRequest,
    pub plan: Option<Plan>,
    pub server: Option<ServerFacts>,
    pub progress: Progress,
    /// Why the sweep failed or what interrupted it.
    pub error: Option<String>,
    /// The matrix so far (cells not yet measured are `Not run`).
    pub matrix: Option<MatrixDoc>,
    /// A capacity search's answer (`find_capacity`): per context, the boundary and the cells
    /// measured to find it. Absent for a whole-ladder sweep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityReport>,
}

/// One line of `GET /sweeps`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepSummary {
    pub id: String,
    pub state: SweepState,
    pub created_at: String,
    pub updated_at: String,
    pub model: Option<String>,
    pub measurements_done: usize,
    pub measurements_total: usize,
    pub current: Option<String>,
    pub eta_s: Option<f64>,
    pub error: Option<String>,
}

impl SweepStatus {
    pub fn new(id: String, request: SweepRequest) -> Self {
        let now = format_rfc3339(std::time::SystemTime::now());
        Self {
            id,
            state: SweepState::Starting,
            created_at: now.clone(),
            updated_at: now,
            request,
            plan: None,
            server: None,
            progress: Progress::default(),
            error: None,
            matrix: None,
            capacity: None,
        }
    }

    pub fn summary(&self) -> SweepSummary {
        SweepSummary {
            id: self.id.clone(),
            state: self.state,
            created_at: self.created_at.clone(),
            updated_at: self.updated_at.clone(),
            model: self.plan.as_ref().map(|p| p.model.clone()),
            measurements_done: self.progress.measurements_done,
            measurements_total: self.progress.measurements_total,
            current: self.progress.current.as_ref().map(|c| c.label.clone()),
            eta_s: self.progress.eta_s,
            error: self.error.clone(),
        }
    }

    /// One progress line: `running · 8K × 4 window · 5/12 · ETA 1m 10s`.
    pub fn progress_line(&self) -> String {
        let mut line = String::from(self.state.as_str());
        if let Some(current) = &self.progress.current {
            let phase = match current.phase {
                StepPhase::Prefill => "",
                StepPhase::WarmUp => " warm-up",
                StepPhase::Window => " window",
                StepPhase::Drain => " drain",
                StepPhase::Paused => " (paused for production traffic",
            };
            if self.state.is_active() {
                line.push_str(&format!(" · {}{phase}", current.label));
                if current.phase == StepPhase::Paused {
                    match self.progress.paused_now_s {
                        Some(waited) => line.push_str(&format!(" for {})", human_duration(waited))),
                        None => line.push(')'),
                    }
                }
            }
        }
        line.push_str(&format!(
            " · {}/{} measurements",
            self.progress.measurements_done, self.progress.measurements_total
        ));
        if let Some(eta) = self.progress.eta_s.filter(|_| self.state.is_active()) {
            line.push_str(&format!(" · ETA {}", human_duration(eta)));
        }
        line.push_str(&format!(
            " · elapsed {}",
            human_duration(self.progress.elapsed_s)
        ));
        line
    }
}

/// The live status of a sweep, shared by the runner (writer) and readers; every change bumps
/// a version that followers can wait on.
#[derive(Debug)]
pub struct StatusCell {
    status: Mutex<SweepStatus>,
    version: watch::Sender<u64>,
}

impl StatusCell {
    pub fn new(status: SweepStatus) -> Arc<Self> {
        Arc::new(Self {
            status: Mutex::new(status),
            version: watch::Sender::new(0),
        })
    }

    /// A copy of the status now.
    pub fn snapshot(&self) -> SweepStatus {
        lock::lock(&self.status).clone()
    }

    /// Changes the status and tells followers.
    pub fn update<R>(&self, change: impl FnOnce(&mut SweepStatus) -> R) -> R {
        let result = {
            let mut status = lock::lock(&self.status);
            let result = change(&mut status);
            status.updated_at = format_rfc3339(std::time::SystemTime::now());
            result
        };
        self.version.send_modify(|v| *v += 1);
        result
    }

    pub fn state(&self) -> SweepState {
        lock::lock(&self.status).state
    }

    /// A receiver that sees every change from now on.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_line_reads_well() {
        let mut status = SweepStatus::new("abc".into(), SweepRequest::default());
        status.state = SweepState::Running;
        status.progress = Progress {
            current: Some(CurrentStep::new(StepPhase::Window, 8192, Some(4))),
            measurements_done: 5,
            measurements_total: 12,
            eta_s: Some(70.0),
            elapsed_s: 42.0,
            paused_s: 0.0,
            paused_now_s: None,
        };
        assert_eq!(
            status.progress_line(),
            "running · 8K × 4 window · 5/12 measurements · ETA 1m 10s · elapsed 42s"
        );
        let mut paused = status.clone();
        paused.state = SweepState::Paused;
        paused.progress.current = Some(CurrentStep::new(StepPhase::Paused, 8192, Some(4)));
        paused.progress.paused_now_s = Some(12.4);
        assert_eq!(
            paused.progress_line(),
            "paused · 8K × 4 (paused for production traffic for 12s) · 5/12 measurements · ETA 1m 10s · elapsed 42s"
        );
        assert_eq!(human_duration(3725.0), "1h 02m");
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["state"], "running");
        assert_eq!(json["progress"]["current"]["phase"], "window");
        let back: SweepStatus = serde_json::from_value(json).unwrap();
        assert_eq!(back, status);
    }
}
