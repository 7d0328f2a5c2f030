//! The matrix before anything ran: the run's metadata and notes, every planned cell `Not run`
//! (or `Over capacity`), every prefill row `Not run`.

use std::time::SystemTime;

use crate::base::wallclock::format_rfc3339 as rfc3339;
use crate::matrix::units::context_label;
use crate::matrix::{
    CellStatus, DecodeCell, Engine, Hardware, MatrixDoc, Metadata, ModelInfo, PrefillRow, RunInfo,
    Source as MatrixSource,
};
use crate::sweep::plan::{Plan, ServerFacts};

/// The matrix before anything ran: every planned cell `Not run` (or `Over capacity`).
pub fn initial_matrix(id: &str, plan: &Plan, facts: &ServerFacts) -> MatrixDoc {
    let mut notes = vec![format!(
        "Prompts of exact length on /v1/completions with a unique per-run prefix; max output {} tokens with ignore_eos; KV budget {} ({})",
        plan.max_output,
        plan.kv_budget_tokens
            .map_or_else(|| "unknown".to_owned(), |b| format!("{b} tokens")),
        plan.kv_source
    )];
    for step in plan.steps.iter().filter(|s| s.prompt_tokens != s.context) {
        notes.push(format!(
            "The {} prefill row sends {} prompt tokens, the longest the server accepts (a prompt plus max_tokens must stay below the context length; sglang also refuses max_req_input_len tokens or more)",
            context_label(step.context),
            step.prompt_tokens
        ));
    }
    if let Some(shape) = &plan.like_production {
        notes.push(shape.note());
    }
    notes.extend(plan.notes.iter().cloned());
    let metadata = Metadata {
        model: ModelInfo {
            display_name: None,
            served_model: Some(plan.model.clone()),
            model_path: facts.model_path.clone(),
            revision: None,
        },
        hardware: Hardware {
            label: facts.hardware.clone(),
            gpu_count: facts.gpu_count,
            ..Hardware::default()
        },
        engine: Engine {
            name: facts.engine.map(|e| e.name().to_owned()),
            version: facts.engine_version.clone(),
            quantization: facts.quantization.clone().filter(|q| !q.is_empty()),
            ..Engine::default()
        },
        run: RunInfo {
            source: Some(MatrixSource::Synthetic),
            benchmark_tool: Some(format!("tokentap v{}", env!("CARGO_PKG_VERSION"))),
            decode_test: Some("Fixed duration".to_owned()),
            prefill_mode: Some("Measured during decode warm-up".to_owned()),
            time_per_measurement_s: Some(plan.cell_duration_s),
            max_output_tokens: Some(plan.max_output),
            sweep_id: Some(id.to_owned()),
            window_s: None,
            started_at: Some(rfc3339(SystemTime::now())),
            ended_at: None,
            shape: plan
                .like_production
                .as_ref()
                .map(|_| crate::matrix::doc::LIKE_PRODUCTION.to_owned()),
        },
        launch_command: None,
        // The configuration it ran on (`aggregate::config`'s fact), so drift against a
        // reference pinned from it compares the same configuration's production.
        extra_facts: facts
            .fingerprint
            .iter()
            .map(|id| crate::matrix::doc::Fact {
                section: crate::aggregate::config::FINGERPRINT_SECTION.to_owned(),
                key: crate::aggregate::config::FINGERPRINT_KEY.to_owned(),
                value: id.clone(),
            })
            .collect(),
        notes,
    };
    let mut doc = MatrixDoc::new(metadata);
    for step in &plan.steps {
        doc.prefill.push(PrefillRow {
            context_tokens: step.context,
            requests_at_once: 1,
            status: CellStatus::NotRun,
            prompt_tok_s: None,
            ttft_ms: None,
            completed_requests: None,
            prompt_tokens: None,
        });
        if step.decode {
            for &concurrency in &plan.concurrency {
                let status = if plan.over_capacity(step.context, concurrency) {
                    CellStatus::OverCapacity
                } else {
                    CellStatus::NotRun
                };
                doc.decode
                    .push(DecodeCell::status_only(step.context, concurrency, status));
            }
        }
    }
    doc.sort();
    doc
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::base::engine::Engine;
    use crate::config::SweepConfig;
    use crate::sweep::plan::SweepRequest;

    #[test]
    fn initial_matrix_validates_and_marks_over_capacity() {
        let facts = ServerFacts {
            engine: Some(Engine::SGLANG),
            served_model: Some("step3p7".into()),
            context_length: Some(262_144),
            kv_budget_tokens: Some(622_592),
            answered: true,
            ..ServerFacts::default()
        };
        let config = SweepConfig {
            production_guard: 4,
            cell_duration: Duration::from_secs(30),
            max_output: 4096,
            kv_budget_tokens: 0,
            max_default_duration: Duration::ZERO,
        };
        let plan = Plan::resolve(&SweepRequest::default(), &facts, &config).unwrap();
        let doc = initial_matrix("abc", &plan, &facts);
        doc.validate().unwrap();
        assert_eq!(doc.prefill.len(), 7);
        assert_eq!(doc.decode.len(), 6 * 8);
        assert_eq!(
            doc.cell(16 << 10, 32).unwrap().status,
            CellStatus::OverCapacity
        );
        assert_eq!(doc.cell(32 << 10, 16).unwrap().status, CellStatus::NotRun);
        assert_eq!(doc.metadata.notes.len(), 2);
    }
}
