//! The llm-d reports against the vendored JSON Schema, through a small validator of the keywords
//! that schema uses. The validator refuses any keyword it does not implement (and a first test
//! walks the whole schema for one), so no report passes because a rule was skipped.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{json, Value};

use super::*;
use crate::doc::{
    CellStatus, DecodeCell, Engine, Hardware, Metadata, ModelInfo, PrefillRow, RunInfo,
    ServerState, Tails,
};

/// Keywords that only annotate: they never reject an instance. `discriminator` is OpenAPI's
/// hint for the `oneOf` beside it, which does the checking.
const ANNOTATIONS: [&str; 5] = ["title", "description", "default", "discriminator", "$defs"];

/// Keywords the validator checks. `ge` is not JSON Schema: Pydantic leaves it in where a
/// constraint sits on a union; it means `minimum`, and is checked as such.
const CHECKED: [&str; 14] = [
    "$ref",
    "type",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "minimum",
    "exclusiveMinimum",
    "ge",
    "format",
];

fn schema() -> Value {
    serde_json::from_str(SCHEMA_JSON).unwrap()
}

/// Every violation of `instance` against the whole schema, one line each (`path: what`).
fn validate(instance: &Value) -> Vec<String> {
    let root = schema();
    let mut errors = Vec::new();
    check(&root, &root, instance, "$", &mut errors);
    errors
}

fn check(root: &Value, schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    let object = match schema {
        Value::Bool(true) => return,
        Value::Bool(false) => {
            errors.push(format!("{path}: the schema allows nothing here"));
            return;
        }
        Value::Object(object) => object,
        other => {
            errors.push(format!(
                "{path}: a schema must be an object or bool, not {other}"
            ));
            return;
        }
    };
    for key in object.keys() {
        if !ANNOTATIONS.contains(&key.as_str()) && !CHECKED.contains(&key.as_str()) {
            errors.push(format!(
                "{path}: schema keyword `{key}` is not implemented by this validator"
            ));
        }
    }
    if let Some(reference) = object.get("$ref") {
        match resolve(root, reference) {
            Some(target) => check(root, target, value, path, errors),
            None => errors.push(format!("{path}: unresolvable $ref {reference}")),
        }
    }
    if let Some(types) = object.get("type") {
        let names: Vec<&str> = match types {
            Value::String(name) => vec![name.as_str()],
            Value::Array(names) => names.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if !names.iter().any(|name| has_type(value, name)) {
            errors.push(format!("{path}: {value} is not of type {types}"));
        }
    }
    if let Some(allowed) = object.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            errors.push(format!("{path}: {value} is not one of {allowed:?}"));
        }
    }
    if let Some(constant) = object.get("const") {
        if constant != value {
            errors.push(format!("{path}: {value} is not {constant}"));
        }
    }
    for key in ["minimum", "ge"] {
        if let (Some(bound), Some(n)) = (object.get(key).and_then(Value::as_f64), value.as_f64()) {
            if n < bound {
                errors.push(format!("{path}: {n} is below the {key} {bound}"));
            }
        }
    }
    if let (Some(bound), Some(n)) = (
        object.get("exclusiveMinimum").and_then(Value::as_f64),
        value.as_f64(),
    ) {
        if n <= bound {
            errors.push(format!("{path}: {n} is not above {bound}"));
        }
    }
    if let Some(format) = object.get("format").and_then(Value::as_str) {
        match (format, value.as_str()) {
            ("date-time", Some(text)) if !is_rfc3339(text) => {
                errors.push(format!("{path}: {text:?} is not an RFC 3339 date-time"));
            }
            ("date-time", _) => {}
            (other, _) => errors.push(format!("{path}: format {other:?} is not implemented")),
        }
    }
    for (keyword, exactly_one) in [("anyOf", false), ("oneOf", true)] {
        let Some(branches) = object.get(keyword).and_then(Value::as_array) else {
            continue;
        };
        let outcomes: Vec<Vec<String>> = branches
            .iter()
            .map(|branch| {
                let mut branch_errors = Vec::new();
                check(root, branch, value, path, &mut branch_errors);
                branch_errors
            })
            .collect();
        let passing = outcomes.iter().filter(|e| e.is_empty()).count();
        let ok = if exactly_one {
            passing == 1
        } else {
            passing >= 1
        };
        if ok {
            continue;
        }
        errors.push(format!(
            "{path}: matches {passing} branches of {keyword}{}",
            if exactly_one { ", not exactly one" } else { "" }
        ));
        // Why each branch failed, but for a branch of another type altogether (`null`).
        let own_type = format!("{path}: {value} is not of type");
        for branch_errors in outcomes {
            if !branch_errors.iter().any(|e| e.starts_with(&own_type)) {
                errors.extend(branch_errors);
            }
        }
    }
    if let Value::Object(fields) = value {
        if let Some(required) = object.get("required").and_then(Value::as_array) {
            for name in required.iter().filter_map(Value::as_str) {
                if !fields.contains_key(name) {
                    errors.push(format!("{path}: required field `{name}` is missing"));
                }
            }
        }
        let properties = object.get("properties").and_then(Value::as_object);
        for (name, field) in fields {
            let field_path = format!("{path}.{name}");
            match properties.and_then(|p| p.get(name)) {
                Some(field_schema) => check(root, field_schema, field, &field_path, errors),
                None => match object.get("additionalProperties") {
                    None | Some(Value::Bool(true)) => {}
                    Some(Value::Bool(false)) => {
                        errors.push(format!("{field_path}: field not allowed here"));
                    }
                    Some(extra) => check(root, extra, field, &field_path, errors),
                },
            }
        }
    }
    if let (Some(items), Value::Array(elements)) = (object.get("items"), value) {
        for (i, element) in elements.iter().enumerate() {
            check(root, items, element, &format!("{path}[{i}]"), errors);
        }
    }
}

