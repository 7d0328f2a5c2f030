//! Where finished (and running) sweeps are kept: a small seam ([`SweepStore`]) with an
//! in-memory implementation (no data dir) and a SQLite one (rusqlite, bundled) in the data
//! dir, so results are listed again after a restart. A sweep that was active when the process
//! stopped is marked `interrupted` when the store is opened again.
//!
//! Calls are synchronous and short (one row, one JSON document); the manager runs them on the
//! blocking pool. Until the shared store (`src/store/`) lands, the SQLite file is
//! `<data_dir>/sweeps.sqlite3`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use super::status::{SweepState, SweepStatus, SweepSummary};

/// File name of the sweep database inside the data dir.
pub const SWEEP_DB_FILE: &str = "sweeps.sqlite3";
/// Most sweeps `list` returns (newest first).
pub const LIST_LIMIT: usize = 200;

/// Why the store failed; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the data directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("sweep store {path}: SQLite error")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("sweep store {path}: sweep {id} holds JSON this tokentap cannot read")]
    Corrupt {
        path: PathBuf,
        id: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot serialize sweep {id}")]
    Serialize {
        id: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The store for a configured data dir: SQLite in it, or memory when there is none.
pub fn open(data_dir: Option<&Path>) -> Result<std::sync::Arc<dyn SweepStore>, StoreError> {
    Ok(match data_dir {
        Some(dir) => std::sync::Arc::new(SqliteStore::open_in(dir)?),
        None => std::sync::Arc::new(MemoryStore::default()),
    })
}

/// Keeps sweep statuses.
pub trait SweepStore: Send + Sync + std::fmt::Debug {
    /// Inserts or replaces the sweep with this id.
    fn put(&self, status: &SweepStatus) -> Result<(), StoreError>;
    /// Summaries, newest first.
    fn list(&self) -> Result<Vec<SweepSummary>, StoreError>;
    fn get(&self, id: &str) -> Result<Option<SweepStatus>, StoreError>;
}

/// Keeps sweeps for the life of the process.
#[derive(Debug, Default)]
pub struct MemoryStore {
    sweeps: Mutex<BTreeMap<String, SweepStatus>>,
}

impl SweepStore for MemoryStore {
    fn put(&self, status: &SweepStatus) -> Result<(), StoreError> {
        self.sweeps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(status.id.clone(), status.clone());
        Ok(())
    }

    fn list(&self) -> Result<Vec<SweepSummary>, StoreError> {
        let sweeps = self.sweeps.lock().unwrap_or_else(PoisonError::into_inner);
        let mut list: Vec<SweepSummary> = sweeps.values().map(SweepStatus::summary).collect();
        list.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
        list.truncate(LIST_LIMIT);
        Ok(list)
    }

    fn get(&self, id: &str) -> Result<Option<SweepStatus>, StoreError> {
        Ok(self
            .sweeps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned())
    }
}

/// Sweeps in a SQLite file.
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    connection: Mutex<rusqlite::Connection>,
}

impl SqliteStore {
    /// Opens (creating if needed) `<dir>/sweeps.sqlite3`, and marks sweeps that were active
    /// when the last process stopped as interrupted.
    pub fn open_in(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
        Self::open(&dir.join(SWEEP_DB_FILE))
    }

    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let sqlite = |source| StoreError::Sqlite {
            path: path.to_owned(),
            source,
        };
        let connection = rusqlite::Connection::open(path).map_err(sqlite)?;
        connection
            .execute_batch(
                "PRAGMA journal_mode = WAL;
                 PRAGMA busy_timeout = 5000;
                 CREATE TABLE IF NOT EXISTS sweeps (
                     id TEXT PRIMARY KEY,
                     state TEXT NOT NULL,
                     created_at TEXT NOT NULL,
                     updated_at TEXT NOT NULL,
                     status_json TEXT NOT NULL
                 );",
            )
            .map_err(sqlite)?;
        let store = Self {
            path: path.to_owned(),
            connection: Mutex::new(connection),
        };
        store.mark_interrupted()?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn sqlite(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    fn decode(&self, id: String, json: &str) -> Result<SweepStatus, StoreError> {
        serde_json::from_str(json).map_err(|source| StoreError::Corrupt {
            path: self.path.clone(),
            id,
            source,
        })
    }

    fn mark_interrupted(&self) -> Result<(), StoreError> {
        let active: Vec<(String, String)> = {
            let connection = self
                .connection
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut statement = connection
                .prepare(
                    "SELECT id, status_json FROM sweeps
                     WHERE state IN ('starting', 'running', 'paused', 'cancelling')",
                )
                .map_err(|e| self.sqlite(e))?;
            let rows = statement
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
                .map_err(|e| self.sqlite(e))?;
            rows.collect::<Result<_, _>>().map_err(|e| self.sqlite(e))?
        };
        for (id, json) in active {
            let Ok(mut status) = self.decode(id, &json) else {
                continue; // unreadable rows are reported by get/list, not here
            };
            status.state = SweepState::Interrupted;
            status.error = Some("tokentap stopped while this sweep was running".to_owned());
            if let Some(current) = status.progress.current.take() {
                status.error = Some(format!(
                    "tokentap stopped while this sweep was running (at {})",
                    current.label
                ));
            }
            status.progress.eta_s = None;
            self.put(&status)?;
        }
        Ok(())
    }
}

impl SweepStore for SqliteStore {
    fn put(&self, status: &SweepStatus) -> Result<(), StoreError> {
        let json = serde_json::to_string(status).map_err(|source| StoreError::Serialize {
            id: status.id.clone(),
            source,
        })?;
        let connection = self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        connection
            .execute(
                "INSERT INTO sweeps (id, state, created_at, updated_at, status_json)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(id) DO UPDATE SET state = ?2, updated_at = ?4, status_json = ?5",
                rusqlite::params![
                    status.id,
                    status.state.as_str(),
                    status.created_at,
                    status.updated_at,
                    json
                ],
            )
            .map_err(|e| self.sqlite(e))?;
        Ok(())
    }

    fn list(&self) -> Result<Vec<SweepSummary>, StoreError> {
        let rows: Vec<(String, String)> = {
            let connection = self
                .connection
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut statement = connection
                .prepare(
                    "SELECT id, status_json FROM sweeps
                     ORDER BY created_at DESC, id DESC LIMIT ?1",
                )
                .map_err(|e| self.sqlite(e))?;
            let rows = statement
                .query_map([LIST_LIMIT as i64], |row| Ok((row.get(0)?, row.get(1)?)))
                .map_err(|e| self.sqlite(e))?;
            rows.collect::<Result<_, _>>().map_err(|e| self.sqlite(e))?
        };
        rows.into_iter()
            .map(|(id, json)| self.decode(id, &json).map(|s| s.summary()))
            .collect()
    }

    fn get(&self, id: &str) -> Result<Option<SweepStatus>, StoreError> {
        let json: Option<String> = {
            let connection = self
                .connection
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut statement = connection
                .prepare("SELECT status_json FROM sweeps WHERE id = ?1")
                .map_err(|e| self.sqlite(e))?;
            let mut rows = statement.query([id]).map_err(|e| self.sqlite(e))?;
            match rows.next().map_err(|e| self.sqlite(e))? {
                Some(row) => Some(row.get(0).map_err(|e| self.sqlite(e))?),
                None => None,
            }
        };
        json.map(|json| self.decode(id.to_owned(), &json))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::plan::SweepRequest;

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "tokentap-sweep-store-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn sqlite_keeps_sweeps_and_marks_running_ones_interrupted() {
        let dir = scratch_dir("reopen");
        {
            let store = SqliteStore::open_in(&dir).unwrap();
            let mut done = SweepStatus::new("a".into(), SweepRequest::default());
            done.state = SweepState::Finished;
            store.put(&done).unwrap();
            let mut running = SweepStatus::new("b".into(), SweepRequest::default());
            running.state = SweepState::Running;
            store.put(&running).unwrap();
            running.progress.measurements_done = 3;
            store.put(&running).unwrap();
            assert_eq!(store.list().unwrap().len(), 2);
        }
        let store = SqliteStore::open_in(&dir).unwrap();
        assert_eq!(store.get("a").unwrap().unwrap().state, SweepState::Finished);
        let b = store.get("b").unwrap().unwrap();
        assert_eq!(b.state, SweepState::Interrupted);
        assert_eq!(b.progress.measurements_done, 3);
        assert!(store.get("nope").unwrap().is_none());
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
