//! Reference matrices in the store: at most one per (upstream, model), with its provenance
//! (source in words and when it was pinned), so a pinned reference survives a restart.
//!
//! The table was added without raising the schema version: it is additive, and a build that
//! predates it opens the file and simply never reads it.

use rusqlite::{params, OptionalExtension};

use crate::base::wallclock::{from_unix_millis, unix_millis};
use crate::matrix::compare::Reference;

use super::db::{query, read_matrix, Store, StoreError};

impl Store {
    /// Pins `reference` for its upstream and model, replacing any earlier one.
    pub fn put_reference(&self, reference: &Reference) -> Result<(), StoreError> {
        self.connection()
            .execute(
                "INSERT INTO reference_matrices (upstream, model, source, pinned_ms, matrix_json)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(upstream, model) DO UPDATE SET source = excluded.source,
                   pinned_ms = excluded.pinned_ms, matrix_json = excluded.matrix_json",
                params![
                    reference.upstream,
                    reference.model,
                    reference.source,
                    unix_millis(reference.pinned_at),
                    crate::matrix::render_json(&reference.matrix)
                ],
            )
            .map_err(query("put_reference"))?;
        Ok(())
    }

    /// The reference pinned for `upstream` and `model`.
    pub fn reference(&self, upstream: &str, model: &str) -> Result<Option<Reference>, StoreError> {
        let connection = self.connection();
        let row = connection
            .query_row(
                "SELECT upstream, model, source, pinned_ms, matrix_json FROM reference_matrices
                 WHERE upstream = ?1 AND model = ?2",
                params![upstream, model],
                reference_row,
            )
            .optional()
            .map_err(query("reference"))?;
        drop(connection);
        row.map(into_reference).transpose()
    }

    /// Every pinned reference, by upstream then model.
    pub fn references(&self) -> Result<Vec<Reference>, StoreError> {
        let connection = self.connection();
        let mut statement = connection
            .prepare(
                "SELECT upstream, model, source, pinned_ms, matrix_json FROM reference_matrices
                 ORDER BY upstream, model",
            )
            .map_err(query("select references"))?;
        let rows = statement
            .query_map([], reference_row)
            .map_err(query("select references"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(query("read a reference_matrices row"))?;
        drop(statement);
        drop(connection);
        rows.into_iter().map(into_reference).collect()
    }

    /// Unpins the reference of `upstream` and `model`; whether there was one.
    pub fn delete_reference(&self, upstream: &str, model: &str) -> Result<bool, StoreError> {
        let deleted = self
            .connection()
            .execute(
                "DELETE FROM reference_matrices WHERE upstream = ?1 AND model = ?2",
                params![upstream, model],
            )
            .map_err(query("delete_reference"))?;
        Ok(deleted > 0)
    }
}

type ReferenceRow = (String, String, String, i64, String);

fn reference_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ReferenceRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
    ))
}

fn into_reference(
    (upstream, model, source, pinned_ms, json): ReferenceRow,
) -> Result<Reference, StoreError> {
    let matrix = read_matrix("reference_matrices", &format!("{upstream}/{model}"), &json)?;
    Ok(Reference {
        upstream,
        model,
        source,
        pinned_at: from_unix_millis(pinned_ms),
        matrix,
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::matrix::doc::{CellStatus, DecodeCell, MatrixDoc, Metadata};

    #[test]
    fn references_survive_reopening_replace_by_key_and_delete() {
        let dir =
            std::env::temp_dir().join(format!("tokentap-store-references-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut matrix = MatrixDoc::new(Metadata::default());
        let mut cell = DecodeCell::status_only(8192, 8, CellStatus::Valid);
        cell.per_request_tok_s = Some(64.1);
        matrix.decode.push(cell);
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_750_000_000_123);
        let reference = Reference {
            upstream: "default".into(),
            model: "m".into(),
            source: "page".into(),
            pinned_at: at,
            matrix,
        };
        {
            let store = Store::open(&dir).unwrap();
            store.put_reference(&reference).unwrap();
            let mut other = reference.clone();
            other.model = "n".into();
            store.put_reference(&other).unwrap();
        }
        let store = Store::open(&dir).unwrap();
        assert_eq!(
            store.reference("default", "m").unwrap(),
            Some(reference.clone())
        );
        assert_eq!(store.references().unwrap().len(), 2);
        let mut replaced = reference.clone();
        replaced.source = "latest-sweep s1".into();
        store.put_reference(&replaced).unwrap();
        assert_eq!(
            store.reference("default", "m").unwrap().unwrap().source,
            "latest-sweep s1"
        );
        assert!(store.delete_reference("default", "m").unwrap());
        assert!(!store.delete_reference("default", "m").unwrap());
        assert_eq!(store.reference("default", "m").unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