fn resolve<'a>(root: &'a Value, reference: &Value) -> Option<&'a Value> {
    let name = reference.as_str()?.strip_prefix("#/$defs/")?;
    root.get("$defs")?.get(name)
}

fn has_type(value: &Value, name: &str) -> bool {
    match name {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "number" => value.is_number(),
        "integer" => {
            value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|n| n.fract() == 0.0)
        }
        _ => false,
    }
}

/// The units rules of the schema's Pydantic models (`check_units`), which its JSON Schema does
/// not carry: each statistic this renderer writes, with the units its model allows.
fn unit_errors(report: &Value) -> Vec<String> {
    const RULES: [(&str, &[&str]); 12] = [
        ("/latency/time_to_first_token", &["ms", "s"]),
        ("/latency/request_latency", &["ms", "s"]),
        ("/latency/time_per_output_token", &["ms/token", "s/token"]),
        ("/latency/inter_token_latency", &["ms/token", "s/token"]),
        (
            "/latency/normalized_time_per_output_token",
            &["ms/token", "s/token"],
        ),
        ("/requests/input_length", &["count", "pixels"]),
        ("/requests/output_length", &["count", "pixels"]),
        ("/throughput/input_token_rate", &["tokens/s"]),
        ("/throughput/output_token_rate", &["tokens/s"]),
        ("/throughput/total_token_rate", &["tokens/s"]),
        ("/throughput/request_rate", &["queries/s"]),
        ("/kv_cache_usage", &["percent", "fraction"]),
    ];
    let mut errors = Vec::new();
    let aggregate = report.pointer("/results/request_performance/aggregate");
    for (path, allowed) in RULES {
        let found = if path == "/kv_cache_usage" {
            report.pointer("/results/observability/components/0/aggregate/kv_cache_usage")
        } else {
            aggregate.and_then(|a| a.pointer(path))
        };
        if let Some(units) = found.and_then(|s| s.get("units")).and_then(Value::as_str) {
            if !allowed.contains(&units) {
                errors.push(format!(
                    "{path}: units {units:?}, the model allows {allowed:?}"
                ));
            }
        }
    }
    let server = report.pointer("/results/observability/components/0/aggregate");
    for (key, allowed) in [
        ("cache_hit_rate", &["percent", "fraction"][..]),
        ("running_requests", &["count", "pixels"][..]),
        ("waiting_requests", &["count", "pixels"][..]),
    ] {
        if let Some(units) = server
            .and_then(|s| s.get(key))
            .and_then(|s| s.get("units"))
            .and_then(Value::as_str)
        {
            if !allowed.contains(&units) {
                errors.push(format!(
                    "{key}: units {units:?}, the model allows {allowed:?}"
                ));
            }
        }
    }
    errors
}

