//! The database itself: [`Store`] (one SQLite connection under a mutex, the schema and the
//! sweep and snapshot statements), its error and its typed rows; the other files add the
//! reference, configuration and workload statements to it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use rusqlite::{params, Connection, OptionalExtension};

use crate::base::lock;
use crate::base::wallclock::{from_unix_millis, unix_millis};
use crate::matrix::doc::MatrixDoc;
use crate::matrix::import::{parse_json, ImportError};
use crate::meter::labels::{SliceFilter, SliceValue, TENANT};

/// The database file inside the data directory.
pub const FILE_NAME: &str = "tokentap.sqlite3";

/// The schema version this build writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 1;

/// Why the store could not do what was asked; each names the file or the row.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the store directory {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the store {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("the store {} has schema version {found}; this tokentap reads up to {SCHEMA_VERSION}", path.display())]
    NewerSchema { path: PathBuf, found: i64 },
    #[error("store query failed: {what}")]
    Query {
        what: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("the {table} row {id} holds a matrix that does not read back")]
    CorruptMatrix {
        table: &'static str,
        id: String,
        #[source]
        source: Box<ImportError>,
    },
    #[error("the sweeps row {id} has an unknown state {state:?}")]
    UnknownState { id: String, state: String },
}

/// Where a sweep is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SweepState {
    Queued,
    Running,
    Paused,
    /// Every planned cell was measured; its matrix is final.
    Finished,
    Cancelled,
    Failed,
}

impl SweepState {
    pub const ALL: [SweepState; 6] = [
        SweepState::Queued,
        SweepState::Running,
        SweepState::Paused,
        SweepState::Finished,
        SweepState::Cancelled,
        SweepState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SweepState::Queued => "queued",
            SweepState::Running => "running",
            SweepState::Paused => "paused",
            SweepState::Finished => "finished",
            SweepState::Cancelled => "cancelled",
            SweepState::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<SweepState> {
        SweepState::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// One sweep as stored. `plan_json` is the sweep engine's own (opaque here); `matrix` is the
/// partial or final result.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepRow {
    pub id: String,
    pub state: SweepState,
    pub plan_json: String,
    pub matrix: Option<MatrixDoc>,
    pub created_at: SystemTime,
    pub updated_at: SystemTime,
}

/// A stored production snapshot without its matrix (for listings).
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotInfo {
    pub id: i64,
    pub taken_at: SystemTime,
    /// Length of the window the snapshot aggregates.
    pub window: Duration,
    pub model: String,
    /// The tenant whose requests it covers (`[tenants]`); `None`: every request, or a slice
    /// of another dimension.
    pub tenant: Option<String>,
    /// The slice of the traffic it covers, as its key (`tenant=search`; see
    /// `meter::labels::SliceFilter::store_key`); `None`: every request.
    pub slice: Option<String>,
    /// Decode cells and output tokens in it (for listings).
    pub cells: u64,
    pub output_tokens: u64,
}

/// A stored production snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub info: SnapshotInfo,
    pub matrix: MatrixDoc,
}

/// The SQLite store.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    connection: Mutex<Connection>,
}

pub(super) fn query(what: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |source| StoreError::Query { what, source }
}

