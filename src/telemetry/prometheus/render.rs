//! The series the exporter cannot hold, written as exposition text at each render: the
//! upstreams' scraped state and scrape counts, and their configurations.

use std::fmt::Write as _;

use crate::meter::conversation::{After, Conversations};
use crate::meter::identity::IdentityRegistry;
use crate::meter::server_state::{ScrapeOutcome, ServerStateRegistry};
use crate::meter::turn_stats::{gap_label, TurnStats, GAP_BINS};
use crate::telemetry::names::*;

/// A label value as the text format wants it: backslash, double quote and newline escaped.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes the upstream-state gauges and the scrape counters.
pub(super) fn render_server_state(registry: &ServerStateRegistry, out: &mut String) {
    let mut rows = registry.current();
    rows.sort_by(|a, b| (&a.upstream, &a.model).cmp(&(&b.upstream, &b.model)));
    for (i, (name, help)) in UPSTREAM_STATE_GAUGES.iter().enumerate() {
        let samples: Vec<String> = rows
            .iter()
            .filter_map(|row| {
                let value = row.values.get(i).copied().flatten()?;
                Some(format!(
                    "{name}{{upstream=\"{}\",model=\"{}\"}} {value}\n",
                    escape_label(&row.upstream),
                    escape_label(&row.model)
                ))
            })
            .collect();
        if samples.is_empty() {
            continue;
        }
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n");
        samples.iter().for_each(|sample| out.push_str(sample));
    }
    let mut upstreams = registry.upstreams();
    if upstreams.is_empty() {
        return;
    }
    upstreams.sort();
    let _ = write!(
        out,
        "# HELP {UPSTREAM_SCRAPES_TOTAL} {UPSTREAM_SCRAPES_HELP}\n# TYPE {UPSTREAM_SCRAPES_TOTAL} counter\n"
    );
    for upstream in &upstreams {
        for outcome in ScrapeOutcome::ALL {
            let _ = writeln!(
                out,
                "{UPSTREAM_SCRAPES_TOTAL}{{upstream=\"{}\",result=\"{}\"}} {}",
                escape_label(upstream),
                outcome.label(),
                registry.scrapes(upstream, outcome)
            );
        }
    }
}

/// Writes the upstreams' configurations: one info series per kept configuration (at most
/// `meter::identity::KEPT_CONFIGS` per upstream, so the label set stays bounded), the change
/// counter and the flapping gauge.
pub(super) fn render_identities(registry: &IdentityRegistry, out: &mut String) {
    let upstreams = registry.all();
    if upstreams.is_empty() {
        return;
    }
    let mut info = String::new();
    for upstream in &upstreams {
        for config in upstream.configs() {
            let _ = writeln!(
                info,
                "{UPSTREAM_CONFIG_INFO}{{upstream=\"{}\",fingerprint=\"{}\",engine=\"{}\",version=\"{}\"}} 1",
                escape_label(&upstream.upstream),
                config.id.label().as_str(),
                escape_label(config.engine()),
                escape_label(config.version()),
            );
        }
    }
    if !info.is_empty() {
        let _ = write!(
            out,
            "# HELP {UPSTREAM_CONFIG_INFO} {UPSTREAM_CONFIG_INFO_HELP}\n# TYPE {UPSTREAM_CONFIG_INFO} gauge\n{info}"
        );
    }
    let _ = write!(
        out,
        "# HELP {UPSTREAM_CONFIG_CHANGES_TOTAL} {UPSTREAM_CONFIG_CHANGES_HELP}\n# TYPE {UPSTREAM_CONFIG_CHANGES_TOTAL} counter\n"
    );
    for upstream in &upstreams {
        let _ = writeln!(
            out,
            "{UPSTREAM_CONFIG_CHANGES_TOTAL}{{upstream=\"{}\"}} {}",
            escape_label(&upstream.upstream),
            upstream.changes_total()
        );
    }
    let _ = write!(
        out,
        "# HELP {UPSTREAM_CONFIG_FLAPPING} {UPSTREAM_CONFIG_FLAPPING_HELP}\n# TYPE {UPSTREAM_CONFIG_FLAPPING} gauge\n"
    );
    for upstream in &upstreams {
        let _ = writeln!(
            out,
            "{UPSTREAM_CONFIG_FLAPPING}{{upstream=\"{}\"}} {}",
            escape_label(&upstream.upstream),
            u8::from(upstream.is_flapping())
        );
    }
    // The count only: the routes themselves are never a label (the log and /status name them).
    let unclassified: Vec<(&str, u64)> = upstreams
        .iter()
        .filter_map(|u| Some((&*u.upstream, u.unclassified_routes()?)))
        .collect();
    if !unclassified.is_empty() {
        let _ = write!(
            out,
            "# HELP {UPSTREAM_UNCLASSIFIED_ROUTES} {UPSTREAM_UNCLASSIFIED_ROUTES_HELP}\n# TYPE {UPSTREAM_UNCLASSIFIED_ROUTES} gauge\n"
        );
        for (upstream, count) in unclassified {
            let _ = writeln!(
                out,
                "{UPSTREAM_UNCLASSIFIED_ROUTES}{{upstream=\"{}\"}} {count}",
                escape_label(upstream)
            );
        }
    }
}