/// Asserts every report of `doc` conforms (schema and units), and returns them.
fn conforming_reports(doc: &MatrixDoc) -> Vec<Value> {
    let rendered: Value = serde_json::from_str(&render_llmd(doc)).unwrap();
    let reports = rendered.as_array().unwrap().clone();
    assert_eq!(reports, super::reports(doc));
    for (i, report) in reports.iter().enumerate() {
        let errors = validate(report);
        assert!(
            errors.is_empty(),
            "report {i} breaks the schema: {errors:#?}\n{report:#}"
        );
        let errors = unit_errors(report);
        assert!(
            errors.is_empty(),
            "report {i} breaks the units: {errors:#?}"
        );
    }
    let uids: BTreeSet<&str> = reports
        .iter()
        .map(|r| r["run"]["uid"].as_str().unwrap())
        .collect();
    assert_eq!(uids.len(), reports.len(), "uids are unique");
    reports
}

fn seed(name: &str) -> MatrixDoc {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/seeds")
        .join(name);
    crate::file::load(&path).unwrap()
}

#[test]
fn the_validator_implements_every_keyword_the_vendored_schema_uses() {
    fn walk(schema: &Value, path: &str, unknown: &mut Vec<String>) {
        let Some(object) = schema.as_object() else {
            return;
        };
        for (key, value) in object {
            let here = format!("{path}/{key}");
            if !ANNOTATIONS.contains(&key.as_str()) && !CHECKED.contains(&key.as_str()) {
                unknown.push(here.clone());
            }
            match key.as_str() {
                "properties" | "$defs" => {
                    for (name, sub) in value.as_object().unwrap() {
                        walk(sub, &format!("{here}/{name}"), unknown);
                    }
                }
                "anyOf" | "oneOf" => {
                    for (i, sub) in value.as_array().unwrap().iter().enumerate() {
                        walk(sub, &format!("{here}/{i}"), unknown);
                    }
                }
                "items" | "additionalProperties" => walk(value, &here, unknown),
                _ => {}
            }
        }
    }
    let root = schema();
    assert_eq!(root["title"], "Benchmark Report v0.2.1");
    assert_eq!(root["properties"]["version"]["default"], SCHEMA_VERSION);
    let mut unknown = Vec::new();
    walk(&root, "#", &mut unknown);
    assert!(
        unknown.is_empty(),
        "keywords the validator lacks: {unknown:#?}"
    );
    // And it says so when it meets one.
    let mut errors = Vec::new();
    check(
        &root,
        &json!({"patternProperties": {"x": {}}}),
        &json!({}),
        "$",
        &mut errors,
    );
    assert!(
        errors[0].contains("`patternProperties` is not implemented"),
        "{errors:?}"
    );
}

