//! Validation of a matrix document: what every consumer relies on, checked once where a
//! document is built or read.
//!
//! Owns [`ValidationError`] and the checks of [`MatrixDoc::validate`]: the schema tag, numbers,
//! statuses, one-line texts, RFC 3339 times, redacted launch commands, and the fact fields as
//! the fact table (`facts.rs`) types them. Pure: no I/O.
use std::collections::BTreeSet;

use super::doc::{
    CellStatus, DecodeCell, FirstTokens, MatrixDoc, Metadata, PrefillRow, PromptCache, ServerState,
    Tails, SCHEMA,
};
use super::facts::{FactValue, FACTS, FACT_SECTIONS};
use tokentap_base::wallclock::is_rfc3339;

/// Why a document is not acceptable; each names the offending item.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    #[error("schema is {found:?}, this tokentap reads {SCHEMA:?}")]
    Schema { found: String },
    #[error("{item}: {field} must be a finite number ≥ 0, found {value}")]
    BadNumber {
        item: String,
        field: &'static str,
        value: f64,
    },
    #[error("{item}: {field} is a share and must lie in 0–1, found {value}")]
    NotAShare {
        item: String,
        field: &'static str,
        value: f64,
    },
    #[error("{item}: {field} must be > 0")]
    Zero { item: String, field: &'static str },
    #[error("{item} appears twice")]
    Duplicate { item: String },
    #[error("{item}: a cell with status {status} carries measured figures; only Valid and Error cells may")]
    FiguresOnSkippedCell { item: String, status: String },
    #[error("{item}: the error reason must be one non-empty line without control characters (use CellStatus::error)")]
    BadErrorReason { item: String },
    #[error("{field}: must be one line without control characters, found {value:?}")]
    BadText { field: String, value: String },
    #[error(
        "metadata.launch_command holds a secret; store redact_launch_command(command) instead"
    )]
    UnredactedLaunchCommand,
    #[error("{field}: expected an RFC 3339 time like 2025-06-01T12:00:00Z, found {value:?}")]
    BadTime { field: &'static str, value: String },
}

impl MatrixDoc {
    /// Checks what every consumer relies on: the schema tag, finite non-negative numbers, positive
    /// contexts and concurrency, no duplicate cells, no figures on skipped cells, one-line texts
    /// (so every rendering stays well-formed) and RFC 3339 times.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.schema != SCHEMA {
            return Err(ValidationError::Schema {
                found: self.schema.clone(),
            });
        }
        validate_metadata(&self.metadata)?;
        let mut seen_prefill = BTreeSet::new();
        for row in &self.prefill {
            row.validate()?;
            if !seen_prefill.insert(row.context_tokens) {
                return Err(ValidationError::Duplicate {
                    item: format!("prefill row {}", row.context_tokens),
                });
            }
        }
        let mut seen_cells = BTreeSet::new();
        for cell in &self.decode {
            cell.validate()?;
            if !seen_cells.insert((cell.context_tokens, cell.concurrency)) {
                return Err(ValidationError::Duplicate {
                    item: format!("decode cell {} × {}", cell.context_tokens, cell.concurrency),
                });
            }
        }
        Ok(())
    }
}

impl PrefillRow {
    /// The checks of [`MatrixDoc::validate`] that concern this row alone.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let item = format!("prefill row {}", self.context_tokens);
        if self.context_tokens == 0 {
            return Err(ValidationError::Zero {
                item,
                field: "context_tokens",
            });
        }
        if self.requests_at_once == 0 {
            return Err(ValidationError::Zero {
                item,
                field: "requests_at_once",
            });
        }
        check_status(&item, &self.status)?;
        check_number(&item, "prompt_tok_s", self.prompt_tok_s)?;
        check_number(&item, "ttft_ms", self.ttft_ms)?;
        let has_figures = self.prompt_tok_s.is_some()
            || self.ttft_ms.is_some()
            || self.completed_requests.is_some()
            || self.prompt_tokens.is_some();
        check_skipped(&item, &self.status, has_figures)
    }
}

