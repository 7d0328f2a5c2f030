//! What `tokentap matrix show --store DIR [--at TIME] [--model NAME] [--tenant NAME]` reads
//! from the store: a
//! listing of the snapshots, or the one to render. Errors name the directory and the time.

use std::fmt::Write as _;
use std::path::Path;
use std::time::SystemTime;

use anyhow::Context as _;

use crate::base::wallclock::{format_rfc3339, parse_rfc3339};
use crate::matrix::doc::MatrixDoc;

use crate::store::{Store, FILE_NAME};

fn open_existing(dir: &Path) -> anyhow::Result<Store> {
    anyhow::ensure!(
        dir.join(FILE_NAME).is_file(),
        "{} holds no {FILE_NAME}: point --store at the proxy's store.data_dir",
        dir.display()
    );
    Store::open(dir).with_context(|| format!("cannot open the store in {}", dir.display()))
}

/// The snapshot to render for `--at` (`None` when no `--at` was given: list instead).
pub fn snapshot_for_show(
    dir: &Path,
    at: Option<&str>,
    model: Option<&str>,
    tenant: Option<&str>,
) -> anyhow::Result<Option<MatrixDoc>> {
    let Some(at) = at else {
        return Ok(None);
    };
    let time = if at.eq_ignore_ascii_case("latest") {
        SystemTime::now()
    } else {
        parse_rfc3339(at).with_context(|| {
            format!("--at {at:?} is not an RFC 3339 time like 2025-06-01T12:00:00Z (or `latest`)")
        })?
    };
    let store = open_existing(dir)?;
    let snapshot = store.snapshot_at(time, model, tenant)?.with_context(|| {
        format!(
            "{} has no snapshot{}{} taken at or before {}",
            dir.display(),
            model.map_or_else(String::new, |m| format!(" of model {m:?}")),
            tenant.map_or_else(String::new, |t| format!(
                " of tenant {t:?} (a tenant's snapshots are written when [tenants] is on)"
            )),
            format_rfc3339(time)
        )
    })?;
    Ok(Some(snapshot.matrix))
}

/// A plain-text table of every snapshot (of `model` and `tenant`, when given; without a
/// tenant, the snapshots of every request), oldest first.
pub fn list_snapshots(
    dir: &Path,
    model: Option<&str>,
    tenant: Option<&str>,
) -> anyhow::Result<String> {
    let store = open_existing(dir)?;
    let snapshots = store.snapshots(None, None)?;
    let mut out = String::from("id\ttaken at\twindow\tmodel\ttenant\tcells\toutput tokens\n");
    let mut shown = 0;
    for info in snapshots
        .iter()
        .filter(|s| model.is_none_or(|m| s.model == m))
        .filter(|s| s.tenant.as_deref() == tenant)
    {
        shown += 1;
        let _ = writeln!(
            out,
            "{}\t{}\t{}s\t{}\t{}\t{}\t{}",
            info.id,
            format_rfc3339(info.taken_at),
            info.window.as_secs(),
            info.model,
            info.tenant.as_deref().unwrap_or("all"),
            info.cells,
            info.output_tokens
        );
    }
    let _ = writeln!(
        out,
        "{shown} snapshot(s) in {}; render one with --at TIME (or --at latest)",
        store.path().display()
    );
    Ok(out)
}
