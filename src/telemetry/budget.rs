//! Error-budget alerts for Prometheus (`tokentap rules`): the multiwindow, multi-burn-rate
//! rules of Google's SRE workbook ("Alerting on SLOs"), cut from the `[slo]` objectives, and
//! promtool unit tests for every alert they hold (docs/metrics.md, "Error budgets").
//!
//! Two SLIs per model, over production requests (sweeps abort their own streams on purpose):
//!
//! - **availability** = 1 − failed ÷ (every request but client aborts), failed being the
//!   outcomes of [`Outcome::FAILURES`], from `tokentap_requests_total{outcome}`;
//! - **SLO attainment** = requests that met their targets ÷ requests with targets, from
//!   `tokentap_slo_requests_total{slo}` (a failed request with targets misses them).
//!
//! Each spends an error budget of 1 − the model's objective. A recording rule per SLI and window
//! (5m, 30m, 1h, 6h) gives the burn rate, the error ratio ÷ the budget (1 spends the budget in
//! exactly the SLO's period); the alerts are the workbook's pairs: 14.4 over 1h and 5m (page),
//! 6 over 6h and 30m (ticket).
//!
//! A scope is one model with an `[slo.models."<model>"]` table, or every other model under
//! `[slo]`'s own targets and objective; a scope without targets has no attainment rules. Pure:
//! configuration in, YAML text out, the same bytes for the same configuration.

use std::fmt::Write as _;

use crate::config::SloObjectives;
use crate::meter::record::Outcome;
use crate::meter::slo::SloPolicy;

use super::names::{REQUESTS_TOTAL, SLO_REQUESTS_TOTAL};

/// The recorded burn rate of every SLI, scope and window:
/// `model_sli:tokentap_error_budget_burn_rate:ratio_rate<window>{model, sli}`.
pub const BURN_RATE: &str = "model_sli:tokentap_error_budget_burn_rate";

/// The windows the burn rate is recorded over, in minutes.
pub const WINDOWS: [(&str, u32); 4] = [("5m", 5), ("30m", 30), ("1h", 60), ("6h", 360)];

/// What is measured against the objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sli {
    /// 1 − failed ÷ (every request but client aborts).
    Availability,
    /// Met ÷ (met + missed) of the requests with targets.
    Attainment,
}

impl Sli {
    /// The `sli` label of the recorded burn rates and the alerts.
    pub fn label(self) -> &'static str {
        match self {
            Sli::Availability => "availability",
            Sli::Attainment => "attainment",
        }
    }

    /// The alert of this SLI at `speed`.
    pub fn alert(self, speed: Speed) -> &'static str {
        match (self, speed) {
            (Sli::Availability, Speed::Fast) => "TokentapAvailabilityFastBurn",
            (Sli::Availability, Speed::Slow) => "TokentapAvailabilitySlowBurn",
            (Sli::Attainment, Speed::Fast) => "TokentapSloAttainmentFastBurn",
            (Sli::Attainment, Speed::Slow) => "TokentapSloAttainmentSlowBurn",
        }
    }
}

/// Which of the workbook's two alert pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speed {
    /// 14.4 × the budget over 1h and 5m: 2 % of a 30-day budget in an hour. Pages.
    Fast,
    /// 6 × the budget over 6h and 30m: 5 % of a 30-day budget in six hours. A ticket.
    Slow,
}

