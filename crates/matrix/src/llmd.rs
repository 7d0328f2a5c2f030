//! The matrix as llm-d benchmark reports (llm-d-benchmark's "Benchmarking Report", version
//! [`SCHEMA_VERSION`]): one report per measured point, as that schema intends (a report
//! describes one point of a sweep; a run of many points writes one report per stage), so a
//! matrix renders as a JSON array of reports, prefill rows first, then decode cells.
//!
//! Owns the mapping from [`MatrixDoc`] to the report's fields, and nothing else: standard fields
//! where tokentap has the quantity, in the units the schema's models allow; every tokentap
//! figure, the cell's status and the matrix metadata under the extension key
//! [`EXTENSION_KEY`] in `results.observability`, the one results section whose model takes
//! extra keys ("real reports include ad-hoc metric keys").
//!
//! The schema is vendored beside this file (`llmd/br_v0_2_1_json_schema.json`, its source in
//! `llmd/README.md`) and the tests validate every report against it.
//!
//! Two honest gaps the schema's shape forces: a statistic must carry a `mean`, and tokentap keeps
//! the median (and p90, p99) of TTFT and time between tokens, not their mean, so those
//! statistics carry the median as `mean` and as `p50`, and the extension lists them under
//! `mean_is_median`; ITL has tails only, no centre, so it stays in the extension. Cells
//! without figures (`Not run`, `Over capacity`, an `Error` with nothing measured) get no report.

use serde::Serialize;
use serde_json::{json, Map, Value};
use tokentap_base::wallclock::{is_rfc3339, parse_rfc3339};

use crate::doc::{DecodeCell, MatrixDoc, PrefillRow, Source, LIKE_PRODUCTION};

/// The benchmark report version written (the newest llm-d-benchmark states).
pub const SCHEMA_VERSION: &str = "0.2.1";

/// The key under `results.observability` that holds tokentap's own figures.
pub const EXTENSION_KEY: &str = "tokentap";

/// The vendored JSON Schema the reports conform to (for tests and for tools that want it).
pub const SCHEMA_JSON: &str = include_str!("llmd/br_v0_2_1_json_schema.json");

/// Version of the component and workload descriptions (`metadata.schema_version`).
const PART_SCHEMA_VERSION: &str = "0.0.1";

/// Every report of `doc`, one per prefill row and decode cell that holds figures.
pub fn reports(doc: &MatrixDoc) -> Vec<Value> {
    let run = RunContext::new(doc);
    let mut out = Vec::new();
    for row in doc.prefill.iter().filter(|row| prefill_has_figures(row)) {
        let stage = out.len() as u64;
        out.push(prefill_report(doc, &run, row, stage));
    }
    for cell in doc.decode.iter().filter(|cell| cell.has_figures()) {
        let stage = out.len() as u64;
        out.push(decode_report(doc, &run, cell, stage));
    }
    out
}

/// The reports of `doc` as a pretty JSON array with a trailing newline (`--format llmd`).
/// `jq -c '.[]'` splits it into one report per line.
pub fn render_llmd(doc: &MatrixDoc) -> String {
    tokentap_base::json::pretty_json_line(&reports(doc))
}

fn prefill_has_figures(row: &PrefillRow) -> bool {
    row.prompt_tok_s.is_some()
        || row.ttft_ms.is_some()
        || row.completed_requests.is_some()
        || row.prompt_tokens.is_some()
}

/// What every report of one matrix shares: the experiment, its description and times, the
/// stack.
struct RunContext {
    eid: String,
    description: String,
    time: Option<Value>,
    stack: Vec<Value>,
    engine_label: String,
    tool: String,
    tool_version: String,
    production: bool,
    metadata: Value,
}

impl RunContext {
    fn new(doc: &MatrixDoc) -> RunContext {
        let meta = &doc.metadata;
        let run = &meta.run;
        let eid = match &run.sweep_id {
            Some(id) if !id.trim().is_empty() => id.clone(),
            _ => hash_hex(&[
                "eid",
                run.source.map(Source::as_str).unwrap_or(""),
                model_name(doc).unwrap_or(""),
                meta.hardware.summary().as_deref().unwrap_or(""),
                run.started_at.as_deref().unwrap_or(""),
                run.ended_at.as_deref().unwrap_or(""),
                run.benchmark_tool.as_deref().unwrap_or(""),
            ]),
        };
        let description = match model_name(doc) {
            Some(model) => format!("{model} [{eid}]"),
            None => format!("[{eid}]"),
        };
        let (tool, tool_version) = split_tool(run.benchmark_tool.as_deref());
        let engine_label = format!(
            "{}-0",
            meta.engine
                .name
                .as_deref()
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .unwrap_or("engine")
        );
        RunContext {
            eid,
            description,
            time: run_time(doc),
            stack: vec![engine_component(doc, &engine_label)],
            engine_label,
            tool,
            tool_version,
            production: run.source == Some(Source::Production),
            metadata: to_value(meta),
        }
    }
}

