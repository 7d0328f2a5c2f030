//! Production ÷ the reference pinned for its model, per cell (`matrix::compare`): what
//! `/matrix?compare=reference` renders and the page's drift grid shows. A reference pinned on one
//! configuration is compared with that configuration's production only.

use http::StatusCode;

use crate::aggregate::config::fingerprint_of;
use crate::aggregate::Window;
use crate::matrix::compare::MatrixCompare;

use super::matrices::{production_matrix, production_matrix_of, FingerprintChoice};
use super::sources::{resolve_upstream, View};

/// The production window compared with the reference pinned for its model: `Err` is the
/// answer to give instead (no traffic, no reference).
pub fn production_compare(
    view: View<'_>,
    window: Window,
    model: Option<&str>,
    upstream: Option<&str>,
) -> Result<MatrixCompare, (StatusCode, String)> {
    // A wrong upstream name is a bad request whatever the traffic.
    if upstream.is_some() {
        resolve_upstream(view, upstream, "")
            .map_err(|message| (StatusCode::BAD_REQUEST, message))?;
    }
    let production = production_matrix(view, window, model).ok_or_else(|| {
        (
            StatusCode::NOT_FOUND,
            format!(
                "no production request of model `{}` ended in the window ({})",
                model.unwrap_or(""),
                window.label()
            ),
        )
    })?;
    let named_model = model;
    let Some(model) = model
        .map(str::to_owned)
        .or_else(|| production.metadata.model.served_model.clone())
    else {
        return Err((
            StatusCode::NOT_FOUND,
            format!(
                "no production request ended in the window ({}), so there is no model to compare: name one with ?model=",
                window.label()
            ),
        ));
    };
    let upstream = resolve_upstream(view, upstream, &model)
        .map_err(|message| (StatusCode::BAD_REQUEST, message))?;
    let reference = view.drift.reference(&upstream, &model).ok_or_else(|| {
        (
            StatusCode::NOT_FOUND,
            format!("no reference is pinned for upstream `{upstream}` and model `{model}`: pin one with `tokentap reference pin` (PUT /reference)"),
        )
    })?;
    // A reference pinned on one configuration is compared with that configuration's
    // production only; the comparison says so when the upstream runs another one now.
    let mut label = String::from("production");
    let production = match fingerprint_of(&reference.matrix.metadata) {
        None => production,
        Some(pinned) => {
            let now = view
                .proxy
                .meter
                .identities()
                .get(&upstream)
                .map(|u| u.current());
            let doc = production_matrix_of(view, window, named_model.or(Some(&model)), FingerprintChoice::Id(pinned))
                .ok_or_else(|| {
                    (
                        StatusCode::NOT_FOUND,
                        format!(
                            "the reference was pinned on configuration {pinned}; no production request of model `{model}` on that configuration ended in the window ({}){}",
                            window.label(),
                            now.filter(|n| *n != pinned)
                                .map(|n| format!(": upstream `{upstream}` runs configuration {n} now (its fingerprint differs)"))
                                .unwrap_or_default()
                        ),
                    )
                })?;
            label = match now.filter(|n| *n != pinned) {
                Some(now) => format!("production on configuration {pinned}, the reference's (the upstream runs {now} now: its fingerprint differs)"),
                None => format!("production on configuration {pinned}, the reference's"),
            };
            doc
        }
    };
    let mut compared = crate::matrix::compare::compare(
        &production,
        &reference.matrix,
        crate::aggregate::drift::reference_info(&reference),
        &view.drift.settings.evidence,
    );
    if compared.production.label.is_empty() {
        compared.production.label = label;
    }
    // A reference swept like production (`matrix::doc::LIKE_PRODUCTION`) is production's own
    // shape; say so, since a seed-method reference answers another question.
    if reference.matrix.like_production() {
        compared
            .production
            .label
            .push_str(" (reference shaped like production)");
    }
    Ok(compared)
}
