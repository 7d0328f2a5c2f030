//! The `workload` table: one row per captured production request, shapes only (token counts,
//! route, model, outcome, salted prefix block ids), bounded by count and age by
//! [`Store::prune_workload`]; and [`WorkloadReader`], the paged read an export streams from.

use std::time::{Duration, SystemTime};

use rusqlite::{params, Connection, OpenFlags};

use crate::base::wallclock::unix_millis;

use super::db::{query, Store, StoreError};

/// One captured request as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadRow {
    /// Wall-clock arrival, Unix milliseconds.
    pub started_ms: i64,
    pub route: String,
    pub model: String,
    pub stream: bool,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub max_tokens: Option<u64>,
    pub output_tokens: u64,
    pub outcome: String,
    pub prefix_blocks: Vec<u64>,
    /// The request as a turn of its session and its answer's first-byte and end times, as the
    /// workload writes it (JSON; opaque here). `None` in rows stored before sessions.
    pub turn: Option<String>,
}

fn to_sql(n: Option<u64>) -> Option<i64> {
    n.map(|n| i64::try_from(n).unwrap_or(i64::MAX))
}

fn from_sql(n: Option<i64>) -> Option<u64> {
    n.map(|n| u64::try_from(n).unwrap_or(0))
}

fn blocks_to_blob(blocks: &[u64]) -> Vec<u8> {
    blocks.iter().flat_map(|b| b.to_le_bytes()).collect()
}

fn blob_to_blocks(blob: &[u8]) -> Vec<u64> {
    blob.chunks_exact(8)
        .map(|c| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(c);
            u64::from_le_bytes(bytes)
        })
        .collect()
}

impl Store {
    /// Appends captured requests in one transaction.
    pub fn put_workload(&self, rows: &[WorkloadRow]) -> Result<(), StoreError> {
        let mut connection = self.connection();
        let transaction = connection
            .transaction()
            .map_err(query("begin put_workload"))?;
        {
            let mut statement = transaction
                .prepare(
                    "INSERT INTO workload (started_ms, route, model, stream, prompt_tokens,
                       cached_tokens, max_tokens, output_tokens, outcome, prefix_blocks, turn)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                )
                .map_err(query("put_workload"))?;
            for row in rows {
                statement
                    .execute(params![
                        row.started_ms,
                        row.route,
                        row.model,
                        row.stream,
                        to_sql(row.prompt_tokens),
                        to_sql(row.cached_tokens),
                        to_sql(row.max_tokens),
                        to_sql(Some(row.output_tokens)),
                        row.outcome,
                        blocks_to_blob(&row.prefix_blocks),
                        row.turn,
                    ])
                    .map_err(query("put_workload"))?;
            }
        }
        transaction.commit().map_err(query("commit put_workload"))
    }

    /// Captured requests that arrived at or after `from`, oldest first, at most `limit`.
    pub fn workload_since(
        &self,
        from: SystemTime,
        limit: usize,
    ) -> Result<Vec<WorkloadRow>, StoreError> {
        let connection = self.connection();
        let mut statement = connection
            .prepare(
                "SELECT started_ms, route, model, stream, prompt_tokens, cached_tokens,
                   max_tokens, output_tokens, outcome, prefix_blocks, turn
                 FROM workload WHERE started_ms >= ?1 ORDER BY started_ms, id LIMIT ?2",
            )
            .map_err(query("select workload"))?;
        let rows = statement
            .query_map(
                params![unix_millis(from), i64::try_from(limit).unwrap_or(i64::MAX)],
                |row| workload_row(row, 0),
            )
            .map_err(query("select workload"))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(query("read a workload row"))
    }

    /// A reader of the captured requests that arrived at or after `from` (at most `limit`,
    /// oldest first), for an export that streams them page by page.
    ///
    /// It reads on a connection of its own, read-only, inside one read transaction: WAL lets
    /// it proceed beside the writer, so it never takes the store's mutex (the page, `/matrix`,
    /// the snapshot task and the capture writer never wait for an export), and it sees one
    /// consistent state of the table however long the export takes (the rows it counted at
    /// the start are exactly the rows it reads, whatever the writer and the pruning do
    /// meanwhile). Blocking: open it on a blocking thread.
    pub fn workload_reader(
        &self,
        from: SystemTime,
        limit: usize,
    ) -> Result<WorkloadReader, StoreError> {
        let open = |source| StoreError::Open {
            path: self.path().to_path_buf(),
            source,
        };
        let connection = Connection::open_with_flags(
            self.path(),
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(open)?;
        connection
            .busy_timeout(Duration::from_secs(5))
            .map_err(open)?;
        connection
            .execute_batch("BEGIN")
            .map_err(query("begin the workload export"))?;
        let from_ms = unix_millis(from);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (rows, first_ms): (i64, Option<i64>) = connection
            .query_row(
                "SELECT count(*), min(started_ms) FROM (SELECT started_ms FROM workload
                   WHERE started_ms >= ?1 ORDER BY started_ms, id LIMIT ?2)",
                params![from_ms, limit],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .map_err(query("count the workload export"))?;
        Ok(WorkloadReader {
            connection,
            from_ms,
            rows: u64::try_from(rows).unwrap_or(0),
            left: u64::try_from(rows).unwrap_or(0),
            first_ms,
            after: (i64::MIN, i64::MIN),
        })
    }

    /// Deletes captured requests that arrived before `older_than` (when given) and all but the
    /// newest `keep`; returns how many.
    pub fn prune_workload(
        &self,
        older_than: Option<SystemTime>,
        keep: u64,
    ) -> Result<usize, StoreError> {
        let connection = self.connection();
        let mut deleted = 0;
        if let Some(older_than) = older_than {
            deleted += connection
                .execute(
                    "DELETE FROM workload WHERE started_ms < ?1",
                    params![unix_millis(older_than)],
                )
                .map_err(query("prune workload by age"))?;
        }
        deleted += connection
            .execute(
                "DELETE FROM workload WHERE id <=
                   (SELECT id FROM workload ORDER BY id DESC LIMIT 1 OFFSET ?1)",
                params![i64::try_from(keep).unwrap_or(i64::MAX)],
            )
            .map_err(query("prune workload by count"))?;
        Ok(deleted)
    }
}