impl DecodeCell {
    /// The checks of [`MatrixDoc::validate`] that concern this cell alone.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let item = format!("decode cell {} × {}", self.context_tokens, self.concurrency);
        if self.context_tokens == 0 {
            return Err(ValidationError::Zero {
                item,
                field: "context_tokens",
            });
        }
        if self.concurrency == 0 {
            return Err(ValidationError::Zero {
                item,
                field: "concurrency",
            });
        }
        check_status(&item, &self.status)?;
        check_number(&item, "total_tok_s", self.total_tok_s)?;
        check_number(&item, "per_request_tok_s", self.per_request_tok_s)?;
        check_number(&item, "ttft_ms", self.ttft_ms)?;
        check_number(&item, "tbt_ms", self.tbt_ms)?;
        check_number(
            &item,
            "average_active_requests",
            self.average_active_requests,
        )?;
        check_number(&item, "measured_for_s", self.measured_for_s)?;
        check_number(&item, "prefill_overlap_share", self.prefill_overlap_share)?;
        if let Some(share) = self.prefill_overlap_share.filter(|share| *share > 1.0) {
            return Err(ValidationError::NotAShare {
                item,
                field: "prefill_overlap_share",
                value: share,
            });
        }
        check_number(&item, "overlapping_prefills", self.overlapping_prefills)?;
        check_number(&item, "slo_attainment", self.slo_attainment)?;
        if let Some(share) = self.slo_attainment.filter(|share| *share > 1.0) {
            return Err(ValidationError::NotAShare {
                item,
                field: "slo_attainment",
                value: share,
            });
        }
        check_number(&item, "goodput_tok_s", self.goodput_tok_s)?;
        if let Some(state) = &self.server_state {
            for (field, value) in ServerState::NAMES.iter().zip(state.values()) {
                check_number(&item, field, value)?;
            }
        }
        if let Some(tails) = &self.tails {
            for (field, value) in Tails::NAMES.iter().zip(tails.values()) {
                check_number(&item, field, value)?;
            }
        }
        check_number(&item, "production_in_flight", self.production_in_flight)?;
        check_number(&item, "tokens_per_step", self.tokens_per_step)?;
        if let Some(cache) = &self.prompt_cache {
            for (field, value) in PromptCache::NAMES.iter().zip(cache.values()) {
                check_number(&item, field, value)?;
            }
        }
        if let Some(first) = &self.first_tokens {
            for (field, value) in FirstTokens::NAMES.iter().zip(first.values()) {
                check_number(&item, field, value)?;
            }
        }
        check_skipped(&item, &self.status, self.has_figures())
    }
}

/// The checks of [`MatrixDoc::validate`] that concern the metadata.
fn validate_metadata(metadata: &Metadata) -> Result<(), ValidationError> {
    let title_parts = [
        ("metadata.model.display_name", &metadata.model.display_name),
        ("metadata.hardware.label", &metadata.hardware.label),
    ];
    for (field, value) in title_parts {
        if let Some(value) = value {
            check_line(field, value)?;
        }
    }
    let facts = || {
        FACTS
            .iter()
            .filter_map(|field| Some((field.key, (field.get)(metadata)?)))
    };
    for (key, value) in facts() {
        if let FactValue::Text(text) = value {
            check_line(key, text)?;
        }
    }
    for (index, fact) in metadata.extra_facts.iter().enumerate() {
        check_line(
            &format!("metadata.extra_facts[{index}].section"),
            &fact.section,
        )?;
        check_line(&format!("metadata.extra_facts[{index}].key"), &fact.key)?;
        check_line(&format!("metadata.extra_facts[{index}].value"), &fact.value)?;
        if !FACT_SECTIONS.contains(&fact.section.as_str()) {
            return Err(ValidationError::BadText {
                field: format!("metadata.extra_facts[{index}].section (Hardware, Engine or Run)"),
                value: fact.section.clone(),
            });
        }
        if fact.key.contains(':') || super::facts::field(&fact.section, &fact.key).is_some() {
            return Err(ValidationError::BadText {
                field: format!("metadata.extra_facts[{index}].key"),
                value: fact.key.clone(),
            });
        }
    }
    for (index, note) in metadata.notes.iter().enumerate() {
        check_line(&format!("metadata.notes[{index}]"), note)?;
    }
    if let Some(command) = &metadata.launch_command {
        // The redaction check comes first so no error message ever quotes a secret.
        if super::redact::redact_launch_command(command) != *command {
            return Err(ValidationError::UnredactedLaunchCommand);
        }
        if command.trim().is_empty()
            || command.trim() != command
            || command
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t')
        {
            return Err(ValidationError::BadText {
                field: "metadata.launch_command".to_owned(),
                value: command.clone(),
            });
        }
    }
    for (key, value) in facts() {
        if let FactValue::Seconds(number)
        | FactValue::Memory {
            per_gpu_gb: number, ..
        } = value
        {
            // `metadata.run.window_s` is reported as item `metadata.run`, field `window_s`.
            let (item, field) = key.rsplit_once('.').unwrap_or(("metadata", key));
            check_number(item, field, Some(number))?;
        }
    }
    for (key, value) in facts() {
        if let FactValue::Time(time) = value {
            check_time(key, time)?;
        }
    }
    Ok(())
}