/// `tokentap v0.1.0` → (`tokentap`, `v0.1.0`); a tool without a version keeps `unknown` as one.
fn split_tool(tool: Option<&str>) -> (String, String) {
    let tool = tool.map(str::trim).filter(|t| !t.is_empty());
    match tool {
        None => ("unknown".to_owned(), "unknown".to_owned()),
        Some(tool) => match tool.rsplit_once(char::is_whitespace) {
            Some((name, version))
                if version.chars().any(|c| c.is_ascii_digit()) && !name.trim().is_empty() =>
            {
                (name.trim().to_owned(), version.to_owned())
            }
            _ => (tool.to_owned(), "unknown".to_owned()),
        },
    }
}

fn model_name(doc: &MatrixDoc) -> Option<&str> {
    let model = &doc.metadata.model;
    model
        .served_model
        .as_deref()
        .or(model.model_path.as_deref())
        .or(model.display_name.as_deref())
        .map(str::trim)
        .filter(|m| !m.is_empty())
}

/// `run.time`: the run's start and end where they are RFC 3339, its ISO 8601 duration from
/// them (else a production window's length).
fn run_time(doc: &MatrixDoc) -> Option<Value> {
    let run = &doc.metadata.run;
    let start = run.started_at.as_deref().filter(|t| is_rfc3339(t));
    let end = run.ended_at.as_deref().filter(|t| is_rfc3339(t));
    let span = match (start.and_then(parse_rfc3339), end.and_then(parse_rfc3339)) {
        (Some(a), Some(b)) => b.duration_since(a).ok().map(|d| d.as_secs_f64()),
        _ => None,
    };
    let duration = span
        .or(run.window_s)
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(iso_duration);
    let mut time = Map::new();
    put(&mut time, "start", start.map(|s| json!(s)));
    put(&mut time, "end", end.map(|s| json!(s)));
    put(&mut time, "duration", duration.map(Value::String));
    (!time.is_empty()).then_some(Value::Object(time))
}

/// Seconds as an ISO 8601 duration: `PT90S`, `PT1.5S`.
fn iso_duration(seconds: f64) -> String {
    let millis = (seconds * 1000.0).round() / 1000.0;
    format!("PT{millis}S")
}

/// The inference engine in `scenario.stack`: the schema's `inference_engine` component where
/// the model, accelerator, its count and the tensor parallelism are known (from the launch
/// command, or one GPU), else a `generic` component with what is known (the schema's
/// `inference_engine` fills an absent parallelism with 1, which would be a claim).
fn engine_component(doc: &MatrixDoc, label: &str) -> Value {
    let meta = &doc.metadata;
    let engine = &meta.engine;
    let tool = text_or_unknown(engine.name.as_deref());
    let tool_version = text_or_unknown(engine.version.as_deref());
    let launch = meta.launch_command.as_deref().unwrap_or("");
    let gpu = meta
        .hardware
        .gpu
        .as_deref()
        .map(str::trim)
        .filter(|g| !g.is_empty());
    let count = meta.hardware.gpu_count;
    let tp = flag_value(
        launch,
        &["--tp", "--tp-size", "--tensor-parallel-size", "-tp"],
    )
    .or_else(|| (count == Some(1)).then_some(1));
    let cfg_id = hash_hex(&[
        "engine",
        &tool,
        &tool_version,
        model_name(doc).unwrap_or(""),
        gpu.unwrap_or(""),
        &count.map(|c| c.to_string()).unwrap_or_default(),
        launch,
    ]);
    let standardized = match (model_name(doc), gpu, count, tp) {
        (Some(model), Some(gpu), Some(count), Some(tp)) => {
            let mut parallelism = Map::new();
            parallelism.insert("tp".to_owned(), json!(tp));
            for (key, flags) in [
                (
                    "dp",
                    &["--dp", "--dp-size", "--data-parallel-size", "-dp"][..],
                ),
                (
                    "pp",
                    &["--pp", "--pp-size", "--pipeline-parallel-size", "-pp"][..],
                ),
                ("ep", &["--ep", "--ep-size", "--expert-parallel-size"][..]),
            ] {
                put(
                    &mut parallelism,
                    key,
                    flag_value(launch, flags).map(|v| json!(v)),
                );
            }
            json!({
                "kind": "inference_engine",
                "tool": tool,
                "tool_version": tool_version,
                "role": "replica",
                "replicas": 1,
                "model": {"name": model},
                "accelerator": {"model": gpu, "count": count, "parallelism": parallelism},
            })
        }
        _ => {
            let mut generic = Map::new();
            generic.insert("kind".to_owned(), json!("generic"));
            generic.insert("tool".to_owned(), json!(tool));
            generic.insert("tool_version".to_owned(), json!(tool_version));
            put(&mut generic, "model", model_name(doc).map(|m| json!(m)));
            put(&mut generic, "accelerator_model", gpu.map(|g| json!(g)));
            put(&mut generic, "accelerator_count", count.map(|c| json!(c)));
            put(&mut generic, "tp", tp.map(|t| json!(t)));
            Value::Object(generic)
        }
    };
    let mut metadata = Map::new();
    metadata.insert("schema_version".to_owned(), json!(PART_SCHEMA_VERSION));
    metadata.insert("label".to_owned(), json!(label));
    metadata.insert("cfg_id".to_owned(), json!(cfg_id));
    put(
        &mut metadata,
        "description",
        meta.hardware.summary().map(Value::String),
    );
    let mut args = Map::new();
    put(
        &mut args,
        "launch_command",
        meta.launch_command.as_ref().map(|c| json!(c)),
    );
    put(
        &mut args,
        "quantization",
        engine.quantization.as_ref().map(|q| json!(q)),
    );
    let mut native = Map::new();
    if !args.is_empty() {
        native.insert("args".to_owned(), Value::Object(args));
    }
    json!({"metadata": metadata, "standardized": standardized, "native": native})
}

