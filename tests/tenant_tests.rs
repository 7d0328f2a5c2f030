//! Tenants and priority bands (issue 39, points 1 and 2), through the real proxy in front of a
//! scripted upstream: a hostile client sending a thousand tenant names leaves the allow list
//! plus `other` in `/metrics` and nothing more; an API key is matched by its hash; each
//! tenant has its own production matrix (`/matrix?tenant=`, the page's filter, the store's
//! snapshots); the request's `priority` is a band on the cell series and a slice of the matrix,
//! and the page shows each band's TTFT and TBT per cell.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use common::{client, get, proxy, ScriptedUpstream};
use http_body_util::{BodyExt, Full};
use tokentap::matrix::MatrixDoc;

/// Streams 4 tokens, 1 ms apart, after a 2 ms TTFT, with usage when asked.
async fn answering_upstream() -> ScriptedUpstream {
    ScriptedUpstream::start(|r| {
        common::timed_chat_stream(
            r,
            Duration::from_millis(2),
            Duration::from_millis(1),
            Some(4),
        )
    })
    .await
}

/// Sends `requests` (extra headers, body) through the proxy, 32 at a time, each answered 200.
async fn send_all(url: &str, requests: Vec<(Vec<(String, String)>, String)>) {
    let client = client();
    let mut pending = requests.into_iter();
    loop {
        let batch: Vec<_> = pending.by_ref().take(32).collect();
        if batch.is_empty() {
            break;
        }
        let mut calls = tokio::task::JoinSet::new();
        for (headers, body) in batch {
            let mut request = http::Request::post(url).header("content-type", "application/json");
            for (name, value) in headers {
                request = request.header(name, value);
            }
            let request = request.body(Full::new(Bytes::from(body))).unwrap();
            let client = client.clone();
            calls.spawn(async move {
                let response = client.request(request).await.unwrap();
                assert_eq!(response.status(), 200);
                response.into_body().collect().await.unwrap();
            });
        }
        while let Some(done) = calls.join_next().await {
            done.unwrap();
        }
    }
}

fn chat(extra: &str) -> String {
    format!(
        r#"{{"model":"m","stream":true,"messages":[{{"role":"user","content":"hello"}}]{extra}}}"#
    )
}