/// One alert pair's windows and threshold.
struct Pair {
    factor: f64,
    long: (&'static str, u32),
    short: (&'static str, u32),
    severity: &'static str,
    /// What the burn costs, for the description.
    cost: &'static str,
    /// What to do, first words of the advice.
    act: &'static str,
}

impl Speed {
    pub const ALL: [Speed; 2] = [Speed::Fast, Speed::Slow];

    fn pair(self) -> Pair {
        match self {
            Speed::Fast => Pair {
                factor: 14.4,
                long: ("1h", 60),
                short: ("5m", 5),
                severity: "page",
                cost: "2% of a 30-day error budget gone in an hour, all of it in about two days",
                act: "Act now",
            },
            Speed::Slow => Pair {
                factor: 6.0,
                long: ("6h", 360),
                short: ("30m", 30),
                severity: "ticket",
                cost: "5% of a 30-day error budget gone in six hours, all of it in five days",
                act: "Look into it today",
            },
        }
    }

    /// The burn rate of the case where the alert fires, and of the case just under its
    /// threshold (the other pair's territory), for the unit tests.
    fn test_burns(self) -> (f64, f64) {
        match self {
            Speed::Fast => (20.0, 10.0),
            Speed::Slow => (10.0, 3.0),
        }
    }
}

/// The models a scope covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Models {
    /// The model of an `[slo.models."<model>"]` table (the name the metrics carry).
    One(String),
    /// Every model but those (the ones with tables of their own).
    AllBut(Vec<String>),
}

/// The models one objective applies to, and what it is measured on.
#[derive(Debug, Clone, PartialEq)]
pub struct Scope {
    pub models: Models,
    /// The share of requests that must succeed and meet their targets; the budget is 1 − it.
    pub objective: f64,
    pub slis: Vec<Sli>,
}

impl Scope {
    /// The label matcher selecting the scope's models (empty: every model).
    fn matcher(&self) -> String {
        match &self.models {
            Models::One(model) => format!("model={}", promql_string(model)),
            Models::AllBut(models) if models.is_empty() => String::new(),
            Models::AllBut(models) => {
                let alternatives: Vec<String> = models.iter().map(|m| regex_escape(m)).collect();
                format!("model!~{}", promql_string(&alternatives.join("|")))
            }
        }
    }

    fn describe(&self) -> String {
        match &self.models {
            Models::One(model) => format!("model {}", yaml_quoted(model)),
            Models::AllBut(models) if models.is_empty() => "every model".to_string(),
            Models::AllBut(_) => "every other model".to_string(),
        }
    }

    /// The model the unit tests send for this scope: its own, else one no table names.
    fn test_model(&self) -> String {
        match &self.models {
            Models::One(model) => model.clone(),
            Models::AllBut(models) => {
                let mut name = "any-model".to_string();
                while models.contains(&name) {
                    name.push('_');
                }
                name
            }
        }
    }

    fn budget(&self) -> f64 {
        1.0 - self.objective
    }