/// The session series (`tokentap_sessions`, `tokentap_session_*`), written as text: counts the
/// session sink keeps since start, one series per model, kind and gap bin (bounded by the
/// model labels, 4 kinds and [`GAP_BINS`] bins).
pub(super) fn render_sessions(table: &Conversations, stats: &TurnStats, out: &mut String) {
    let _ = write!(
        out,
        "# HELP {SESSIONS} {SESSIONS_HELP}\n# TYPE {SESSIONS} gauge\n{SESSIONS} {}\n",
        table.len()
    );
    // A model's series appear with its first turn after a first one: requests that are each a
    // session of their own (most traffic without keys or conversations) add nothing here.
    let models: Vec<_> = stats
        .snapshot()
        .into_iter()
        .filter(|(_, figures)| figures.turns.iter().skip(1).any(|&count| count > 0))
        .collect();
    if models.is_empty() {
        return;
    }
    let _ = write!(
        out,
        "# HELP {SESSION_TURNS_TOTAL} {SESSION_TURNS_HELP}\n# TYPE {SESSION_TURNS_TOTAL} counter\n"
    );
    for (model, figures) in &models {
        let model = escape_label(model);
        for (after, count) in After::ALL.iter().zip(figures.turns) {
            if matches!(after, After::First | After::Overlap) {
                let _ = writeln!(
                    out,
                    "{SESSION_TURNS_TOTAL}{{model=\"{model}\",after=\"{}\",gap=\"none\"}} {count}",
                    after.label()
                );
            }
        }
        for (bin, figures) in figures.bins.iter().enumerate() {
            for (kind, count) in ["user", "tool"].iter().zip(figures.turns) {
                let _ = writeln!(
                    out,
                    "{SESSION_TURNS_TOTAL}{{model=\"{model}\",after=\"{kind}\",gap=\"{}\"}} {count}",
                    gap_label(bin)
                );
            }
        }
    }
    type Field = fn(&crate::meter::turn_stats::GapBin) -> f64;
    let curves: [(&str, &str, Field); 3] = [
        (
            SESSION_PROMPT_TOKENS_TOTAL,
            SESSION_PROMPT_TOKENS_HELP,
            |b| b.prompt_tokens as f64,
        ),
        (
            SESSION_CACHED_TOKENS_TOTAL,
            SESSION_CACHED_TOKENS_HELP,
            |b| b.cached_tokens as f64,
        ),
        (
            SESSION_SHARED_TOKENS_TOTAL,
            SESSION_SHARED_TOKENS_HELP,
            |b| b.shared_tokens.round(),
        ),
    ];
    for (name, help, field) in curves {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} counter\n");
        for (model, figures) in &models {
            let model = escape_label(model);
            for bin in 0..GAP_BINS {
                let value = figures.bins.get(bin).map_or(0.0, field);
                let _ = writeln!(
                    out,
                    "{name}{{model=\"{model}\",gap=\"{}\"}} {value}",
                    gap_label(bin)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::SystemTime;

    use tokio::time::Instant;

    use super::*;
    use crate::meter::identity::{ConfigFacts, FingerprintId, UpstreamIdentity};

    #[test]
    fn label_values_escape_what_the_text_format_reserves() {
        assert_eq!(escape_label("plain-name_1"), "plain-name_1");
        assert_eq!(
            escape_label("a\\b \"c\"\nd"),
            "a\\\\b \\\"c\\\"\\nd",
            "backslash, quote and newline"
        );
    }

    #[test]
    fn server_state_writes_known_gauges_only_and_every_scrape_result() {
        let registry = ServerStateRegistry::default();
        let mut out = String::new();
        render_server_state(&registry, &mut out);
        assert!(out.is_empty(), "nothing scraped, nothing written: {out}");

        let upstream: Arc<str> = Arc::from("gpu\"1");
        registry.watch(&upstream);
        let tracker = registry.tracker(&upstream, &Arc::from("m")).unwrap();
        tracker.publish(Instant::now(), [Some(3.0), None, Some(0.25), None]);
        registry.count_scrape(&upstream, ScrapeOutcome::Ok);
        registry.count_scrape(&upstream, ScrapeOutcome::Ok);
        registry.count_scrape(&upstream, ScrapeOutcome::Timeout);
        render_server_state(&registry, &mut out);

        let (running, _) = UPSTREAM_STATE_GAUGES[0];
        let (queued, _) = UPSTREAM_STATE_GAUGES[1];
        let (kv, _) = UPSTREAM_STATE_GAUGES[2];
        assert!(
            out.contains(&format!(
                "{running}{{upstream=\"gpu\\\"1\",model=\"m\"}} 3\n"
            )),
            "{out}"
        );
        assert!(out.contains(&format!("{kv}{{upstream=\"gpu\\\"1\",model=\"m\"}} 0.25\n")));
        assert!(
            !out.contains(queued),
            "a gauge the server did not expose has no sample and no HELP: {out}"
        );
        let scrape_lines: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with(&format!("{UPSTREAM_SCRAPES_TOTAL}{{")))
            .collect();
        assert_eq!(scrape_lines.len(), ScrapeOutcome::ALL.len());
        assert!(scrape_lines.contains(
            &format!("{UPSTREAM_SCRAPES_TOTAL}{{upstream=\"gpu\\\"1\",result=\"ok\"}} 2").as_str()
        ));
        assert!(scrape_lines.contains(
            &format!("{UPSTREAM_SCRAPES_TOTAL}{{upstream=\"gpu\\\"1\",result=\"timeout\"}} 1")
                .as_str()
        ));
    }

    #[test]
    fn identities_write_each_kept_configuration_and_the_change_state() {
        let registry = IdentityRegistry::default();
        let mut out = String::new();
        render_identities(&registry, &mut out);
        assert!(out.is_empty(), "no upstream, nothing written: {out}");

        let quiet = Arc::new(UpstreamIdentity::new(Arc::from("quiet")));
        let read = Arc::new(UpstreamIdentity::new(Arc::from("read")));
        let mut facts = ConfigFacts::default();
        facts.fields.insert("engine".into(), "sglang".into());
        facts.fields.insert("version".into(), "0.4.1".into());
        let (first, second) = (FingerprintId::from_hash(1), FingerprintId::from_hash(2));
        read.observe(first, facts.clone(), SystemTime::now());
        read.observe(second, facts, SystemTime::now());
        registry.add(Arc::clone(&quiet));
        registry.add(Arc::clone(&read));
        render_identities(&registry, &mut out);

        let info: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with(&format!("{UPSTREAM_CONFIG_INFO}{{")))
            .collect();
        assert_eq!(info.len(), 2, "both configurations of `read`: {out}");
        for id in [first, second] {
            let line = format!(
                "{UPSTREAM_CONFIG_INFO}{{upstream=\"read\",fingerprint=\"{}\",engine=\"sglang\",version=\"0.4.1\"}} 1",
                id.label().as_str()
            );
            assert!(info.contains(&line.as_str()), "{out}");
        }
        assert!(out.contains(&format!(
            "{UPSTREAM_CONFIG_CHANGES_TOTAL}{{upstream=\"read\"}} 1\n"
        )));
        assert!(out.contains(&format!(
            "{UPSTREAM_CONFIG_CHANGES_TOTAL}{{upstream=\"quiet\"}} 0\n"
        )));
        assert!(out.contains(&format!(
            "{UPSTREAM_CONFIG_FLAPPING}{{upstream=\"quiet\"}} 0\n"
        )));
        assert_eq!(out.matches("# TYPE ").count(), 3, "{out}");
    }
}
