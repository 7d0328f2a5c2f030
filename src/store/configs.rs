//! The upstreams' configurations in the store: one row per configuration change (time,
//! upstream, fingerprint id, the one before, the facts as JSON), at most [`KEPT_PER_UPSTREAM`]
//! per upstream, so a change and what changed survive a restart.
//!
//! The table is created on first use and was added without raising the schema version: it is
//! additive, and a build that predates it never reads it.

use std::collections::BTreeMap;
use std::time::SystemTime;

use rusqlite::params;

use crate::base::wallclock::{from_unix_millis, unix_millis};
use crate::meter::identity::{ConfigEntry, ConfigFacts, FingerprintId};

use super::db::{query, Store, StoreError};

/// Rows kept per upstream; the oldest go first.
pub const KEPT_PER_UPSTREAM: i64 = 100;

const CREATE: &str = "CREATE TABLE IF NOT EXISTS upstream_configs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    upstream TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    previous TEXT,
    seen_ms INTEGER NOT NULL,
    fields_json TEXT NOT NULL,
    extra_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS upstream_configs_by_upstream ON upstream_configs (upstream, id);";

/// One stored configuration change.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigRow {
    pub upstream: String,
    pub id: FingerprintId,
    pub previous: Option<FingerprintId>,
    pub seen: SystemTime,
    pub facts: ConfigFacts,
}

impl ConfigRow {
    pub fn from_entry(upstream: &str, entry: &ConfigEntry) -> Self {
        Self {
            upstream: upstream.to_owned(),
            id: entry.id,
            previous: entry.previous,
            seen: entry.since,
            facts: entry.facts.clone(),
        }
    }
}

impl Store {
    /// Records that `row.upstream` now runs `row.id`; drops that upstream's oldest rows past
    /// [`KEPT_PER_UPSTREAM`].
    pub fn put_config(&self, row: &ConfigRow) -> Result<(), StoreError> {
        let fields = serde_json::to_string(&row.facts.fields).unwrap_or_else(|_| "{}".into());
        let extra = serde_json::to_string(&row.facts.extra).unwrap_or_else(|_| "{}".into());
        let connection = self.connection();
        connection
            .execute_batch(CREATE)
            .map_err(query("create upstream_configs"))?;
        connection
            .execute(
                "INSERT INTO upstream_configs (upstream, fingerprint, previous, seen_ms, fields_json, extra_json)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    row.upstream,
                    row.id.to_string(),
                    row.previous.map(|p| p.to_string()),
                    unix_millis(row.seen),
                    fields,
                    extra
                ],
            )
            .map_err(query("put_config"))?;
        connection
            .execute(
                "DELETE FROM upstream_configs WHERE upstream = ?1 AND id NOT IN
                 (SELECT id FROM upstream_configs WHERE upstream = ?1 ORDER BY id DESC LIMIT ?2)",
                params![row.upstream, KEPT_PER_UPSTREAM],
            )
            .map_err(query("trim upstream_configs"))?;
        Ok(())
    }

    /// `upstream`'s stored configuration changes, oldest first.
    pub fn configs(&self, upstream: &str) -> Result<Vec<ConfigRow>, StoreError> {
        let connection = self.connection();
        connection
            .execute_batch(CREATE)
            .map_err(query("create upstream_configs"))?;
        let mut statement = connection
            .prepare(
                "SELECT upstream, fingerprint, previous, seen_ms, fields_json, extra_json
                 FROM upstream_configs WHERE upstream = ?1 ORDER BY id",
            )
            .map_err(query("select upstream_configs"))?;
        let rows = statement
            .query_map(params![upstream], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, Option<String>>(2)?,
                    row.get::<_, i64>(3)?,
                    row.get::<_, String>(4)?,
                    row.get::<_, String>(5)?,
                ))
            })
            .map_err(query("select upstream_configs"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(query("read an upstream_configs row"))?;
        let map = |json: &str| -> BTreeMap<String, String> {
            serde_json::from_str(json).unwrap_or_default()
        };
        Ok(rows
            .into_iter()
            .filter_map(|(upstream, id, previous, seen, fields, extra)| {
                Some(ConfigRow {
                    upstream,
                    id: FingerprintId::parse(&id)?,
                    previous: previous.as_deref().and_then(FingerprintId::parse),
                    seen: from_unix_millis(seen),
                    facts: ConfigFacts {
                        fields: map(&fields),
                        extra: map(&extra),
                    },
                })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_survive_and_stay_bounded() {
        let dir =
            std::env::temp_dir().join(format!("tokentap-store-configs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).unwrap();
        assert!(store.configs("u").unwrap().is_empty());
        let mut facts = ConfigFacts::default();
        facts.fields.insert("version".into(), "0.5.1".into());
        facts
            .extra
            .insert("launch_command".into(), "python -m sglang".into());
        for i in 0..(KEPT_PER_UPSTREAM as u64 + 5) {
            store
                .put_config(&ConfigRow {
                    upstream: "u".into(),
                    id: FingerprintId::from_hash(i),
                    previous: i.checked_sub(1).map(FingerprintId::from_hash),
                    seen: from_unix_millis(1_000 * i as i64),
                    facts: facts.clone(),
                })
                .unwrap();
        }
        drop(store);
        let store = Store::open(&dir).unwrap();
        let rows = store.configs("u").unwrap();
        assert_eq!(rows.len(), KEPT_PER_UPSTREAM as usize);
        let last = rows.last().unwrap();
        assert_eq!(
            last.id,
            FingerprintId::from_hash(KEPT_PER_UPSTREAM as u64 + 4)
        );
        assert_eq!(last.facts, facts);
        assert!(store.configs("other").unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