fn text_or_unknown(text: Option<&str>) -> String {
    text.map(str::trim)
        .filter(|t| !t.is_empty())
        .unwrap_or("unknown")
        .to_owned()
}

/// The positive integer after the first of `flags` in a launch command (`--tp 4`, `--tp=4`).
fn flag_value(command: &str, flags: &[&str]) -> Option<u64> {
    let mut words = command.split_whitespace();
    while let Some(word) = words.next() {
        for flag in flags {
            let value = if word == *flag {
                words.clone().next()
            } else {
                word.strip_prefix(flag)
                    .and_then(|rest| rest.strip_prefix('='))
            };
            if let Some(value) = value {
                if let Ok(n) = value.trim_matches(['"', '\'']).parse::<u64>() {
                    if n >= 1 {
                        return Some(n);
                    }
                }
            }
        }
    }
    None
}

/// One decode cell's report.
fn decode_report(doc: &MatrixDoc, run: &RunContext, cell: &DecodeCell, stage: u64) -> Value {
    let tails = cell.tails.unwrap_or_default();
    let mut mean_is_median = Vec::new();
    let mut latency = Map::new();
    let ttft = stat(
        "ms",
        cell.ttft_ms,
        &[
            ("p50", cell.ttft_ms),
            ("p90", tails.ttft_p90_ms),
            ("p99", tails.ttft_p99_ms),
        ],
    );
    if ttft.is_some() {
        mean_is_median.push("time_to_first_token");
    }
    put(&mut latency, "time_to_first_token", ttft);
    let tpot = stat(
        "ms/token",
        cell.tbt_ms,
        &[
            ("p50", cell.tbt_ms),
            ("p90", tails.tbt_p90_ms),
            ("p99", tails.tbt_p99_ms),
        ],
    );
    if tpot.is_some() {
        mean_is_median.push("time_per_output_token");
    }
    put(&mut latency, "time_per_output_token", tpot);

    let mut throughput = Map::new();
    put(
        &mut throughput,
        "output_token_rate",
        stat("tokens/s", cell.total_tok_s, &[]),
    );
    let request_rate = match (cell.completed_requests, cell.measured_for_s) {
        (Some(done), Some(seconds)) if seconds > 0.0 => Some(done as f64 / seconds),
        _ => None,
    };
    put(
        &mut throughput,
        "request_rate",
        stat("queries/s", request_rate, &[]),
    );

    let requests = requests(cell.completed_requests, cell.prompt_tokens);
    let performance = performance(requests, latency, throughput);

    let server = cell.server_state.map(|state| {
        let mut aggregate = Map::new();
        put(
            &mut aggregate,
            "running_requests",
            stat("count", state.running_requests, &[]),
        );
        put(
            &mut aggregate,
            "waiting_requests",
            stat("count", state.queued_requests, &[]),
        );
        put(
            &mut aggregate,
            "kv_cache_usage",
            stat("fraction", state.kv_cache_usage, &[]),
        );
        put(
            &mut aggregate,
            "cache_hit_rate",
            stat("fraction", state.prefix_cache_hit_rate, &[]),
        );
        aggregate
    });

    let concurrency = (cell.concurrency >= 1).then_some(cell.concurrency);
    let mut args = Map::new();
    args.insert("context_tokens".to_owned(), json!(cell.context_tokens));
    args.insert("concurrency".to_owned(), json!(cell.concurrency));
    let description = format!(
        "{}decode: {}-token prompts, concurrency {}",
        if run.production { "production " } else { "" },
        cell.context_tokens,
        cell.concurrency
    );
    let point = Point {
        measurement: "decode",
        context_tokens: cell.context_tokens,
        concurrency,
        description,
        args,
        stage,
        status: cell.status.to_string(),
        cell: to_value(cell),
        mean_is_median,
    };
    report(doc, run, &point, performance, server)
}