/// Rows one [`WorkloadReader::next_page`] reads at most.
pub const EXPORT_PAGE_ROWS: usize = 2048;

/// One export's read of the `workload` table ([`Store::workload_reader`]): a consistent
/// snapshot, read in pages of [`EXPORT_PAGE_ROWS`] by keyset on (`started_ms`, `id`), so
/// memory holds one page whatever the table's size. Dropping it ends the read transaction.
#[derive(Debug)]
pub struct WorkloadReader {
    connection: Connection,
    from_ms: i64,
    rows: u64,
    left: u64,
    first_ms: Option<i64>,
    /// The last row read: the next page starts after it.
    after: (i64, i64),
}

impl WorkloadReader {
    /// The rows this export holds (counted at the start, in the snapshot it reads).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The first row's arrival (Unix milliseconds), when there is one.
    pub fn first_ms(&self) -> Option<i64> {
        self.first_ms
    }

    /// The next rows in arrival order (`started_ms`, then insertion), at most `max` and at
    /// most [`EXPORT_PAGE_ROWS`]; empty when every row was read.
    pub fn next_page(&mut self, max: usize) -> Result<Vec<WorkloadRow>, StoreError> {
        let page = u64::try_from(max.clamp(1, EXPORT_PAGE_ROWS))
            .unwrap_or(1)
            .min(self.left);
        if page == 0 {
            return Ok(Vec::new());
        }
        let mut statement = self
            .connection
            // Prepared per page (the `cache` feature is off): microseconds against a page's
            // milliseconds. The index is entered at the later of the window's start and the
            // last row read: with `started_ms >= ?1` alone SQLite seeks to the window's start
            // and walks every row read before, so a page cost the pages before it (a 1,000,000
            // row export was quadratic: 8 ms a page at row 150,000 against 0.6 ms).
            .prepare(
                "SELECT id, started_ms, route, model, stream, prompt_tokens, cached_tokens,
                   max_tokens, output_tokens, outcome, prefix_blocks, turn
                 FROM workload WHERE started_ms >= max(?1, ?2) AND (started_ms, id) > (?2, ?3)
                 ORDER BY started_ms, id LIMIT ?4",
            )
            .map_err(query("select a workload export page"))?;
        let mut rows = statement
            .query(params![
                self.from_ms,
                self.after.0,
                self.after.1,
                i64::try_from(page).unwrap_or(i64::MAX)
            ])
            .map_err(query("select a workload export page"))?;
        let mut out = Vec::with_capacity(usize::try_from(page).unwrap_or(0));
        while let Some(row) = rows.next().map_err(query("read a workload row"))? {
            let id: i64 = row.get(0).map_err(query("read a workload row"))?;
            let read = workload_row(row, 1).map_err(query("read a workload row"))?;
            self.after = (read.started_ms, id);
            out.push(read);
        }
        // A page shorter than asked means the snapshot has no more rows (it cannot shrink
        // under a read transaction; this only guards against a table changed behind it).
        self.left = if (out.len() as u64) < page {
            0
        } else {
            self.left - page
        };
        Ok(out)
    }
}