impl Store {
    /// Opens (creating if needed) `dir/tokentap.sqlite3` and brings its schema up to date.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
        let path = dir.join(FILE_NAME);
        let open_error = |source| StoreError::Open {
            path: path.clone(),
            source,
        };
        let connection = Connection::open(&path).map_err(open_error)?;
        connection
            .busy_timeout(Duration::from_secs(5))
            .map_err(open_error)?;
        // WAL: readers (the CLI, the admin page) never block the snapshot writer. Switching the
        // journal mode while another process opens the same file can answer "database is locked"
        // without consulting the busy timeout, so it is retried for a bounded while.
        let mut attempts = 0;
        let _mode: String = loop {
            match connection.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)) {
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy && attempts < 100 =>
                {
                    attempts += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
                result => break result.map_err(open_error)?,
            }
        };
        let version: i64 = connection
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(open_error)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                path,
                found: version,
            });
        }
        connection
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS sweeps (
                    id TEXT PRIMARY KEY,
                    state TEXT NOT NULL,
                    plan_json TEXT NOT NULL,
                    matrix_json TEXT,
                    created_ms INTEGER NOT NULL,
                    updated_ms INTEGER NOT NULL
                );
                CREATE INDEX IF NOT EXISTS sweeps_by_update ON sweeps (updated_ms);
                CREATE TABLE IF NOT EXISTS snapshots (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    taken_ms INTEGER NOT NULL,
                    window_ms INTEGER NOT NULL,
                    model TEXT NOT NULL,
                    cells INTEGER NOT NULL,
                    output_tokens INTEGER NOT NULL,
                    matrix_json TEXT NOT NULL
                );
                CREATE INDEX IF NOT EXISTS snapshots_by_time ON snapshots (taken_ms);
                CREATE TABLE IF NOT EXISTS reference_matrices (
                    upstream TEXT NOT NULL,
                    model TEXT NOT NULL,
                    source TEXT NOT NULL,
                    pinned_ms INTEGER NOT NULL,
                    matrix_json TEXT NOT NULL,
                    PRIMARY KEY (upstream, model)
                );
                CREATE TABLE IF NOT EXISTS workload (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    started_ms INTEGER NOT NULL,
                    route TEXT NOT NULL,
                    model TEXT NOT NULL,
                    stream INTEGER NOT NULL,
                    prompt_tokens INTEGER,
                    cached_tokens INTEGER,
                    max_tokens INTEGER,
                    output_tokens INTEGER NOT NULL,
                    outcome TEXT NOT NULL,
                    prefix_blocks BLOB NOT NULL
                );
                CREATE INDEX IF NOT EXISTS workload_by_time ON workload (started_ms);
                PRAGMA user_version = 1;",
            )
            .map_err(open_error)?;
        add_snapshot_column(&connection, "tenant").map_err(open_error)?;
        add_snapshot_column(&connection, "slice").map_err(open_error)?;
        add_column(&connection, "workload", "turn").map_err(open_error)?;
        Ok(Store {
            path,
            connection: Mutex::new(connection),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(super) fn connection(&self) -> std::sync::MutexGuard<'_, Connection> {
        lock::lock(&self.connection)
    }

    /// Inserts or replaces a sweep (by id).
    pub fn put_sweep(&self, sweep: &SweepRow) -> Result<(), StoreError> {
        let matrix = sweep.matrix.as_ref().map(crate::matrix::render_json);
        self.connection()
            .execute(
                "INSERT INTO sweeps (id, state, plan_json, matrix_json, created_ms, updated_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(id) DO UPDATE SET state = excluded.state,
                   plan_json = excluded.plan_json, matrix_json = excluded.matrix_json,
                   updated_ms = excluded.updated_ms",
                params![
                    sweep.id,
                    sweep.state.as_str(),
                    sweep.plan_json,
                    matrix,
                    unix_millis(sweep.created_at),
                    unix_millis(sweep.updated_at)
                ],
            )
            .map_err(query("put_sweep"))?;
        Ok(())
    }

    /// Every sweep, newest first.
    pub fn sweeps(&self) -> Result<Vec<SweepRow>, StoreError> {
        self.select_sweeps("ORDER BY created_ms DESC, id DESC", params![])
    }

    /// One sweep by id.
    pub fn sweep(&self, id: &str) -> Result<Option<SweepRow>, StoreError> {
        Ok(self.select_sweeps("WHERE id = ?1", params![id])?.pop())
    }

    /// The most recently updated finished sweep that holds a matrix.
    pub fn latest_finished_sweep(&self) -> Result<Option<SweepRow>, StoreError> {
        Ok(self
            .select_sweeps(
                "WHERE state = ?1 AND matrix_json IS NOT NULL ORDER BY updated_ms DESC, id DESC LIMIT 1",
                params![SweepState::Finished.as_str()],
            )?
            .pop())
    }

    fn select_sweeps(
        &self,
        tail: &str,
        parameters: &[&dyn rusqlite::ToSql],
    ) -> Result<Vec<SweepRow>, StoreError> {
        let connection = self.connection();
        let mut statement = connection
            .prepare(&format!(
                "SELECT id, state, plan_json, matrix_json, created_ms, updated_ms FROM sweeps {tail}"
            ))
            .map_err(query("select sweeps"))?;
        let rows = statement
            .query_map(parameters, |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, Option<String>>(3)?,
                    row.get::<_, i64>(4)?,
                    row.get::<_, i64>(5)?,
                ))
            })
            .map_err(query("select sweeps"))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, state, plan_json, matrix_json, created, updated) =
                row.map_err(query("read a sweeps row"))?;
            let Some(state) = SweepState::parse(&state) else {
                return Err(StoreError::UnknownState { id, state });
            };
            let matrix = match matrix_json {
                Some(json) => Some(read_matrix("sweeps", &id, &json)?),
                None => None,
            };
            out.push(SweepRow {
                id,
                state,
                plan_json,
                matrix,
                created_at: from_unix_millis(created),
                updated_at: from_unix_millis(updated),
            });
        }
        Ok(out)
    }

    /// Stores a production snapshot of `model` taken at `at` over a window of `window`.
    pub fn put_snapshot(
        &self,
        at: SystemTime,
        window: Duration,
        model: &str,
        slice: &SliceFilter,
        matrix: &MatrixDoc,
    ) -> Result<i64, StoreError> {
        // The tenant column, which older readers know, when the slice is one tenant's.
        let tenant = slice
            .get(TENANT.name)
            .filter(|_| slice.parameters().count() == 1);
        let key = slice.store_key();
        let output_tokens: u64 = matrix.decode.iter().filter_map(|c| c.output_tokens).sum();
        let connection = self.connection();
        connection
            .execute(
                "INSERT INTO snapshots (taken_ms, window_ms, model, cells, output_tokens, matrix_json, tenant, slice)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    unix_millis(at),
                    i64::try_from(window.as_millis()).unwrap_or(i64::MAX),
                    model,
                    i64::try_from(matrix.decode.len()).unwrap_or(i64::MAX),
                    i64::try_from(output_tokens).unwrap_or(i64::MAX),
                    crate::matrix::render_json(matrix),
                    tenant,
                    key
                ],
            )
            .map_err(query("put_snapshot"))?;
        Ok(connection.last_insert_rowid())
    }

    /// Snapshots taken in `from..to` (either end open when `None`), oldest first.
    pub fn snapshots(
        &self,
        from: Option<SystemTime>,
        to: Option<SystemTime>,
    ) -> Result<Vec<SnapshotInfo>, StoreError> {
        let connection = self.connection();
        let mut statement = connection
            .prepare(
                "SELECT id, taken_ms, window_ms, model, cells, output_tokens, tenant, slice FROM snapshots
                 WHERE taken_ms >= ?1 AND taken_ms < ?2 ORDER BY taken_ms, id",
            )
            .map_err(query("select snapshots"))?;
        let rows = statement
            .query_map(
                params![
                    from.map_or(i64::MIN, unix_millis),
                    to.map_or(i64::MAX, unix_millis)
                ],
                snapshot_info,
            )
            .map_err(query("select snapshots"))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(query("read a snapshots row"))
    }

    /// The latest snapshot taken at or before `at` (of `model`, when given), of `tenant`'s
    /// requests (`None`: of every request).
    pub fn snapshot_at(
        &self,
        at: SystemTime,
        model: Option<&str>,
        tenant: Option<&str>,
    ) -> Result<Option<Snapshot>, StoreError> {
        let slice = match tenant {
            Some(tenant) => SliceFilter::only(&TENANT, SliceValue::from(tenant)),
            None => SliceFilter::default(),
        };
        self.snapshot_of(at, model, &slice)
    }

    /// The latest snapshot taken at or before `at` (of `model`, when given), of the slice of
    /// the traffic `slice` selects (all of it when empty).
    pub fn snapshot_of(
        &self,
        at: SystemTime,
        model: Option<&str>,
        slice: &SliceFilter,
    ) -> Result<Option<Snapshot>, StoreError> {
        let connection = self.connection();
        // A row written before the slice column has only its tenant.
        let row = connection
            .query_row(
                "SELECT id, taken_ms, window_ms, model, cells, output_tokens, tenant, slice, matrix_json
                 FROM snapshots WHERE taken_ms <= ?1 AND (?2 IS NULL OR model = ?2)
                 AND COALESCE(slice, 'tenant=' || tenant) IS ?3
                 ORDER BY taken_ms DESC, id DESC LIMIT 1",
                params![unix_millis(at), model, slice.store_key()],
                |row| Ok((snapshot_info(row)?, row.get::<_, String>(8)?)),
            )
            .optional()
            .map_err(query("snapshot_at"))?;
        drop(connection);
        row.map(|(info, json)| {
            let matrix = read_matrix("snapshots", &info.id.to_string(), &json)?;
            Ok(Snapshot { info, matrix })
        })
        .transpose()
    }

    /// Deletes snapshots taken before `older_than`; returns how many.
    pub fn prune(&self, older_than: SystemTime) -> Result<usize, StoreError> {
        self.connection()
            .execute(
                "DELETE FROM snapshots WHERE taken_ms < ?1",
                params![unix_millis(older_than)],
            )
            .map_err(query("prune snapshots"))
    }
}

