//! Where sweeps are kept: a small seam ([`SweepStore`]) with two implementations — the shared
//! SQLite [`Store`] (`<data_dir>/tokentap.sqlite3`, table `sweeps`), so results are listed again
//! after a restart, and [`MemoryStore`] when there is no data dir.
//!
//! In the shared store a sweep is one row: its matrix (the partial or final result, which the
//! admin page's "latest synthetic matrix" falls back to) and, in `plan_json`, the sweep's whole
//! status without the matrix (request, plan, server facts, progress, error). A sweep that was
//! active when the process stopped is marked interrupted (`failed` in the row) by
//! [`SweepStore::recover`] when the manager starts.
//!
//! Calls are synchronous and short; the manager runs them on the blocking pool.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::SystemTime;

use super::status::{SweepState, SweepStatus, SweepSummary};
use crate::base::lock;
use crate::base::wallclock::{format_rfc3339, parse_rfc3339};
use crate::store::{Store, StoreError, SweepRow, SweepState as RowState};

/// Most sweeps `list` returns (newest first).
pub const LIST_LIMIT: usize = 200;

/// Keeps sweep statuses.
pub trait SweepStore: Send + Sync + std::fmt::Debug {
    /// Inserts or replaces the sweep with this id.
    fn put(&self, status: &SweepStatus) -> Result<(), StoreError>;
    /// Summaries, newest first.
    fn list(&self) -> Result<Vec<SweepSummary>, StoreError>;
    fn get(&self, id: &str) -> Result<Option<SweepStatus>, StoreError>;
    /// Marks sweeps left active by a previous process as interrupted; returns how many.
    fn recover(&self) -> Result<usize, StoreError> {
        Ok(0)
    }
}

/// Keeps sweeps for the life of the process.
#[derive(Debug, Default)]
pub struct MemoryStore {
    sweeps: Mutex<BTreeMap<String, SweepStatus>>,
}

impl SweepStore for MemoryStore {
    fn put(&self, status: &SweepStatus) -> Result<(), StoreError> {
        lock::lock(&self.sweeps).insert(status.id.clone(), status.clone());
        Ok(())
    }

    fn list(&self) -> Result<Vec<SweepSummary>, StoreError> {
        let sweeps = lock::lock(&self.sweeps);
        let mut list: Vec<SweepSummary> = sweeps.values().map(SweepStatus::summary).collect();
        list.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
        list.truncate(LIST_LIMIT);
        Ok(list)
    }

    fn get(&self, id: &str) -> Result<Option<SweepStatus>, StoreError> {
        Ok(lock::lock(&self.sweeps).get(id).cloned())
    }
}

/// The row state of a sweep state (the shared table knows fewer states).
pub fn row_state(state: SweepState) -> RowState {
    match state {
        SweepState::Starting => RowState::Queued,
        SweepState::Running | SweepState::Cancelling => RowState::Running,
        SweepState::Paused => RowState::Paused,
        SweepState::Finished => RowState::Finished,
        SweepState::Cancelled => RowState::Cancelled,
        SweepState::Failed | SweepState::Interrupted => RowState::Failed,
    }
}

fn state_of_row(state: RowState) -> SweepState {
    match state {
        RowState::Queued => SweepState::Starting,
        RowState::Running => SweepState::Running,
        RowState::Paused => SweepState::Paused,
        RowState::Finished => SweepState::Finished,
        RowState::Cancelled => SweepState::Cancelled,
        RowState::Failed => SweepState::Failed,
    }
}

/// The row of a status: the matrix apart, the rest as JSON.
pub fn to_row(status: &SweepStatus) -> SweepRow {
    let mut rest = status.clone();
    let matrix = rest.matrix.take();
    let plan_json = serde_json::to_string(&rest).unwrap_or_else(|_| "{}".to_owned());
    let time = |text: &str| parse_rfc3339(text).unwrap_or_else(SystemTime::now);
    SweepRow {
        id: status.id.clone(),
        state: row_state(status.state),
        plan_json,
        matrix,
        created_at: time(&status.created_at),
        updated_at: time(&status.updated_at),
    }
}