/// One prefill row's report (a cold prompt read at `requests_at_once`).
fn prefill_report(doc: &MatrixDoc, run: &RunContext, row: &PrefillRow, stage: u64) -> Value {
    let mut mean_is_median = Vec::new();
    let mut latency = Map::new();
    let ttft = stat("ms", row.ttft_ms, &[("p50", row.ttft_ms)]);
    // One request's TTFT is its own mean; several requests' figure is their median.
    if ttft.is_some() && row.completed_requests != Some(1) {
        mean_is_median.push("time_to_first_token");
    }
    put(&mut latency, "time_to_first_token", ttft);
    let mut throughput = Map::new();
    put(
        &mut throughput,
        "input_token_rate",
        stat("tokens/s", row.prompt_tok_s, &[]),
    );
    let requests = requests(row.completed_requests, row.prompt_tokens);
    let performance = performance(requests, latency, throughput);
    let concurrency = (row.requests_at_once >= 1).then_some(row.requests_at_once);
    let mut args = Map::new();
    args.insert("context_tokens".to_owned(), json!(row.context_tokens));
    args.insert("requests_at_once".to_owned(), json!(row.requests_at_once));
    let description = format!(
        "{}prefill: a cold {}-token prompt, {} at once",
        if run.production { "production " } else { "" },
        row.context_tokens,
        row.requests_at_once
    );
    let point = Point {
        measurement: "prefill",
        context_tokens: row.context_tokens,
        concurrency,
        description,
        args,
        stage,
        status: row.status.to_string(),
        cell: to_value(row),
        mean_is_median,
    };
    report(doc, run, &point, performance, None)
}

/// `aggregate.requests`: needs its total, so only where the requests were counted.
fn requests(completed: Option<u64>, prompt_tokens: Option<u64>) -> Option<Value> {
    let total = completed?;
    let mut requests = Map::new();
    requests.insert("total".to_owned(), json!(total));
    put(
        &mut requests,
        "input_length",
        stat("count", prompt_tokens.map(|t| t as f64), &[]),
    );
    Some(Value::Object(requests))
}

fn performance(
    requests: Option<Value>,
    latency: Map<String, Value>,
    throughput: Map<String, Value>,
) -> Option<Value> {
    let mut aggregate = Map::new();
    put(&mut aggregate, "requests", requests);
    if !latency.is_empty() {
        aggregate.insert("latency".to_owned(), Value::Object(latency));
    }
    if !throughput.is_empty() {
        aggregate.insert("throughput".to_owned(), Value::Object(throughput));
    }
    (!aggregate.is_empty()).then(|| json!({"aggregate": aggregate}))
}

/// What differs between the reports of one matrix.
struct Point {
    measurement: &'static str,
    context_tokens: u64,
    concurrency: Option<u32>,
    description: String,
    args: Map<String, Value>,
    stage: u64,
    status: String,
    cell: Value,
    mean_is_median: Vec<&'static str>,
}