fn snapshot_info(row: &rusqlite::Row<'_>) -> rusqlite::Result<SnapshotInfo> {
    Ok(SnapshotInfo {
        id: row.get(0)?,
        taken_at: from_unix_millis(row.get(1)?),
        window: Duration::from_millis(u64::try_from(row.get::<_, i64>(2)?).unwrap_or(0)),
        model: row.get(3)?,
        cells: u64::try_from(row.get::<_, i64>(4)?).unwrap_or(0),
        output_tokens: u64::try_from(row.get::<_, i64>(5)?).unwrap_or(0),
        tenant: row.get(6)?,
        slice: row.get::<_, Option<String>>(7)?.or_else(|| {
            row.get::<_, Option<String>>(6)
                .ok()
                .flatten()
                .map(|t| format!("tenant={t}"))
        }),
    })
}

/// Adds `snapshots.<column>` (`tenant`, then `slice`) to a store made before it (NULL: every
/// request). The schema version stays 1: an older tokentap reads and writes such a store as
/// before.
fn add_snapshot_column(connection: &Connection, column: &str) -> rusqlite::Result<()> {
    add_column(connection, "snapshots", column)
}

/// Adds a nullable TEXT column to `table` of a store made before it existed.
fn add_column(connection: &Connection, table: &str, column: &str) -> rusqlite::Result<()> {
    let present: bool = connection.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2)",
        [table, column],
        |row| row.get(0),
    )?;
    if present {
        return Ok(());
    }
    match connection.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} TEXT")) {
        // Another process opening the same store added it first.
        Err(rusqlite::Error::SqliteFailure(_, Some(message)))
            if message.contains("duplicate column") =>
        {
            Ok(())
        }
        result => result,
    }
}

