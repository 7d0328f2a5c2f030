//! A request's labels are declared once (issue 47, point 1): a test-only dimension of the
//! traffic slice — a `region` read from a header, declared here in one `Dimension` with its
//! producer and registered — reaches the cell series in `/metrics`, the matrix's `?region=`
//! filter and the page's filter links, and the store's per-slice snapshots, with no other code
//! touched (as `engine_tests` shows for engines).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use crate::common;

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use common::{client, get, ScriptedUpstream};
use http_body_util::{BodyExt, Full};
use tokentap::matrix::MatrixDoc;
use tokentap::meter::labels::{Dimension, SliceFilter, SliceValue};

/// The regions a client may name; anything else is `elsewhere` (a producer bounds its values).
const REGIONS: [&str; 3] = ["eu", "us", "elsewhere"];

fn region(text: &str) -> Result<SliceValue, String> {
    REGIONS
        .iter()
        .find(|r| **r == text)
        .map(|r| SliceValue::Named(r))
        .ok_or_else(|| format!("expected one of {}", REGIONS.join(", ")))
}

static REGION: Dimension = Dimension {
    name: "region",
    values: Some(&REGIONS),
    parse: region,
    snapshots: true,
};

fn region_of(parts: &http::request::Parts) -> Option<SliceValue> {
    let named = parts.headers.get("x-test-region")?.to_str().ok()?;
    Some(region(named).unwrap_or(SliceValue::Named("elsewhere")))
}

fn requests_in(doc: &MatrixDoc) -> u64 {
    doc.decode.iter().filter_map(|c| c.completed_requests).sum()
}

#[tokio::test]
async fn a_test_only_dimension_reaches_metrics_the_matrix_and_the_store() {
    tokentap::proxy::slice::register(&REGION, region_of);
    let upstream = ScriptedUpstream::start(|r| {
        common::timed_chat_stream(
            r,
            Duration::from_millis(2),
            Duration::from_millis(1),
            Some(4),
        )
    })
    .await;
    let store = common::TempDir::new("labels-store");
    let (server, records) = common::proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\ndefault_model = \"default\"\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"{}\"\n{}",
        upstream.url(),
        store.0.display(),
        common::NO_EVIDENCE_MINIMUM
    ))
    .await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    let client = client();
    for named in ["eu", "eu", "eu", "us", "atlantis"] {
        let request = http::Request::post(&url)
            .header("content-type", "application/json")
            .header("x-test-region", named)
            .body(Full::new(Bytes::from(
                r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}"#,
            )))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap();
    }
    let regions: Vec<Option<String>> = records
        .wait_for(5)
        .await
        .iter()
        .map(|r| r.labels.slice.get("region").map(str::to_owned))
        .collect();
    assert_eq!(regions.iter().flatten().count(), 5, "{regions:?}");
    let admin = server.admin_addr;

    // A label of the cell series, bounded by its producer.
    let metrics = get(&format!("http://{admin}/metrics")).await.text();
    for region in ["eu", "us", "elsewhere"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("tokentap_requests_total{")
                    && l.contains(&format!("region=\"{region}\""))),
            "no cell series of region {region}:\n{metrics}"
        );
    }
    assert!(!metrics.contains("atlantis"));

    // A filter of the matrix, in the document's words, and on the page.
    for (query, expected) in [("region=eu", 3), ("region=us", 1), ("", 5)] {
        let answer = get(&format!("http://{admin}/matrix?window=all&{query}")).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let doc: MatrixDoc = serde_json::from_str(&answer.text()).unwrap();
        assert_eq!(requests_in(&doc), expected, "{query}");
        if !query.is_empty() {
            assert!(
                doc.metadata
                    .notes
                    .iter()
                    .any(|n| n.contains("region eu") || n.contains("region us")),
                "{:?}",
                doc.metadata.notes
            );
        }
    }
    let refused = get(&format!("http://{admin}/matrix?window=all&region=mars")).await;
    assert_eq!(refused.status, 400);
    assert!(
        refused
            .text()
            .contains("region `mars`: expected one of eu, us, elsewhere"),
        "{}",
        refused.text()
    );
    let page = get(&format!("http://{admin}/?window=all&region=eu")).await;
    let html = page.text();
    assert!(html.contains("id=\"region-filter\""), "{html}");
    assert!(html.contains("eu (3)"), "{html}");

    // The store keeps a snapshot of each region beside the whole matrix.
    server.shutdown().await;
    let opened = tokentap::store::Store::open(&store.0).unwrap();
    let at = SystemTime::now();
    let of = |region: &'static str| {
        let slice = SliceFilter::only(&REGION, SliceValue::Named(region));
        requests_in(
            &opened
                .snapshot_of(at, None, &slice)
                .unwrap()
                .unwrap()
                .matrix,
        )
    };
    assert_eq!((of("eu"), of("us"), of("elsewhere")), (3, 1, 1));
    let listed = opened.snapshots(None, None).unwrap();
    assert!(
        listed
            .iter()
            .any(|s| s.slice.as_deref() == Some("region=eu")),
        "{listed:?}"
    );
}
