//! The demo's second step: a short sweep through the proxy's admin-side manager, followed
//! until it ends.

use std::sync::Arc;

use super::args::DemoArgs;
use super::start::Demo;
use crate::app::sweep::follow_local;
use crate::matrix::MatrixDoc;
use crate::sweep::plan::{DurationValue, SweepRequest, TokensValue};
use crate::sweep::status::SweepState;

/// What the sweep gave: how it ended, its matrix, and the model the phases after it ask for.
pub struct SweepOutcome {
    pub state: SweepState,
    pub synthetic: MatrixDoc,
    pub model: String,
}

/// Step 1/4: the sweep of `--contexts` × `--concurrency`, its progress on stderr.
pub async fn sweep(demo: &Demo, args: &DemoArgs) -> anyhow::Result<SweepOutcome> {
    let request = SweepRequest {
        contexts: Some(
            args.contexts
                .iter()
                .map(|c| TokensValue::Label(c.trim().to_owned()))
                .collect(),
        ),
        concurrency: Some(args.concurrency.clone()),
        cell_duration: Some(DurationValue::Text(args.cell_duration.clone())),
        ..SweepRequest::default()
    };
    let manager = Arc::clone(&demo.server.admin.sweeps);
    let id = manager
        .start(request)
        .await
        .map_err(|error| anyhow::anyhow!(crate::proxy::error::error_chain(&error)))?;
    eprintln!();
    eprintln!(
        "1/4 Synthetic sweep {id}. While it runs:\n    curl -s -H 'Authorization: Bearer {}' http://{}/sweeps/{id}",
        demo.token, demo.server.admin_addr
    );
    let status = follow_local(&manager, &id, true).await?;
    let Some(synthetic) = status.matrix.clone() else {
        anyhow::bail!(
            "the sweep ended {} without a matrix: {}",
            status.state.as_str(),
            status.error.unwrap_or_default()
        );
    };
    if status.state != SweepState::Finished {
        eprintln!("the sweep ended {}", status.state.as_str());
    }
    let model = synthetic
        .metadata
        .model
        .served_model
        .clone()
        .unwrap_or_else(|| demo.profile_name.clone());
    Ok(SweepOutcome {
        state: status.state,
        synthetic,
        model,
    })
}