pub(super) fn read_matrix(
    table: &'static str,
    id: &str,
    json: &str,
) -> Result<MatrixDoc, StoreError> {
    parse_json(json).map_err(|source| StoreError::CorruptMatrix {
        table,
        id: id.to_owned(),
        source: Box::new(source),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::doc::{CellStatus, DecodeCell, Metadata};

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("tokentap-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn doc(tokens: u64) -> MatrixDoc {
        let mut doc = MatrixDoc::new(Metadata::default());
        let mut cell = DecodeCell::status_only(8192, 4, CellStatus::Valid);
        cell.output_tokens = Some(tokens);
        cell.total_tok_s = Some(123.25);
        doc.decode.push(cell);
        doc
    }

    #[test]
    fn snapshots_survive_reopening_and_prune_by_age() {
        let dir = temp_dir("snapshots");
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000 + s);
        {
            let store = Store::open(&dir).unwrap();
            for (i, at) in [0, 3600, 7200].into_iter().enumerate() {
                store
                    .put_snapshot(
                        t(at),
                        Duration::from_secs(3600),
                        "m",
                        &SliceFilter::default(),
                        &doc(i as u64 + 1),
                    )
                    .unwrap();
            }
            store
                .put_snapshot(
                    t(7200),
                    Duration::from_secs(3600),
                    "other",
                    &SliceFilter::default(),
                    &doc(9),
                )
                .unwrap();
        }
        let store = Store::open(&dir).unwrap();
        let all = store.snapshots(None, None).unwrap();
        assert_eq!(all.len(), 4);
        assert_eq!(all[0].output_tokens, 1);
        assert_eq!(all[0].window, Duration::from_secs(3600));
        let middle = store.snapshot_at(t(5000), None, None).unwrap().unwrap();
        assert_eq!(middle.info.taken_at, t(3600));
        assert_eq!(middle.matrix, doc(2));
        let other = store
            .snapshot_at(t(9000), Some("m"), None)
            .unwrap()
            .unwrap();
        assert_eq!(other.info.model, "m");
        assert!(store
            .snapshot_at(t(0) - Duration::from_secs(1), None, None)
            .unwrap()
            .is_none());
        assert_eq!(
            store.snapshots(Some(t(3600)), Some(t(7200))).unwrap().len(),
            1
        );
        assert_eq!(store.prune(t(3600)).unwrap(), 1);
        assert_eq!(store.snapshots(None, None).unwrap().len(), 3);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sweeps_upsert_and_the_latest_finished_one_is_found() {
        let dir = temp_dir("sweeps");
        let store = Store::open(&dir).unwrap();
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000 + s);
        let mut sweep = SweepRow {
            id: "s1".into(),
            state: SweepState::Running,
            plan_json: "{\"contexts\":[8192]}".into(),
            matrix: None,
            created_at: t(0),
            updated_at: t(0),
        };
        store.put_sweep(&sweep).unwrap();
        assert!(store.latest_finished_sweep().unwrap().is_none());
        sweep.state = SweepState::Finished;
        sweep.matrix = Some(doc(5));
        sweep.updated_at = t(60);
        store.put_sweep(&sweep).unwrap();
        store
            .put_sweep(&SweepRow {
                id: "s2".into(),
                state: SweepState::Cancelled,
                plan_json: "{}".into(),
                matrix: Some(doc(1)),
                created_at: t(100),
                updated_at: t(120),
            })
            .unwrap();
        assert_eq!(store.sweeps().unwrap().len(), 2);
        assert_eq!(store.sweeps().unwrap()[0].id, "s2");
        assert_eq!(store.sweep("s1").unwrap().unwrap(), sweep);
        assert_eq!(store.latest_finished_sweep().unwrap().unwrap().id, "s1");
        assert!(store.sweep("nope").unwrap().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_newer_schema_is_refused_by_name() {
        let dir = temp_dir("schema");
        drop(Store::open(&dir).unwrap());
        let connection = Connection::open(dir.join(FILE_NAME)).unwrap();
        connection
            .execute_batch("PRAGMA user_version = 99")
            .unwrap();
        drop(connection);
        let error = Store::open(&dir).unwrap_err().to_string();
        assert!(error.contains("99") && error.contains(FILE_NAME), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