#[test]
fn a_broken_report_is_rejected() {
    let doc = seed("003_5c468af628b56f4a.txt");
    let good = super::reports(&doc).remove(0);
    assert!(validate(&good).is_empty());

    let mut no_uid = good.clone();
    no_uid["run"].as_object_mut().unwrap().remove("uid");
    assert_eq!(
        validate(&no_uid),
        ["$.run: required field `uid` is missing"]
    );

    let mut no_results = good.clone();
    no_results.as_object_mut().unwrap().remove("results");
    assert_eq!(
        validate(&no_results),
        ["$: required field `results` is missing"]
    );

    let mut stray = good.clone();
    stray["tokentap"] = json!({});
    assert_eq!(validate(&stray), ["$.tokentap: field not allowed here"]);

    let mut bad_units = good.clone();
    bad_units["results"]["request_performance"]["aggregate"]["latency"]["time_to_first_token"]
        ["units"] = json!("seconds");
    assert!(!validate(&bad_units).is_empty());
    let mut wrong_units = good.clone();
    wrong_units["results"]["request_performance"]["aggregate"]["latency"]["time_to_first_token"]
        ["units"] = json!("tokens/s");
    assert!(
        validate(&wrong_units).is_empty(),
        "the JSON Schema has no unit categories"
    );
    assert_eq!(unit_errors(&wrong_units).len(), 1);

    let mut bad_kind = good;
    bad_kind["scenario"]["stack"][0]["standardized"]["kind"] = json!("router");
    assert!(validate(&bad_kind)
        .iter()
        .any(|e| e.contains("branches of oneOf")));
}

#[test]
fn seed_pages_render_one_conforming_report_per_measured_point() {
    for name in ["000_7bda87e292bd4f4e.txt", "003_5c468af628b56f4a.txt"] {
        let doc = seed(name);
        let reports = conforming_reports(&doc);
        let measured = doc.prefill.len() + doc.decode.iter().filter(|c| c.has_figures()).count();
        assert_eq!(reports.len(), measured, "{name}");
        assert!(reports.len() > 20, "{name}: {}", reports.len());
        let eid = &reports[0]["run"]["eid"];
        for (stage, report) in reports.iter().enumerate() {
            assert_eq!(report["version"], "0.2.1");
            assert_eq!(&report["run"]["eid"], eid, "one experiment per matrix");
            assert_eq!(report["scenario"]["load"]["standardized"]["stage"], stage);
        }
        let cell = doc
            .decode
            .iter()
            .find(|c| c.status.is_valid() && c.ttft_ms.is_some() && c.tbt_ms.is_some())
            .unwrap();
        let report = reports
            .iter()
            .find(|r| {
                r["results"]["observability"]["tokentap"]["measurement"] == "decode"
                    && r["scenario"]["load"]["standardized"]["concurrency"] == cell.concurrency
                    && r["scenario"]["load"]["standardized"]["input_seq_len"]["value"]
                        == cell.context_tokens
            })
            .unwrap();
        let aggregate = &report["results"]["request_performance"]["aggregate"];
        assert_eq!(
            aggregate["latency"]["time_to_first_token"]["p50"],
            json!(cell.ttft_ms)
        );
        assert_eq!(aggregate["latency"]["time_to_first_token"]["units"], "ms");
        assert_eq!(
            aggregate["latency"]["time_per_output_token"]["p50"],
            json!(cell.tbt_ms)
        );
        assert_eq!(
            aggregate["throughput"]["output_token_rate"]["mean"],
            json!(cell.total_tok_s)
        );
        let extension = &report["results"]["observability"]["tokentap"];
        assert_eq!(extension["status"], "Valid");
        assert_eq!(extension["schema"], "tokentap.matrix/v1");
        assert_eq!(
            extension["mean_is_median"],
            json!(["time_to_first_token", "time_per_output_token"])
        );
        assert_eq!(
            serde_json::from_value::<DecodeCell>(extension["cell"].clone()).unwrap(),
            *cell,
            "the cell travels whole"
        );
    }
}