fn report(
    doc: &MatrixDoc,
    run: &RunContext,
    point: &Point,
    performance: Option<Value>,
    server: Option<Map<String, Value>>,
) -> Value {
    let info = &doc.metadata.run;
    let uid = hash_hex(&[
        "uid",
        &run.eid,
        point.measurement,
        &point.context_tokens.to_string(),
        &point.concurrency.unwrap_or(0).to_string(),
        &point.stage.to_string(),
    ]);
    let mut run_value = Map::new();
    run_value.insert("uid".to_owned(), json!(uid));
    run_value.insert("eid".to_owned(), json!(run.eid));
    put(&mut run_value, "time", run.time.clone());
    run_value.insert("description".to_owned(), json!(run.description));

    // The workload: a sweep's prompts are the cell's context exactly; production's are the
    // requests whose prompts fell in the cell's context bucket.
    let input_seq_len = if run.production {
        json!({"distribution": "other", "value": point.context_tokens})
    } else {
        json!({"distribution": "fixed", "value": point.context_tokens})
    };
    let mut standardized = Map::new();
    standardized.insert("tool".to_owned(), json!(run.tool));
    standardized.insert("tool_version".to_owned(), json!(run.tool_version));
    standardized.insert("source".to_owned(), json!("unknown"));
    standardized.insert("stage".to_owned(), json!(point.stage));
    standardized.insert("input_seq_len".to_owned(), input_seq_len);
    let seed_method = !run.production && info.shape.as_deref() != Some(LIKE_PRODUCTION);
    if seed_method && point.measurement == "decode" {
        put(
            &mut standardized,
            "output_seq_len",
            info.max_output_tokens
                .filter(|n| *n >= 1)
                .map(|n| json!({"distribution": "fixed", "value": n})),
        );
    }
    put(
        &mut standardized,
        "concurrency",
        point.concurrency.map(|c| json!(c)),
    );
    let mut args = point.args.clone();
    put(
        &mut args,
        "max_output_tokens",
        info.max_output_tokens.map(|n| json!(n)),
    );
    put(
        &mut args,
        "time_per_measurement_s",
        finite(info.time_per_measurement_s).map(|s| json!(s)),
    );
    put(
        &mut args,
        "window_s",
        finite(info.window_s).map(|s| json!(s)),
    );
    put(&mut args, "shape", info.shape.as_ref().map(|s| json!(s)));
    let cfg_id = hash_hex(&[
        "load",
        point.measurement,
        &Value::Object(args.clone()).to_string(),
    ]);
    let load = json!({
        "metadata": {
            "schema_version": PART_SCHEMA_VERSION,
            "cfg_id": cfg_id,
            "description": point.description,
        },
        "standardized": standardized,
        "native": {"args": args},
    });

    let extension = json!({
        "schema": doc.schema,
        "measurement": point.measurement,
        "source": info.source.map(Source::as_str),
        "status": point.status,
        "mean_is_median": point.mean_is_median,
        "cell": point.cell,
        "metadata": run.metadata,
    });
    let mut observability = Map::new();
    if let Some(aggregate) = server.filter(|a| !a.is_empty()) {
        observability.insert(
            "components".to_owned(),
            json!([{"component_label": run.engine_label, "aggregate": aggregate}]),
        );
    }
    observability.insert(EXTENSION_KEY.to_owned(), extension);
    let mut results = Map::new();
    put(&mut results, "request_performance", performance);
    results.insert("observability".to_owned(), Value::Object(observability));

    json!({
        "version": SCHEMA_VERSION,
        "run": run_value,
        "scenario": {"stack": run.stack, "load": load},
        "results": results,
    })
}

/// A statistic (`units`, `mean`, the given percentiles); `None` without a finite mean, the
/// one figure the schema requires.
fn stat(units: &str, mean: Option<f64>, others: &[(&str, Option<f64>)]) -> Option<Value> {
    let mean = finite(mean)?;
    let mut stat = Map::new();
    stat.insert("units".to_owned(), json!(units));
    stat.insert("mean".to_owned(), json!(mean));
    for (key, value) in others {
        put(&mut stat, key, finite(*value).map(|v| json!(v)));
    }
    Some(Value::Object(stat))
}

fn finite(value: Option<f64>) -> Option<f64> {
    value.filter(|v| v.is_finite())
}

fn put(map: &mut Map<String, Value>, key: &str, value: Option<Value>) {
    if let Some(value) = value {
        map.insert(key.to_owned(), value);
    }
}

/// A serde value of a document part; `null` in the impossible case it does not serialize.
/// Non-finite numbers become `null` (serde_json's rule), which the extension may hold.
fn to_value<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// A stable 32-hex-digit identifier of `parts` (two FNV-1a 64 hashes), for the report's ids:
/// the same matrix always gives the same ids.
fn hash_hex(parts: &[&str]) -> String {
    let mut a: u64 = 0xcbf2_9ce4_8422_2325;
    let mut b: u64 = 0x6c62_272e_07bb_0142;
    for part in parts {
        for byte in part.bytes().chain([0x1f]) {
            a = (a ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
            b = (b ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
            b = b.rotate_left(5);
        }
    }
    format!("{a:016x}{b:016x}")
}

#[cfg(test)]
mod tests;
