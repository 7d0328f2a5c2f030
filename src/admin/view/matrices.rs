//! The production matrix as the admin shows it — of a model, of the configurations a
//! [`FingerprintChoice`] names, of one slice of the traffic (`meter::labels::SliceFilter`) — with its notes (the other
//! configurations in the window, the missing cache report), and the latest synthetic matrix.

use std::sync::Arc;
use std::time::SystemTime;

use crate::aggregate::config::{apply_config, set_fingerprint};
use crate::aggregate::{FingerprintFilter, RecordFilter, Window};
use crate::base::Source;
use crate::matrix::doc::{MatrixDoc, Metadata};
use crate::meter::identity::{ConfigEntry, FingerprintId};
use crate::meter::labels::SliceFilter;
use crate::proxy::upstream::Upstream;

use super::sources::{current_configurations, routed_upstream, View};

/// The message when there is no synthetic matrix to show.
pub const NO_SWEEP: &str = "no synthetic sweep has run yet: start one with `tokentap sweep --admin URL` (POST /sweeps); until then only the production matrix exists";

/// The latest synthetic matrix: the sweep engine's slot, else the store's latest finished
/// sweep, else `None`.
pub async fn synthetic_matrix(
    view: View<'_>,
) -> Result<Option<Arc<MatrixDoc>>, crate::store::StoreError> {
    if let Some(doc) = view.synthetic.get() {
        return Ok(Some(doc));
    }
    let Some(store) = view.store.clone() else {
        return Ok(None);
    };
    let row = tokio::task::spawn_blocking(move || store.latest_finished_sweep())
        .await
        .unwrap_or(Ok(None))?;
    Ok(row.and_then(|row| row.matrix).map(Arc::new))
}

/// The production matrix of `model` (or the busiest) over `window`, of the configuration the
/// upstream runs now; an empty document with a note when nothing ended in the window. `None`
/// only when a named model had no traffic.
pub fn production_matrix(view: View<'_>, window: Window, model: Option<&str>) -> Option<MatrixDoc> {
    production_matrix_of(view, window, model, FingerprintChoice::Current)
}

/// Which of an upstream's configurations a production matrix covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FingerprintChoice {
    /// The one each upstream runs now (and requests from before it was first read).
    #[default]
    Current,
    /// Every configuration together.
    All,
    /// This one.
    Id(FingerprintId),
}

impl FingerprintChoice {
    /// `current` (or empty), `all`, or a fingerprint id; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "current" | "" => Some(Self::Current),
            "all" => Some(Self::All),
            _ => FingerprintId::parse(text).map(Self::Id),
        }
    }
}

/// As [`production_matrix`], of the configurations `choice` names; the metadata is filled
/// from the configuration's facts and names the others the window holds.
pub fn production_matrix_of(
    view: View<'_>,
    window: Window,
    model: Option<&str>,
    choice: FingerprintChoice,
) -> Option<MatrixDoc> {
    production_matrix_sliced(view, window, model, choice, &SliceFilter::default())
}

/// As [`production_matrix_of`], of one tenant's or priority band's requests.
pub fn production_matrix_sliced(
    view: View<'_>,
    window: Window,
    model: Option<&str>,
    choice: FingerprintChoice,
    slice: &SliceFilter,
) -> Option<MatrixDoc> {
    let now = SystemTime::now();
    let registry = view.proxy.meter.identities();
    let (filter, config): (FingerprintFilter, Option<ConfigEntry>) = match choice {
        FingerprintChoice::All => (FingerprintFilter::All, None),
        FingerprintChoice::Id(id) => (FingerprintFilter::Only(vec![id]), registry.config(id)),
        FingerprintChoice::Current => (
            current_configurations(view),
            routed_upstream(view, model).identity.current_config(),
        ),
    };
    let records = RecordFilter {
        fingerprints: filter.clone(),
        slice: slice.clone(),
    };
    let mut doc = match view.production.matrix_where(window, model, now, &records) {
        Some(doc) => doc,
        None if model.is_some() => return None,
        None => {
            let mut metadata = Metadata::default();
            metadata.run.source = Some(Source::Production);
            metadata.run.benchmark_tool = Some(format!("tokentap v{}", env!("CARGO_PKG_VERSION")));
            metadata.notes.push(format!(
                "No production requests{} ended in the window ({}).",
                records
                    .describe()
                    .map_or_else(String::new, |slice| format!(" of {slice}")),
                window.label()
            ));
            MatrixDoc::new(metadata)
        }
    };
    cache_report_note(&mut doc, routed_upstream(view, model));
    match (&config, choice) {
        (Some(config), _) => apply_config(&mut doc.metadata, config),
        (None, FingerprintChoice::Id(id)) => set_fingerprint(&mut doc.metadata, id),
        (None, _) => {}
    }
    let served = model
        .map(str::to_owned)
        .or_else(|| doc.metadata.model.served_model.clone());
    if let Some(served) = served {
        let present = view.production.fingerprints(window, &served, now);
        let describe = |ids: &[(FingerprintId, u64)]| {
            ids.iter()
                .map(|(id, n)| format!("{id} ({n} requests)"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if choice == FingerprintChoice::All {
            if !present.is_empty() {
                doc.metadata.notes.push(format!(
                    "Covers every configuration (fingerprint) of the upstream in the window: {}.",
                    describe(&present)
                ));
            }
        } else {
            let others: Vec<(FingerprintId, u64)> = present
                .into_iter()
                .filter(|(id, _)| !filter.admits(*id))
                .collect();
            if !others.is_empty() {
                doc.metadata.notes.push(format!(
                    "Other configurations (fingerprints) in this window, not in this matrix: {} (ask with ?fingerprint=ID or fingerprint=all).",
                    describe(&others)
                ));
            }
        }
    }
    Some(doc)
}

/// When the window has traffic but the server reported no cached prompt tokens, a note names
/// the engine's flag that turns the report on, and what stands in meanwhile: the server's own
/// prefix-cache counters ("Prefix cache hits", when it is scraped).
fn cache_report_note(doc: &mut MatrixDoc, upstream: &Upstream) {
    if doc.decode.is_empty() || doc.decode.iter().any(|c| c.prompt_cache.is_some()) {
        return;
    }
    let flag = upstream
        .engine()
        .and_then(|engine| engine.spec().usage.cache_report_flag.map(|f| (engine, f)));
    let scraped = doc.decode.iter().any(|c| {
        c.server_state
            .is_some_and(|s| s.prefix_cache_hit_rate.is_some())
    });
    let stand_in = if scraped {
        "the Prefix cache hits column (the server's own counters) stands in"
    } else {
        "scrape the server's /metrics (upstream.metrics_interval) for its own prefix-cache hit rate meanwhile"
    };
    doc.metadata.notes.push(match flag {
        Some((engine, flag)) => format!(
            "The server reports no cached prompt tokens, so TTFT is not split warm and cold: start {} with {flag} to have it report them; {stand_in}.",
            engine.name()
        ),
        None => format!(
            "The server reports no cached prompt tokens, so TTFT is not split warm and cold; {stand_in}."
        ),
    });
}