    /// The static `model` label line of a one-model scope's rules (the value its series carry
    /// anyway): without it, the rules of two scopes would have one name and one label set,
    /// which promtool reports as duplicates.
    fn model_label(&self, indent: &str) -> String {
        match &self.models {
            Models::One(model) => format!("{indent}model: {}\n", yaml_quoted(model)),
            Models::AllBut(_) => String::new(),
        }
    }
}

/// The scopes of a configuration: one per `[slo.models."<model>"]` table (attainment where the
/// table sets targets), then every other model under `[slo]`'s own targets and objective.
pub fn scopes(policy: &SloPolicy, objectives: &SloObjectives) -> Vec<Scope> {
    let slis = |targets: bool| {
        if targets {
            vec![Sli::Availability, Sli::Attainment]
        } else {
            vec![Sli::Availability]
        }
    };
    let mut scopes: Vec<Scope> = policy
        .models
        .iter()
        .map(|(model, targets)| Scope {
            models: Models::One(model.clone()),
            objective: objectives.of(model),
            slis: slis(targets.is_set()),
        })
        .collect();
    scopes.push(Scope {
        models: Models::AllBut(policy.models.keys().cloned().collect()),
        objective: objectives.default,
        slis: slis(policy.default.is_set()),
    });
    scopes
}

/// The error ratio of `sli` over `window` for the scope's models, as PromQL.
fn error_ratio(sli: Sli, matcher: &str, window: &str) -> (String, String) {
    let with = |extra: &str| {
        let mut labels = vec!["source=\"production\"".to_string()];
        if !matcher.is_empty() {
            labels.push(matcher.to_string());
        }
        if !extra.is_empty() {
            labels.push(extra.to_string());
        }
        labels.join(",")
    };
    let (bad, all) = match sli {
        Sli::Availability => {
            let failures: Vec<&str> = Outcome::FAILURES.iter().map(|o| o.label()).collect();
            (
                format!(
                    "{REQUESTS_TOTAL}{{{}}}",
                    with(&format!("outcome=~\"{}\"", failures.join("|")))
                ),
                format!(
                    "{REQUESTS_TOTAL}{{{}}}",
                    with(&format!("outcome!=\"{}\"", Outcome::ClientAborted.label()))
                ),
            )
        }
        Sli::Attainment => (
            format!("{SLO_REQUESTS_TOTAL}{{{}}}", with("slo=\"missed\"")),
            format!("{SLO_REQUESTS_TOTAL}{{{}}}", with("")),
        ),
    };
    (
        format!("sum by (model) (rate({bad}[{window}]))"),
        format!("sum by (model) (rate({all}[{window}]))"),
    )
}

/// The rule groups (YAML) of `scopes`: the burn rates, then the alerts.
pub fn rules(scopes: &[Scope]) -> String {
    let mut out = String::new();
    out.push_str(RULES_HEADER);
    scopes_comment(&mut out, scopes);
    out.push_str("groups:\n  - name: tokentap-slo-burn-rates\n    rules:\n");
    for scope in scopes {
        let matcher = scope.matcher();
        let _ = writeln!(
            out,
            "      # {}: objective {}%, error budget {}% of requests.",
            scope.describe(),
            number(scope.objective * 100.0, 6),
            number(scope.budget() * 100.0, 6),
        );
        for sli in &scope.slis {
            for (window, _) in WINDOWS {
                let (bad, all) = error_ratio(*sli, &matcher, window);
                let _ = write!(
                    out,
                    "      - record: {BURN_RATE}:ratio_rate{window}\n        expr: |\n          (\n              {bad}\n            /\n              ({all} > 0)\n          )\n          / {}\n        labels:\n          sli: {}\n{}",
                    number(scope.budget(), 9),
                    sli.label(),
                    scope.model_label("          "),
                );
            }
        }
    }
    out.push_str("  - name: tokentap-slo-alerts\n    rules:\n");
    for scope in scopes {
        for sli in &scope.slis {
            for speed in Speed::ALL {
                alert(&mut out, scope, *sli, speed);
            }
        }
    }
    out
}

const RULES_HEADER: &str = "\
# tokentap: error-budget burn-rate alerts (docs/metrics.md, \"Error budgets\"), generated by
# `tokentap rules` from the [slo] section of a configuration. Regenerate rather than edit:
#   tokentap rules --config tokentap.toml --output tokentap-slo.rules.yml --tests tokentap-slo.rules.test.yml
#
# SLIs, per model, over production requests:
#   availability  1 - failed / (every request but client aborts), from tokentap_requests_total;
#                 failed = upstream_error, upstream_aborted, timeout, upstream_stalled
#   attainment    requests that met their [slo] targets / requests with targets, from
#                 tokentap_slo_requests_total (a failed request misses its targets)
# Each spends an error budget of 1 - objective. The recorded burn rate is the error ratio /
# the budget over 5m, 30m, 1h and 6h: at 1 the budget lasts exactly the SLO's period.
# Alerts, the SRE workbook's multiwindow pairs (both windows over the threshold):
#   fast  14.4 x the budget over 1h and over 5m   severity=page    (2% of a 30-day budget an hour)
#   slow  6 x the budget over 6h and over 30m     severity=ticket  (5% of a 30-day budget in 6h)
#
";

fn scopes_comment(out: &mut String, scopes: &[Scope]) {
    out.push_str("# Scopes:\n");
    for scope in scopes {
        let slis: Vec<&str> = scope.slis.iter().map(|s| s.label()).collect();
        let _ = writeln!(
            out,
            "#   {}: objective {}% ({})",
            scope.describe(),
            number(scope.objective * 100.0, 6),
            slis.join(", ")
        );
    }
}

/// The annotations of an alert, with `model` and `value` as given: the templates for the rule,
/// the rendered text for its unit test.
fn annotations(
    scope: &Scope,
    sli: Sli,
    speed: Speed,
    model: &str,
    value: &str,
) -> (String, String) {
    let pair = speed.pair();
    let factor = number(pair.factor, 3);
    let objective = number(scope.objective * 100.0, 6);
    let budget = number(scope.budget() * 100.0, 6);
    let (long, short) = (pair.long.0, pair.short.0);
    match sli {
        Sli::Availability => (
            format!("{model} fails requests at {value}x its error budget (availability, {long})"),
            format!(
                "Production requests for model {model} are failing (upstream errors, upstream aborts, timeouts and stalls; client aborts do not count) at {value} times the rate its availability objective of {objective}% allows (error budget {budget}%) over the last {long}, and at more than {factor} times over the last {short}: {}. {}: the proxy dashboard's Request outcomes panel, and tokentap_requests_total{{outcome!~\"ok|client_aborted\"}} summed by context_bucket and concurrency_bucket, show which cells fail; the upstream's own log says why.",
                pair.cost, pair.act
            ),
        ),
        Sli::Attainment => (
            format!(
                "{model} misses its SLO targets at {value}x its error budget (SLO attainment, {long})"
            ),
            format!(
                "Production requests for model {model} miss their [slo] targets (TTFT, TBT or end to end over target, or failed) at {value} times the rate its attainment objective of {objective}% allows (error budget {budget}%) over the last {long}, and at more than {factor} times over the last {short}: {}. {}: the matrix dashboard's SLO attainment grid (cell:tokentap_slo_attainment:ratio5m) shows which cells miss; tokentap_capacity_headroom_ratio below 0 means the load is past what the server serves within the targets.",
                pair.cost, pair.act
            ),
        ),
    }
}

const MODEL_TEMPLATE: &str = "{{ $labels.model }}";
const VALUE_TEMPLATE: &str = "{{ $value | printf \"%.1f\" }}";

fn alert(out: &mut String, scope: &Scope, sli: Sli, speed: Speed) {
    let pair = speed.pair();
    let mut selector = format!("sli=\"{}\"", sli.label());
    let matcher = scope.matcher();
    if !matcher.is_empty() {
        selector.push(',');
        selector.push_str(&matcher);
    }
    let factor = number(pair.factor, 3);
    let (summary, description) = annotations(scope, sli, speed, MODEL_TEMPLATE, VALUE_TEMPLATE);
    let _ = write!(
        out,
        "      - alert: {}\n        expr: |\n          {BURN_RATE}:ratio_rate{}{{{selector}}} > {factor}\n          and on (model, sli)\n          {BURN_RATE}:ratio_rate{}{{{selector}}} > {factor}\n        labels:\n          severity: {}\n{}        annotations:\n          summary: {}\n          description: {}\n",
        sli.alert(speed),
        pair.long.0,
        pair.short.0,
        pair.severity,
        scope.model_label("          "),
        yaml_quoted(&summary),
        yaml_quoted(&description),
    );
}

/// Requests a minute in the unit tests' series (every outcome but client aborts).
const TEST_REQUESTS_PER_MINUTE: f64 = 1000.0;

/// One unit-test case: errors at `burn` × the budget until minute `stop` (none after), read at
/// `eval` minutes.
struct Case {
    what: String,
    burn: f64,
    stop: Option<u32>,
    eval: u32,
    fires: bool,
}

/// promtool unit tests (YAML) of every alert of `rules(scopes)`, which they read from
/// `rule_file` (a path relative to the tests file, or absolute). Per scope, SLI and speed:
/// one case where the alert fires (a steady burn over the threshold), one just under it, and
/// one where the long window is still over it but the short one has recovered.
/// How often the unit tests evaluate the rules. Every case's times are whole multiples of it
/// (the windows are 5 m to 6 h); at 1 m promtool took 49 s over three scopes' 72 cases, at 5 m
/// a fifth of that, for the same verdicts.
const TEST_EVALUATION_MINUTES: u32 = 5;

pub fn unit_tests(scopes: &[Scope], rule_file: &str) -> String {
    let mut out = String::new();
    out.push_str(TESTS_HEADER);
    let _ = write!(
        out,
        "rule_files:\n  - {}\nevaluation_interval: {TEST_EVALUATION_MINUTES}m\ntests:\n",
        yaml_quoted(rule_file)
    );
    for scope in scopes {
        for sli in &scope.slis {
            for speed in Speed::ALL {
                let pair = speed.pair();
                let (fire, under) = speed.test_burns();
                let eval = pair.long.1 + pair.short.1;
                let factor = number(pair.factor, 3);
                let cases = [
                    Case {
                        what: format!("fires at a steady {} x the budget", number(fire, 3)),
                        burn: fire,
                        stop: None,
                        eval,
                        fires: true,
                    },
                    Case {
                        what: format!(
                            "quiet at a steady {} x the budget (under {factor})",
                            number(under, 3)
                        ),
                        burn: under,
                        stop: None,
                        eval,
                        fires: false,
                    },
                    Case {
                        what: format!(
                            "quiet once the last {} had no error, though the last {} is still over {factor}",
                            pair.short.0, pair.long.0
                        ),
                        burn: fire,
                        // The alerts read the burn rates recorded one evaluation earlier:
                        // the errors stop two evaluations before the short window opens.
                        stop: Some(eval - pair.short.1 - 2 * TEST_EVALUATION_MINUTES),
                        eval,
                        fires: false,
                    },
                ];
                for case in &cases {
                    unit_test(&mut out, scope, *sli, speed, case);
                }
            }
        }
    }
    out
}

const TESTS_HEADER: &str = "\
# tokentap: promtool unit tests of the error-budget alerts, generated by `tokentap rules --tests`
# with the rules they test. Run: promtool test rules <this file>. For each model scope, SLI and
# alert: a steady burn over the threshold fires; a steady burn under it and a burn that stopped
# within the short window stay quiet. Every case also carries client aborts (as many as the
# other requests) and a failing synthetic series, which neither SLI counts.
";

fn unit_test(out: &mut String, scope: &Scope, sli: Sli, speed: Speed, case: &Case) {
    let pair = speed.pair();
    let model = scope.test_model();
    let alertname = sli.alert(speed);
    let minutes = case.eval + 5;
    let per_minute = TEST_REQUESTS_PER_MINUTE;
    let errors = case.burn * scope.budget() * per_minute;
    let name = format!("{alertname}, {}: {}", scope.describe(), case.what);
    let _ = write!(
        out,
        "  - name: {}\n    interval: 1m\n    input_series:\n",
        yaml_quoted(&name)
    );
    // A counter rising by `rate` a minute, or by `rate` until `stop` and `after` from then.
    let values = |rate: f64, after: f64| match case.stop {
        None => format!("0+{}x{minutes}", number(rate, 6)),
        Some(stop) => format!(
            "0+{}x{stop} {}+{}x{}",
            number(rate, 6),
            number(rate * f64::from(stop), 6),
            number(after, 6),
            minutes - stop
        ),
    };
    let cell = format!(
        "model={},upstream=\"default\",route=\"chat_completions\",context_bucket=\"8K\",concurrency_bucket=\"4\"",
        promql_string(&model)
    );
    let mut series = |labels: String, values: String| {
        let _ = write!(
            out,
            "      - series: {}\n        values: {}\n",
            yaml_quoted(&labels),
            yaml_quoted(&values)
        );
    };
    match sli {
        Sli::Availability => {
            let failures = Outcome::FAILURES;
            let each = errors / failures.len() as f64;
            series(
                format!("{REQUESTS_TOTAL}{{source=\"production\",{cell},outcome=\"ok\"}}"),
                values(per_minute - errors, per_minute),
            );
            for outcome in failures {
                series(
                    format!(
                        "{REQUESTS_TOTAL}{{source=\"production\",{cell},outcome=\"{}\"}}",
                        outcome.label()
                    ),
                    values(each, 0.0),
                );
            }
            series(
                format!(
                    "{REQUESTS_TOTAL}{{source=\"production\",{cell},outcome=\"{}\"}}",
                    Outcome::ClientAborted.label()
                ),
                format!("0+{}x{minutes}", number(per_minute, 6)),
            );
            series(
                format!(
                    "{REQUESTS_TOTAL}{{source=\"synthetic\",{cell},outcome=\"{}\"}}",
                    Outcome::UpstreamError.label()
                ),
                format!("0+{}x{minutes}", number(per_minute, 6)),
            );
        }
        Sli::Attainment => {
            series(
                format!("{SLO_REQUESTS_TOTAL}{{source=\"production\",{cell},slo=\"met\"}}"),
                values(per_minute - errors, per_minute),
            );
            series(
                format!("{SLO_REQUESTS_TOTAL}{{source=\"production\",{cell},slo=\"missed\"}}"),
                values(errors, 0.0),
            );
            series(
                format!("{SLO_REQUESTS_TOTAL}{{source=\"synthetic\",{cell},slo=\"missed\"}}"),
                format!("0+{}x{minutes}", number(per_minute, 6)),
            );
        }
    }
    let _ = write!(
        out,
        "    alert_rule_test:\n      - eval_time: {}m\n        alertname: {alertname}\n",
        case.eval
    );
    if !case.fires {
        out.push_str("        exp_alerts: []\n");
        return;
    }
    let value = format!("{:.1}", case.burn);
    let (summary, description) = annotations(scope, sli, speed, &model, &value);
    let _ = write!(
        out,
        "        exp_alerts:\n          - exp_labels:\n              severity: {}\n              sli: {}\n              model: {}\n            exp_annotations:\n              summary: {}\n              description: {}\n",
        pair.severity,
        sli.label(),
        yaml_quoted(&model),
        yaml_quoted(&summary),
        yaml_quoted(&description),
    );
}

/// `x` with at most `decimals` decimals, trailing zeros dropped (`0.01`, `14.4`, `6`).
fn number(x: f64, decimals: usize) -> String {
    let text = format!("{x:.decimals$}");
    if !text.contains('.') {
        return text;
    }
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".to_string()
    } else {
        text.to_string()
    }
}

