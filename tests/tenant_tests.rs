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
            .filter(|r| r.tenant.as_deref() == Some(tenant))
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
    let bands: Vec<Option<&str>> = all.iter().map(|r| r.priority.map(|p| p.label())).collect();
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
    assert!(html.contains("id=\"priority-filter\""), "{html}");
    for band in ["0", "1-9", "10+", "negative"] {
        assert!(
            html.contains(&format!("data-priority=\"{band}\" data-ttft-ms=\"")),
            "{band}: {html}"
        );
    }
    server.shutdown().await;
}
