//! The `workload` table: one row per captured production request, shapes only (token counts,
//! route, model, outcome, salted prefix block ids), bounded by count and age by
//! [`Store::prune_workload`].

use std::time::SystemTime;

use rusqlite::params;

use crate::base::wallclock::unix_millis;

use super::{query, Store, StoreError};

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
                       cached_tokens, max_tokens, output_tokens, outcome, prefix_blocks)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
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
                   max_tokens, output_tokens, outcome, prefix_blocks
                 FROM workload WHERE started_ms >= ?1 ORDER BY started_ms, id LIMIT ?2",
            )
            .map_err(query("select workload"))?;
        let rows = statement
            .query_map(
                params![unix_millis(from), i64::try_from(limit).unwrap_or(i64::MAX)],
                |row| {
                    Ok(WorkloadRow {
                        started_ms: row.get(0)?,
                        route: row.get(1)?,
                        model: row.get(2)?,
                        stream: row.get(3)?,
                        prompt_tokens: from_sql(row.get(4)?),
                        cached_tokens: from_sql(row.get(5)?),
                        max_tokens: from_sql(row.get(6)?),
                        output_tokens: from_sql(row.get(7)?).unwrap_or(0),
                        outcome: row.get(8)?,
                        prefix_blocks: blob_to_blocks(&row.get::<_, Vec<u8>>(9)?),
                    })
                },
            )
            .map_err(query("select workload"))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(query("read a workload row"))
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
}