/// A production window's matrix: buckets, server state, tails, a caveated cell and cells
/// without figures.
fn production_doc() -> MatrixDoc {
    let mut doc = MatrixDoc::new(Metadata {
        model: ModelInfo {
            served_model: Some("Qwen/Qwen3-32B".to_owned()),
            ..ModelInfo::default()
        },
        hardware: Hardware {
            gpu: Some("NVIDIA H200".to_owned()),
            gpu_count: Some(2),
            ..Hardware::default()
        },
        engine: Engine {
            name: Some("vllm".to_owned()),
            version: Some("0.11.0".to_owned()),
            ..Engine::default()
        },
        run: RunInfo {
            source: Some(Source::Production),
            benchmark_tool: Some("tokentap v0.1.0".to_owned()),
            window_s: Some(3600.0),
            started_at: Some("2026-12-03T10:00:00Z".to_owned()),
            ended_at: Some("2026-12-03T11:00:00Z".to_owned()),
            ..RunInfo::default()
        },
        launch_command: Some("vllm serve Qwen/Qwen3-32B --tensor-parallel-size=2".to_owned()),
        ..Metadata::default()
    });
    let mut cell = DecodeCell::status_only(8192, 4, CellStatus::Valid);
    cell.total_tok_s = Some(180.5);
    cell.per_request_tok_s = Some(45.1);
    cell.ttft_ms = Some(420.0);
    cell.tbt_ms = Some(22.2);
    cell.average_active_requests = Some(4.0);
    cell.completed_requests = Some(310);
    cell.output_tokens = Some(61_000);
    cell.measured_for_s = Some(338.0);
    cell.prompt_tokens = Some(7900);
    cell.tails = Some(Tails {
        ttft_p90_ms: Some(900.0),
        ttft_p99_ms: Some(1500.0),
        itl_p99_ms: Some(80.0),
        ..Tails::default()
    });
    cell.server_state = Some(ServerState {
        running_requests: Some(5.5),
        queued_requests: Some(0.25),
        kv_cache_usage: Some(0.61),
        prefix_cache_hit_rate: Some(0.4),
    });
    let mut thin = DecodeCell::status_only(32768, 1, CellStatus::LowEvidence);
    thin.total_tok_s = Some(30.0);
    thin.measured_for_s = Some(2.0);
    doc.decode = vec![
        cell,
        thin,
        DecodeCell::status_only(65536, 8, CellStatus::NotRun),
        DecodeCell::status_only(131072, 8, CellStatus::OverCapacity),
    ];
    doc.prefill = vec![PrefillRow {
        context_tokens: 8192,
        requests_at_once: 1,
        status: CellStatus::Valid,
        prompt_tok_s: Some(9000.0),
        ttft_ms: Some(910.0),
        completed_requests: Some(1),
        prompt_tokens: Some(8190),
    }];
    doc.sort();
    doc
}

#[test]
fn a_production_matrix_renders_conforming_reports_with_its_extension() {
    let doc = production_doc();
    doc.validate().unwrap();
    let reports = conforming_reports(&doc);
    assert_eq!(reports.len(), 3, "Not run and Over capacity get no report");

    let prefill = &reports[0];
    let extension = &prefill["results"]["observability"]["tokentap"];
    assert_eq!(extension["measurement"], "prefill");
    assert_eq!(
        extension["mean_is_median"],
        json!([]),
        "one request is its own mean"
    );
    assert_eq!(
        prefill["results"]["request_performance"]["aggregate"]["throughput"]["input_token_rate"]
            ["mean"],
        9000.0
    );

    let decode = &reports[1];
    assert_eq!(decode["run"]["time"]["duration"], "PT3600S");
    assert_eq!(
        decode["run"]["description"],
        reports[2]["run"]["description"]
    );
    let load = &decode["scenario"]["load"]["standardized"];
    assert_eq!(load["tool"], "tokentap");
    assert_eq!(load["tool_version"], "v0.1.0");
    assert_eq!(load["concurrency"], 4);
    assert_eq!(
        load["input_seq_len"],
        json!({"distribution": "other", "value": 8192})
    );
    assert!(
        load.get("output_seq_len").is_none(),
        "production's outputs are not enforced"
    );
    let engine = &decode["scenario"]["stack"][0]["standardized"];
    assert_eq!(engine["kind"], "inference_engine");
    assert_eq!(engine["accelerator"]["parallelism"], json!({"tp": 2}));
    let aggregate = &decode["results"]["request_performance"]["aggregate"];
    assert_eq!(aggregate["requests"]["total"], 310);
    assert_eq!(aggregate["requests"]["input_length"]["mean"], 7900.0);
    assert_eq!(aggregate["latency"]["time_to_first_token"]["p99"], 1500.0);
    assert!(aggregate["latency"].get("inter_token_latency").is_none());
    let rate = aggregate["throughput"]["request_rate"]["mean"]
        .as_f64()
        .unwrap();
    assert!((rate - 310.0 / 338.0).abs() < 1e-12);
    let server = &decode["results"]["observability"]["components"][0];
    assert_eq!(server["component_label"], "vllm-0");
    assert_eq!(
        server["aggregate"]["kv_cache_usage"],
        json!({"units": "fraction", "mean": 0.61})
    );
    assert_eq!(
        decode["results"]["observability"]["tokentap"]["cell"]["tails"]["itl_p99_ms"],
        80.0
    );

    let thin = &reports[2]["results"]["observability"]["tokentap"];
    assert_eq!(thin["status"], "Low evidence");
    assert_eq!(thin["source"], "production");
}