/// Every value label `name` takes in the exposition text.
fn label_values(text: &str, name: &str) -> BTreeSet<String> {
    let needle = format!("{name}=\"");
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .flat_map(|line| {
            line.match_indices(&needle)
                .map(|(at, _)| {
                    let rest = &line[at + needle.len()..];
                    rest[..rest.find('"').unwrap()].to_owned()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The sum of `metric`'s samples whose labels contain every one of `having`.
fn sum_of(text: &str, metric: &str, having: &[&str]) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(&format!("{metric}{{")))
        .filter(|line| having.iter().all(|h| line.contains(h)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn requests_in(doc: &MatrixDoc) -> u64 {
    doc.decode.iter().filter_map(|c| c.completed_requests).sum()
}

async fn matrix(admin: &str, query: &str) -> (u16, String) {
    let answer = get(&format!("http://{admin}/matrix?window=all&{query}")).await;
    (answer.status, answer.text())
}

#[tokio::test]
async fn a_thousand_hostile_tenant_names_leave_the_allow_list_plus_other() {
    let upstream = answering_upstream().await;
    let key_hash = tokentap::proxy::tenants::key_hash(b"sk-batch-team");
    let (server, records) = proxy(
        &upstream.url(),
        &format!(
            "[tenants]\nheader = \"x-tenant\"\nallow = [\"search\", \"chat\"]\n[tenants.keys]\n\"{key_hash}\" = \"batch\"\n{}",
            common::NO_EVIDENCE_MINIMUM
        ),
    )
    .await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    let admin = server.admin_addr;

    let mut requests = Vec::new();
    // A thousand names no one allowed: long ones, quoted ones, ones that look like labels.
    for i in 0..1000 {
        let name = match i % 4 {
            0 => format!("team-{i}"),
            1 => format!("x\"{i}\",tenant=\"evil"),
            2 => "y".repeat(100 + i),
            _ => format!("Search{i}"),
        };
        requests.push((vec![("x-tenant".to_owned(), name)], chat("")));
    }
    for _ in 0..5 {
        requests.push((vec![("x-tenant".to_owned(), "search".to_owned())], chat("")));
    }
    for _ in 0..3 {
        requests.push((vec![("x-tenant".to_owned(), "chat".to_owned())], chat("")));
    }
    // The key's tenant wins over a header naming another.
    for _ in 0..2 {
        requests.push((
            vec![
                (
                    "authorization".to_owned(),
                    "Bearer sk-batch-team".to_owned(),
                ),
                ("x-tenant".to_owned(), "search".to_owned()),
            ],
            chat(""),
        ));
    }
    // No header at all: other.
    requests.push((Vec::new(), chat("")));
    send_all(&url, requests).await;
    let all = records.wait_for(1011).await;
    let count = |tenant: &str| {
        all.iter()
            .filter(|r| r.labels.slice.tenant() == Some(tenant))
            .count()
    };
    assert_eq!(
        (
            count("search"),
            count("chat"),
            count("batch"),
            count("other")
        ),
        (5, 3, 2, 1001)
    );

    let metrics = get(&format!("http://{admin}/metrics")).await.text();
    assert_eq!(
        label_values(&metrics, "tenant"),
        ["batch", "chat", "other", "search"]
            .map(String::from)
            .into_iter()
            .collect::<BTreeSet<_>>(),
        "the tenant label takes the allow list plus other, nothing a client sent"
    );
    assert!(!metrics.contains("evil"), "{metrics}");
    assert!(!metrics.contains("team-"), "{metrics}");
    assert_eq!(
        sum_of(
            &metrics,
            "tokentap_requests_total",
            &["tenant=\"other\"", "outcome=\"ok\""]
        ),
        1001.0
    );
    assert_eq!(
        sum_of(
            &metrics,
            "tokentap_requests_total",
            &["tenant=\"search\"", "outcome=\"ok\""]
        ),
        5.0
    );

    // Each tenant's own matrix; all of them together without the filter.
    for (tenant, n) in [("search", 5), ("chat", 3), ("batch", 2), ("other", 1001)] {
        let (status, body) = matrix(&admin.to_string(), &format!("tenant={tenant}")).await;
        assert_eq!(status, 200, "{body}");
        let doc: MatrixDoc = serde_json::from_str(&body).unwrap();
        assert_eq!(requests_in(&doc), n, "tenant {tenant}: {body}");
        assert!(
            doc.metadata
                .notes
                .iter()
                .any(|note| note.contains(&format!("tenant {tenant}"))),
            "{:?}",
            doc.metadata.notes
        );
    }
    let (_, body) = matrix(&admin.to_string(), "").await;
    let whole: MatrixDoc = serde_json::from_str(&body).unwrap();
    assert_eq!(requests_in(&whole), 1011);
    let (status, body) = matrix(&admin.to_string(), "tenant=team-1").await;
    assert_eq!(status, 400);
    assert!(
        body.contains("tenant `team-1` is not counted; the tenants are search, chat, batch, other"),
        "{body}"
    );

    // The page offers the filter and narrows its production side.
    let page = get(&format!("http://{admin}/?window=all&tenant=chat")).await;
    assert_eq!(page.status, 200);
    let html = page.text();
    assert!(html.contains("id=\"tenant-filter\""), "{html}");
    assert!(html.contains("chat (3)"), "{html}");
    assert!(html.contains("Only the requests of tenant chat."), "{html}");

    server.shutdown().await;
}

#[tokio::test]
async fn the_store_keeps_each_tenants_snapshot_and_matrix_show_reads_it() {
    let upstream = answering_upstream().await;
    let store = common::TempDir::new("tenant-store");
    let (server, records) = common::proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\ndefault_model = \"default\"\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"{}\"\n[tenants]\nheader = \"x-tenant\"\nallow = [\"search\"]\n",
        upstream.url(),
        store.0.display()
    ))
    .await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    let mut requests = vec![(vec![("x-tenant".to_owned(), "search".to_owned())], chat("")); 4];
    requests.push((vec![("x-tenant".to_owned(), "nobody".to_owned())], chat("")));
    send_all(&url, requests).await;
    records.wait_for(5).await;
    server.shutdown().await;

    let opened = tokentap::store::Store::open(&store.0).unwrap();
    let at = SystemTime::now();
    let whole = opened.snapshot_at(at, Some("m"), None).unwrap().unwrap();
    let search = opened
        .snapshot_at(at, Some("m"), Some("search"))
        .unwrap()
        .unwrap();
    let other = opened
        .snapshot_at(at, Some("m"), Some("other"))
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            requests_in(&whole.matrix),
            requests_in(&search.matrix),
            requests_in(&other.matrix)
        ),
        (5, 4, 1)
    );
    let shown = std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
        .args(["matrix", "show", "--store"])
        .arg(&store.0)
        .args(["--tenant", "search", "--at", "latest", "--format", "json"])
        .output()
        .unwrap();
    assert!(shown.status.success(), "{shown:?}");
    let doc: MatrixDoc = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(requests_in(&doc), 4);
}

#[tokio::test]
async fn the_priority_band_slices_the_cells_and_the_page_shows_each_bands_ttft() {
    let upstream = answering_upstream().await;
    let (server, records) = proxy(&upstream.url(), common::NO_EVIDENCE_MINIMUM).await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    let admin = server.admin_addr.to_string();
    let mut requests = Vec::new();
    for priority in ["0", "0", "5", "-3", "100", "1e3", "\"high\""] {
        requests.push((Vec::new(), chat(&format!(r#","priority":{priority}"#))));
    }
    requests.push((Vec::new(), chat("")));
    send_all(&url, requests).await;
    let all = records.wait_for(8).await;
    let bands: Vec<Option<&str>> = all.iter().map(|r| r.labels.slice.priority()).collect();
    for (band, n) in [
        (Some("0"), 2),
        (Some("1-9"), 1),
        (Some("negative"), 1),
        (Some("10+"), 1),
        (None, 3),
    ] {
        assert_eq!(
            bands.iter().filter(|b| **b == band).count(),
            n,
            "{band:?}: {bands:?}"
        );
    }
    let metrics = get(&format!("http://{admin}/metrics")).await.text();
    assert_eq!(
        label_values(&metrics, "priority"),
        ["0", "1-9", "10+", "negative"]
            .map(String::from)
            .into_iter()
            .collect::<BTreeSet<_>>()
    );
    assert!(
        !metrics.contains("tenant=\""),
        "tenants are off: no tenant label"
    );
    let (status, body) = matrix(&admin, "priority=0").await;
    assert_eq!(status, 200, "{body}");
    let doc: MatrixDoc = serde_json::from_str(&body).unwrap();
    assert_eq!(requests_in(&doc), 2);
    let (_, body) = matrix(&admin, "priority=7").await;
    let doc: MatrixDoc = serde_json::from_str(&body).unwrap();
    assert_eq!(requests_in(&doc), 1, "an integer asks for its band");
    let (status, body) = matrix(&admin, "priority=urgent").await;
    assert_eq!(status, 400);
    assert!(
        body.contains("expected a band (negative, 0, 1-9, 10+)"),
        "{body}"
    );
    let (status, body) = matrix(&admin, "tenant=a").await;
    assert_eq!(status, 400);
    assert!(body.contains("tenants are off"), "{body}");

    let html = get(&format!("http://{admin}/?window=all")).await.text();
    assert!(html.contains("id=\"by-priority\""), "{html}");
    // Collapsed below the matrices, not a wall of columns above them (issue 45.5).
    assert!(
        html.contains("<details id=\"by-priority\"><summary>By priority: "),
        "{html}"
    );
    assert!(html.contains("id=\"priority-filter\""), "{html}");
    for band in ["0", "1-9", "10+", "negative"] {
        assert!(
            html.contains(&format!("data-priority=\"{band}\" data-ttft-ms=\"")),
            "{band}: {html}"
        );
    }
    server.shutdown().await;
}

/// A simulator serving 2 requests at a time, 100 tok/s each: a queue forms at once.
fn two_slot_profile() -> tokentap::sim::Profile {
    let mut profile = common::flat_profile("m", 100.0, 5.0, "tests/tenant_tests.rs");
    profile.capacity.max_running_requests = 2;
    profile
}

/// The median of `values` (sorted here).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::test]
async fn under_load_the_engine_serves_its_high_priority_band_first_and_tokentap_shows_it() {
    use tokentap::sim::{Dialect, SimOptions, SimServer};
    // sglang with --enable-priority-scheduling: larger values first.
    let sim = SimServer::start(
        two_slot_profile(),
        SimOptions {
            dialect: Dialect::Sglang,
            priority_scheduling: true,
            ..SimOptions::default()
        },
    )
    .await
    .unwrap();
    // The upstream's self-description is read (fingerprint reads on): the page names its engine.
    let (server, records) = common::proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nmetrics_interval = \"0\"\n[store]\ndata_dir = \"\"\n{}",
        sim.base_url(),
        common::NO_EVIDENCE_MINIMUM
    ))
    .await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    let admin = server.admin_addr.to_string();
    let body = |priority: i64, tokens: u64| {
        format!(
            r#"{{"model":"m","stream":true,"max_tokens":{tokens},"ignore_eos":true,"priority":{priority},"messages":[{{"role":"user","content":"hello"}}]}}"#
        )
    };
    // Two long requests take both slots; then twelve wait, high (10) and low (0) interleaved.
    let blockers = {
        let url = url.clone();
        let blockers: Vec<_> = (0..2).map(|_| (Vec::new(), body(0, 30))).collect();
        tokio::spawn(async move { send_all(&url, blockers).await })
    };
    // Both run on the server before the others are sent.
    let sim_metrics = format!("{}/metrics", sim.base_url());
    common::wait::until_async(
        "two running on the server",
        Duration::from_secs(10),
        async || {
            get(&sim_metrics).await.text().lines().any(|l| {
                l.starts_with("sglang:num_running_reqs{")
                    && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) >= Some(2.0)
            })
        },
    )
    .await;
    let queued: Vec<_> = (0..12)
        .map(|i| (Vec::new(), body(if i % 2 == 0 { 10 } else { 0 }, 10)))
        .collect();
    send_all(&url, queued).await;
    blockers.await.unwrap();
    let all = records.wait_for(14).await;
    let ttfts = |band: &str| {
        all.iter()
            .filter(|r| r.labels.slice.priority() == Some(band))
            .filter_map(|r| r.timing.ttft)
            .map(|t| t.as_secs_f64() * 1000.0)
            .collect::<Vec<f64>>()
    };
    let (high, low) = (ttfts("10+"), ttfts("0"));
    assert_eq!((high.len(), low.len()), (6, 8), "{high:?} {low:?}");
    let (high_p50, low_p50) = (median(high.clone()), median(low.clone()));
    eprintln!("TTFT p50: priority 10+ {high_p50:.0} ms, priority 0 {low_p50:.0} ms");
    assert!(
        high_p50 * 1.5 < low_p50,
        "the high band waits less: {high:?} vs {low:?}"
    );

    // What an operator reads: each band's matrix, the page's table, the Prometheus label.
    let (_, body) = matrix(&admin, "priority=10%2B").await;
    let doc: MatrixDoc = serde_json::from_str(&body).unwrap();
    assert_eq!(requests_in(&doc), 6, "{body}");
    let html = get(&format!("http://{admin}/?window=all")).await.text();
    assert!(html.contains("id=\"by-priority\""), "{html}");
    for band in ["0", "10+"] {
        assert!(
            html.contains(&format!("data-priority=\"{band}\" data-ttft-ms=\"")),
            "{band}: {html}"
        );
    }
    assert!(
        html.contains("sglang schedules by priority only when started with --enable-priority-scheduling; it then serves larger values first (--schedule-low-priority-values-first reverses it)."),
        "{html}"
    );
    let metrics = get(&format!("http://{admin}/metrics")).await.text();
    assert!(
        metrics.contains("priority=\"10+\"") && metrics.contains("priority=\"0\""),
        "{metrics}"
    );
    server.shutdown().await;
}