/// The status of a row (a row another writer made gets a minimal status).
pub fn from_row(row: SweepRow) -> SweepStatus {
    let mut status = serde_json::from_str::<SweepStatus>(&row.plan_json)
        .ok()
        .filter(|s| s.id == row.id)
        .unwrap_or_else(|| {
            let mut status = SweepStatus::new(row.id.clone(), Default::default());
            status.state = state_of_row(row.state);
            status.created_at = format_rfc3339(row.created_at);
            status.updated_at = format_rfc3339(row.updated_at);
            status
        });
    status.matrix = row.matrix;
    status
}

impl SweepStore for Store {
    fn put(&self, status: &SweepStatus) -> Result<(), StoreError> {
        self.put_sweep(&to_row(status))
    }

    fn list(&self) -> Result<Vec<SweepSummary>, StoreError> {
        let mut rows = self.sweeps()?;
        rows.truncate(LIST_LIMIT);
        Ok(rows
            .into_iter()
            .map(|row| from_row(row).summary())
            .collect())
    }

    fn get(&self, id: &str) -> Result<Option<SweepStatus>, StoreError> {
        Ok(self.sweep(id)?.map(from_row))
    }

    fn recover(&self) -> Result<usize, StoreError> {
        let mut recovered = 0;
        for row in self.sweeps()? {
            if !matches!(
                row.state,
                RowState::Queued | RowState::Running | RowState::Paused
            ) {
                continue;
            }
            let mut status = from_row(row);
            let at = status
                .progress
                .current
                .take()
                .map(|c| format!(" (at {})", c.label))
                .unwrap_or_default();
            status.state = SweepState::Interrupted;
            status.error = Some(format!("tokentap stopped while this sweep was running{at}"));
            status.progress.eta_s = None;
            self.put(&status)?;
            recovered += 1;
        }
        Ok(recovered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::plan::SweepRequest;

    fn scratch_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "tokentap-sweep-store-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn the_shared_store_keeps_sweeps_and_recovers_running_ones() {
        let dir = scratch_dir("reopen");
        {
            let store = Store::open(&dir).unwrap();
            let mut done = SweepStatus::new("a".into(), SweepRequest::default());
            done.state = SweepState::Finished;
            done.matrix = Some(crate::matrix::MatrixDoc::new(Default::default()));
            store.put(&done).unwrap();
            let mut running = SweepStatus::new("b".into(), SweepRequest::default());
            running.state = SweepState::Running;
            running.created_at = "2099-01-01T00:00:00Z".into();
            store.put(&running).unwrap();
            running.progress.measurements_done = 3;
            store.put(&running).unwrap();
            let ids: Vec<String> = store.list().unwrap().into_iter().map(|s| s.id).collect();
            assert_eq!(ids, ["b", "a"]);
            // The admin page's fallback sees the finished sweep's matrix.
            assert_eq!(store.latest_finished_sweep().unwrap().unwrap().id, "a");
        }
        let store = Store::open(&dir).unwrap();
        assert_eq!(store.recover().unwrap(), 1);
        let a = SweepStore::get(&store, "a").unwrap().unwrap();
        assert_eq!(a.state, SweepState::Finished);
        assert!(a.matrix.is_some());
        let b = SweepStore::get(&store, "b").unwrap().unwrap();
        assert_eq!(b.state, SweepState::Interrupted);
        assert_eq!(b.progress.measurements_done, 3);
        assert!(SweepStore::get(&store, "nope").unwrap().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn memory_store_lists_newest_first() {
        let store = MemoryStore::default();
        let mut a = SweepStatus::new("a".into(), SweepRequest::default());
        a.created_at = "2025-01-01T00:00:00Z".into();
        let mut b = SweepStatus::new("b".into(), SweepRequest::default());
        b.created_at = "2025-01-02T00:00:00Z".into();
        store.put(&a).unwrap();
        store.put(&b).unwrap();
        let ids: Vec<String> = store.list().unwrap().into_iter().map(|s| s.id).collect();
        assert_eq!(ids, ["b", "a"]);
    }
}
