//! CSV rendering of a matrix: one row per measurement (prefill rows, then decode cells), full
//! precision, base units in the column names, empty for a missing value (RFC 4180 quoting).
use super::doc::MatrixDoc;
use super::page::{PHASE_DECODE, PHASE_PREFILL};
use super::units::context_label;

/// Column names of [`render_csv`], in order.
pub const CSV_COLUMNS: [&str; 45] = [
    "phase",
    "context",
    "context_tokens",
    "requests_at_once",
    "status",
    "total_tok_s",
    "per_request_tok_s",
    "ttft_ms",
    "tbt_ms",
    "average_active_requests",
    "completed_requests",
    "output_tokens",
    "measured_for_s",
    "prompt_tokens",
    "prefill_overlap_share",
    "overlapping_prefills",
    "slo_attainment",
    "goodput_tok_s",
    "server_running_requests",
    "server_queued_requests",
    "server_kv_cache_usage",
    "server_prefix_cache_hit_rate",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "tbt_p90_ms",
    "tbt_p99_ms",
    "itl_p90_ms",
    "itl_p99_ms",
    "production_in_flight",
    "answer_ttft_ms",
    "answer_ttft_p90_ms",
    "answer_ttft_p99_ms",
    "answer_requests",
    "tool_call_ttft_ms",
    "tool_call_ttft_p90_ms",
    "tool_call_ttft_p99_ms",
    "tool_call_requests",
    "reasoning_tokens",
    "with_tools_requests",
    "cached_share",
    "warm_ttft_ms",
    "warm_requests",
    "cold_ttft_ms",
    "cold_requests",
    "tokens_per_step",
];

/// RFC 4180 quoting. Hand-written: it is these five lines, less than a CSV crate would cost.
fn quote(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_owned()
    }
}

fn number(value: Option<f64>) -> String {
    value.map(|v| v.to_string()).unwrap_or_default()
}

fn count(value: Option<u64>) -> String {
    value.map(|v| v.to_string()).unwrap_or_default()
}

/// Renders `doc` as CSV with a header row; lines end in `\r\n` as RFC 4180 asks.
pub fn render_csv(doc: &MatrixDoc) -> String {
    let mut rows: Vec<Vec<String>> = vec![CSV_COLUMNS.iter().map(|c| (*c).to_owned()).collect()];
    let mut prefill: Vec<_> = doc.prefill.iter().collect();
    prefill.sort_by_key(|row| row.context_tokens);
    for row in prefill {
        let mut fields = vec![
            PHASE_PREFILL.to_owned(),
            context_label(row.context_tokens),
            row.context_tokens.to_string(),
            row.requests_at_once.to_string(),
            row.status.to_string(),
            number(row.prompt_tok_s),
            String::new(),
            number(row.ttft_ms),
            String::new(),
            String::new(),
            count(row.completed_requests),
            String::new(),
            String::new(),
            count(row.prompt_tokens),
        ];
        fields.resize(CSV_COLUMNS.len(), String::new());
        rows.push(fields);
    }
    let mut decode: Vec<_> = doc.decode.iter().collect();
    decode.sort_by_key(|cell| (cell.context_tokens, cell.concurrency));
    for cell in decode {
        let mut row = vec![
            PHASE_DECODE.to_owned(),
            context_label(cell.context_tokens),
            cell.context_tokens.to_string(),
            cell.concurrency.to_string(),
            cell.status.to_string(),
            number(cell.total_tok_s),
            number(cell.per_request_tok_s),
            number(cell.ttft_ms),
            number(cell.tbt_ms),
            number(cell.average_active_requests),
            count(cell.completed_requests),
            count(cell.output_tokens),
            number(cell.measured_for_s),
            count(cell.prompt_tokens),
            number(cell.prefill_overlap_share),
            number(cell.overlapping_prefills),
            number(cell.slo_attainment),
            number(cell.goodput_tok_s),
        ];
        let state = cell.server_state.unwrap_or_default();
        row.extend(state.values().map(number));
        row.extend(cell.tails.unwrap_or_default().values().map(number));
        row.push(number(cell.production_in_flight));
        row.extend(cell.first_tokens.unwrap_or_default().values().map(number));
        row.extend(cell.prompt_cache.unwrap_or_default().values().map(number));
        row.push(number(cell.tokens_per_step));
        rows.push(row);
    }
    let mut out = String::new();
    for row in rows {
        let fields: Vec<String> = row.iter().map(|field| quote(field)).collect();
        out.push_str(&fields.join(","));
        out.push_str("\r\n");
    }
    out
}