/// A PromQL string literal: double quotes, with `\`, `"` and control characters escaped.
fn promql_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `text` matched literally by a Prometheus (RE2) regular expression.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Whether YAML takes `c` as it is inside a quoted scalar (its printable set, less the
/// characters a reader might normalise).
fn yaml_plain_char(c: char) -> bool {
    matches!(u32::from(c), 0x20..=0x7e | 0xa0..=0xd7ff | 0xe000..=0xfffd | 0x10000..=0x10ffff)
}

/// A YAML scalar holding `text` exactly: single-quoted, or double-quoted with escapes when it
/// holds characters a single-quoted scalar cannot (line breaks, control characters).
fn yaml_quoted(text: &str) -> String {
    if text.chars().all(yaml_plain_char) {
        return format!("'{}'", text.replace('\'', "''"));
    }
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c if yaml_plain_char(c) => out.push(c),
            c if u32::from(c) <= 0xffff => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\U{:08x}", u32::from(c));
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::slo::SloTargets;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn policy(default: bool, models: &[(&str, bool)]) -> SloPolicy {
        let targets = |set: bool| SloTargets {
            ttft: set.then_some(Duration::from_secs(1)),
            ..SloTargets::NONE
        };
        SloPolicy {
            default: targets(default),
            models: models
                .iter()
                .map(|(m, set)| ((*m).to_string(), targets(*set)))
                .collect(),
            ttft_of: Default::default(),
        }
    }

    #[test]
    fn scopes_follow_the_tables_and_their_targets() {
        let objectives = SloObjectives {
            default: 0.99,
            models: BTreeMap::from([("b".to_string(), 0.999)]),
        };
        let scopes = scopes(&policy(true, &[("b", true), ("a", false)]), &objectives);
        assert_eq!(
            scopes,
            vec![
                Scope {
                    models: Models::One("a".into()),
                    objective: 0.99,
                    slis: vec![Sli::Availability],
                },
                Scope {
                    models: Models::One("b".into()),
                    objective: 0.999,
                    slis: vec![Sli::Availability, Sli::Attainment],
                },
                Scope {
                    models: Models::AllBut(vec!["a".into(), "b".into()]),
                    objective: 0.99,
                    slis: vec![Sli::Availability, Sli::Attainment],
                },
            ]
        );
        // Without targets anywhere: availability for every model.
        let plain = super::scopes(&policy(false, &[]), &SloObjectives::default());
        assert_eq!(plain.len(), 1);
        assert_eq!(plain[0].matcher(), "");
        assert_eq!(plain[0].slis, vec![Sli::Availability]);
    }

    #[test]
    fn names_are_escaped_for_promql_regexes_and_yaml() {
        assert_eq!(regex_escape("a.b+c"), "a\\.b\\+c");
        assert_eq!(promql_string("a\\.b\"c"), "\"a\\\\.b\\\"c\"");
        assert_eq!(yaml_quoted("it's"), "'it''s'");
        assert_eq!(yaml_quoted("a\nb"), "\"a\\u000ab\"");
        assert_eq!(number(1.0 - 0.99, 9), "0.01");
        assert_eq!(number(14.4, 3), "14.4");
        assert_eq!(number(6.0, 3), "6");
        assert_eq!(number((1.0 - 0.99999) * 100.0, 6), "0.001");
        let scope = Scope {
            models: Models::AllBut(vec!["x.y".into(), "any-model".into()]),
            objective: 0.99,
            slis: vec![Sli::Availability],
        };
        assert_eq!(scope.matcher(), "model!~\"x\\\\.y|any-model\"");
        assert_eq!(scope.test_model(), "any-model_");
    }

    #[test]
    fn the_output_is_deterministic_and_names_every_window() {
        let scopes = scopes(&policy(true, &[("m", true)]), &SloObjectives::default());
        let text = rules(&scopes);
        assert_eq!(text, rules(&scopes));
        for (window, _) in WINDOWS {
            assert!(
                text.contains(&format!("{BURN_RATE}:ratio_rate{window}\n")),
                "{window}"
            );
        }
        let tests = unit_tests(&scopes, "r.yml");
        assert!(tests.contains("rule_files:\n  - 'r.yml'\n"), "{tests}");
        // Two scopes × two SLIs × two speeds × three cases.
        assert_eq!(tests.matches("  - name: ").count(), 24);
    }
}