/// A row's fields from column `first` on, in `SELECT`'s order.
fn workload_row(row: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<WorkloadRow> {
    Ok(WorkloadRow {
        started_ms: row.get(first)?,
        route: row.get(first + 1)?,
        model: row.get(first + 2)?,
        stream: row.get(first + 3)?,
        prompt_tokens: from_sql(row.get(first + 4)?),
        cached_tokens: from_sql(row.get(first + 5)?),
        max_tokens: from_sql(row.get(first + 6)?),
        output_tokens: from_sql(row.get(first + 7)?).unwrap_or(0),
        outcome: row.get(first + 8)?,
        prefix_blocks: blob_to_blocks(&row.get::<_, Vec<u8>>(first + 9)?),
        turn: row.get(first + 10)?,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn row(started_ms: i64, blocks: Vec<u64>) -> WorkloadRow {
        WorkloadRow {
            started_ms,
            route: "chat_completions".into(),
            model: "m".into(),
            stream: true,
            prompt_tokens: Some(1000),
            cached_tokens: None,
            max_tokens: Some(64),
            output_tokens: 64,
            outcome: "ok".into(),
            prefix_blocks: blocks,
            turn: None,
        }
    }

    #[test]
    fn rows_read_back_in_arrival_order_and_prune_by_age_and_count() {
        let dir =
            std::env::temp_dir().join(format!("tokentap-store-workload-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).unwrap();
        let at = |ms: i64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64);
        store
            .put_workload(&[
                row(3000, vec![u64::MAX, 1]),
                row(1000, vec![]),
                row(2000, vec![7]),
            ])
            .unwrap();
        let rows = store.workload_since(at(0), 10).unwrap();
        assert_eq!(
            rows.iter().map(|r| r.started_ms).collect::<Vec<_>>(),
            [1000, 2000, 3000]
        );
        assert_eq!(rows[2], row(3000, vec![u64::MAX, 1]));
        assert_eq!(store.workload_since(at(1500), 1).unwrap().len(), 1);
        assert_eq!(store.prune_workload(Some(at(1500)), 10).unwrap(), 1);
        // Keep the newest one (by insertion): the 2000 ms row was inserted last.
        assert_eq!(store.prune_workload(None, 1).unwrap(), 1);
        assert_eq!(
            store.workload_since(at(0), 10).unwrap(),
            vec![row(2000, vec![7])]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_export_reader_pages_through_one_snapshot_beside_the_writer() {
        let dir = std::env::temp_dir().join(format!(
            "tokentap-store-workload-reader-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).unwrap();
        let at = |ms: i64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64);
        // Many rows share a millisecond: the keyset must not skip or repeat them.
        let rows: Vec<WorkloadRow> = (0..5000)
            .map(|i| row(1000 + i / 3, vec![i as u64]))
            .collect();
        store.put_workload(&rows).unwrap();
        let mut reader = store.workload_reader(at(1100), 4500).unwrap();
        assert_eq!(reader.rows(), 4500);
        assert_eq!(reader.first_ms(), Some(1100));
        // The writer and the pruning go on while it reads; its snapshot does not change, and
        // the store's own connection is free all along.
        store.put_workload(&[row(1200, vec![99])]).unwrap();
        store.prune_workload(None, 10).unwrap();
        let mut read = Vec::new();
        loop {
            let page = reader.next_page(1000).unwrap();
            if page.is_empty() {
                break;
            }
            assert!(page.len() <= 1000);
            read.extend(page);
        }
        assert_eq!(read.len(), 4500);
        let expected: Vec<WorkloadRow> = rows
            .iter()
            .filter(|r| r.started_ms >= 1100)
            .take(4500)
            .cloned()
            .collect();
        assert_eq!(read, expected);
        drop(reader);
        assert_eq!(store.workload_since(at(0), 100).unwrap().len(), 10);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