fn check_number(
    item: &str,
    field: &'static str,
    value: Option<f64>,
) -> Result<(), ValidationError> {
    match value {
        Some(number) if !number.is_finite() || number < 0.0 => Err(ValidationError::BadNumber {
            item: item.to_owned(),
            field,
            value: number,
        }),
        _ => Ok(()),
    }
}

fn check_status(item: &str, status: &CellStatus) -> Result<(), ValidationError> {
    if let CellStatus::Error(reason) | CellStatus::Shed(reason) = status {
        let clean =
            !reason.is_empty() && reason.trim() == reason && !reason.chars().any(char::is_control);
        if !clean {
            return Err(ValidationError::BadErrorReason {
                item: item.to_owned(),
            });
        }
    }
    Ok(())
}

fn check_skipped(
    item: &str,
    status: &CellStatus,
    has_figures: bool,
) -> Result<(), ValidationError> {
    if has_figures && matches!(status, CellStatus::OverCapacity | CellStatus::NotRun) {
        return Err(ValidationError::FiguresOnSkippedCell {
            item: item.to_owned(),
            status: status.to_string(),
        });
    }
    Ok(())
}

fn check_line(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.trim().is_empty() || value.trim() != value || value.chars().any(char::is_control) {
        return Err(ValidationError::BadText {
            field: field.to_owned(),
            value: value.to_owned(),
        });
    }
    Ok(())
}

/// Checks the shape `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` and the ranges of each part.
fn check_time(field: &'static str, value: &str) -> Result<(), ValidationError> {
    if is_rfc3339(value) {
        Ok(())
    } else {
        Err(ValidationError::BadTime {
            field,
            value: value.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_the_offending_item() {
        let mut doc = MatrixDoc::new(Metadata::default());
        doc.decode
            .push(DecodeCell::status_only(8192, 1, CellStatus::Valid));
        doc.decode
            .push(DecodeCell::status_only(8192, 1, CellStatus::NotRun));
        let error = doc.validate().unwrap_err();
        assert_eq!(error.to_string(), "decode cell 8192 × 1 appears twice");

        doc.decode.pop();
        doc.decode[0].total_tok_s = Some(f64::NAN);
        assert!(doc
            .validate()
            .unwrap_err()
            .to_string()
            .contains("total_tok_s"));

        doc.decode[0].total_tok_s = Some(10.0);
        doc.decode[0].status = CellStatus::OverCapacity;
        assert!(matches!(
            doc.validate(),
            Err(ValidationError::FiguresOnSkippedCell { .. })
        ));

        doc.decode[0].status = CellStatus::Valid;
        doc.metadata.run.started_at = Some("yesterday".to_owned());
        assert!(matches!(
            doc.validate(),
            Err(ValidationError::BadTime { .. })
        ));
    }
}