#[test]
fn odd_input_still_renders_conforming_reports() {
    // Nothing at all.
    let empty = MatrixDoc::new(Metadata::default());
    assert_eq!(render_llmd(&empty), "[]\n");

    // Non-finite figures, a zero concurrency, no model or tool, times that are not RFC 3339:
    // a document that fails `validate`, rendered anyway without a panic or a broken report.
    let mut doc = production_doc();
    doc.metadata.model = ModelInfo::default();
    doc.metadata.engine = Engine::default();
    doc.metadata.run.benchmark_tool = Some("  ".to_owned());
    doc.metadata.run.started_at = Some("yesterday".to_owned());
    doc.metadata.run.window_s = Some(f64::NAN);
    doc.metadata.launch_command = None;
    let cell = &mut doc.decode[0];
    cell.ttft_ms = Some(f64::NAN);
    cell.total_tok_s = Some(f64::INFINITY);
    cell.concurrency = 0;
    cell.measured_for_s = Some(0.0);
    let reports = conforming_reports(&doc);
    let engine = &reports[1]["scenario"]["stack"][0]["standardized"];
    assert_eq!(
        engine["kind"], "generic",
        "no model: not a described inference engine"
    );
    assert_eq!(
        reports[1]["run"]["time"],
        json!({"end": "2026-12-03T11:00:00Z"}),
        "no start to measure a duration from, no finite window"
    );
    assert!(reports[1]["scenario"]["load"]["standardized"]
        .get("concurrency")
        .is_none());
}

#[test]
fn tools_and_flags_are_read_as_written() {
    assert_eq!(
        split_tool(Some("llm-inference-bench v0.8.0")),
        ("llm-inference-bench".to_owned(), "v0.8.0".to_owned())
    );
    assert_eq!(
        split_tool(Some("tokentap")),
        ("tokentap".to_owned(), "unknown".to_owned())
    );
    assert_eq!(
        split_tool(None),
        ("unknown".to_owned(), "unknown".to_owned())
    );
    assert_eq!(flag_value("sglang --tp 4 --dp=2", &["--tp"]), Some(4));
    assert_eq!(flag_value("sglang --tp 4 --dp=2", &["--dp"]), Some(2));
    assert_eq!(
        flag_value("sglang --tp-size 8", &["--tp", "--tp-size"]),
        Some(8)
    );
    assert_eq!(flag_value("sglang --tp", &["--tp"]), None);
    assert_eq!(flag_value("sglang --tp 0", &["--tp"]), None);
    assert_eq!(iso_duration(90.0), "PT90S");
    assert_eq!(iso_duration(1.5), "PT1.5S");
    assert_eq!(hash_hex(&["a", "b"]), hash_hex(&["a", "b"]));
    assert_ne!(hash_hex(&["ab"]), hash_hex(&["a", "b"]));
}
