//! Sessions and turns on live traffic (issue 60, points 1–3): a real proxy on loopback in front
//! of a scripted upstream; each request's record says which session and turn it is, what came
//! before it and the gap from the previous turn's end; `/metrics` and `/matrix?view=sessions`
//! show the figures.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;

use crate::common::*;
use tokentap::meter::conversation::{After, SessionSource};
use tokentap::meter::record::RequestRecord;

/// A chat answer of two tokens, or (`tool`) one tool-call delta, with usage: the prompt is
/// `x_prompt_tokens` long, `x_cached_tokens` of it cached.
fn answer(request: &Received) -> Script {
    let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap_or_default();
    if body["x_tool"] != true {
        return timed_chat_stream(request, Duration::ZERO, Duration::from_millis(1), Some(2));
    }
    let head = r#"{"id":"c1","object":"chat.completion.chunk","created":1767225600,"model":"m","choices":["#;
    Script::sse(vec![
        data(&format!(
            r#"{head}{{"index":0,"delta":{{"role":"assistant","content":""}},"finish_reason":null}}]}}"#
        )),
        data(&format!(
            r#"{head}{{"index":0,"delta":{{"tool_calls":[{{"index":0,"id":"call_1","type":"function","function":{{"name":"ls","arguments":"{{}}"}}}}]}},"finish_reason":null}}]}}"#
        )),
        data(&format!(
            r#"{head}{{"index":0,"delta":{{}},"finish_reason":"tool_calls"}}]}}"#
        )),
        data(
            r#"{"id":"c1","object":"chat.completion.chunk","created":1767225600,"model":"m","choices":[],"usage":{"prompt_tokens":10,"total_tokens":11,"completion_tokens":1}}"#,
        ),
        Step::Send(Bytes::from_static(b"data: [DONE]\n\n")),
    ])
}

async fn start() -> (
    ScriptedUpstream,
    tokentap::app::serve::ProxyServer,
    Arc<Records>,
) {
    let upstream = ScriptedUpstream::start(answer).await;
    let (server, records) = proxy(&format!("http://{}", upstream.addr), "").await;
    (upstream, server, records)
}

/// Sends one chat request with these headers and this body; answered 200.
async fn chat(server: &tokentap::app::serve::ProxyServer, headers: &[(&str, &str)], body: &str) {
    let mut request =
        http::Request::post(format!("http://{}/v1/chat/completions", server.proxy_addr))
            .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let received = send(
        request
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap(),
    )
    .await;
    assert_eq!(received.status, 200, "{}", received.text());
}

fn messages_body(messages: &[&str], extra: &str) -> String {
    let messages: Vec<String> = messages
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            format!(r#"{{"role":"{role}","content":"{text}"}}"#)
        })
        .collect();
    format!(
        r#"{{"model":"m","stream":true,"max_tokens":2{extra},"messages":[{}]}}"#,
        messages.join(",")
    )
}

fn turn(record: &RequestRecord) -> tokentap::meter::conversation::Turn {
    record
        .turn
        .unwrap_or_else(|| panic!("no turn in {record:#?}"))
}

#[tokio::test]
async fn every_default_session_key_names_a_session() {
    let (_upstream, server, records) = start().await;
    let headers = [
        "x-session-id",
        "x-smg-routing-key",
        "x-dynamo-session-id",
        "x-claude-code-session-id",
        "x-correlation-id",
        "x-litellm-session-id",
    ];
    let fields = ["prompt_cache_key", "session_id", "user"];
    let mut sent = 0;
    for name in headers {
        // Prompts that do not resend each other: only the key can join them.
        for (value, prompt) in [("s-1", "a"), ("s-1", "b"), ("s-2", "c")] {
            chat(
                &server,
                &[(name, &format!("{name}-{value}"))],
                &messages_body(&[prompt], ""),
            )
            .await;
        }
        sent += 3;
        let all = records.wait_for(sent).await;
        let [one, two, other] = [&all[sent - 3], &all[sent - 2], &all[sent - 1]].map(|r| turn(r));
        assert_eq!(one.source, SessionSource::Key, "{name}");
        assert_eq!((one.index, one.after), (1, After::First), "{name}");
        assert_eq!(two.session, one.session, "{name}");
        assert_eq!((two.index, two.after), (2, After::User), "{name}");
        assert!(two.gap.is_some(), "{name}");
        assert_ne!(other.session, one.session, "{name}");
        assert_eq!(other.index, 1, "{name}");
    }
    for field in fields {
        for (value, prompt) in [("s-1", "a"), ("s-1", "b"), ("s-2", "c")] {
            let extra = format!(r#","{field}":"{field}-{value}""#);
            chat(&server, &[], &messages_body(&[prompt], &extra)).await;
        }
        sent += 3;
        let all = records.wait_for(sent).await;
        let [one, two, other] = [&all[sent - 3], &all[sent - 2], &all[sent - 1]].map(|r| turn(r));
        assert_eq!(one.source, SessionSource::Key, "{field}");
        assert_eq!((two.session, two.index), (one.session, 2), "{field}");
        assert_ne!(other.session, one.session, "{field}");
    }
    // The first configured key wins over a later one and over the prompt.
    chat(
        &server,
        &[
            ("x-session-id", "x-session-id-s-1"),
            ("x-correlation-id", "zzz"),
        ],
        &messages_body(&["d"], ""),
    )
    .await;
    let all = records.wait_for(sent + 1).await;
    let (first, last) = (turn(&all[0]), turn(&all[sent]));
    assert_eq!((last.session, last.index), (first.session, 3));
}

#[tokio::test]
async fn a_keyless_conversation_is_followed_by_its_prompts_and_a_tool_wait_is_told_apart() {
    let (_upstream, server, records) = start().await;
    // Turn 1 calls a tool; turn 2 (its result) comes 300 ms after turn 1's answer ended; turn 3
    // is the user's; a second conversation shares turn 1's first message only.
    chat(
        &server,
        &[],
        &messages_body(&["plan a trip"], r#","x_tool":true"#),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    chat(
        &server,
        &[],
        &messages_body(&["plan a trip", "calling ls", "ls says: a b"], ""),
    )
    .await;
    chat(
        &server,
        &[],
        &messages_body(
            &[
                "plan a trip",
                "calling ls",
                "ls says: a b",
                "t0 t1 ",
                "thanks",
            ],
            "",
        ),
    )
    .await;
    chat(&server, &[], &messages_body(&["plan a different trip"], "")).await;
    let all = records.wait_for(4).await;
    let [one, two, three, other] = [0, 1, 2, 3].map(|i| turn(&all[i]));
    assert_eq!(
        (one.source, one.index, one.after),
        (SessionSource::Inferred, 1, After::First)
    );
    assert!(
        all[0].timing.ttft_tool_call.is_some(),
        "the scripted answer called a tool"
    );
    assert_eq!(
        (two.session, two.index, two.after),
        (one.session, 2, After::Tool)
    );
    let gap = two.gap.unwrap();
    assert!(
        gap >= Duration::from_millis(300) && gap < Duration::from_secs(5),
        "{gap:?}"
    );
    assert_eq!(
        (three.session, three.index, three.after),
        (one.session, 3, After::User)
    );
    // Turn 2 resent turn 1's whole message: that share of its prompt was sent before.
    let share = two.theoretical_share().unwrap();
    assert!(share > 0.2 && share < 0.9, "{share}");
    assert_ne!(other.session, one.session);
    assert_eq!(other.index, 1);

    // The figures on /metrics and /matrix?view=sessions.
    let metrics = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    for line in [
        r#"tokentap_session_turns_total{model="m",after="first",gap="none"} 2"#,
        r#"tokentap_session_turns_total{model="m",after="tool",gap="1s"} 1"#,
        r#"tokentap_session_turns_total{model="m",after="user",gap="1s"} 1"#,
        "tokentap_sessions 2",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no `{line}` in:\n{metrics}"
        );
    }
    let view = get(&format!(
        "http://{}/matrix?view=sessions",
        server.admin_addr
    ))
    .await;
    assert_eq!(view.status, 200, "{}", view.text());
    let doc: serde_json::Value = serde_json::from_slice(&view.bytes()).unwrap();
    assert_eq!(doc["schema"], "tokentap.sessions/v1");
    let model = &doc["models"][0];
    assert_eq!(model["model"], "m");
    assert_eq!(model["sessions"], 2);
    assert_eq!(model["turns"]["tool"], 1);
    assert_eq!(model["max_turn"], 3);
    assert_eq!(model["gap_bins"][0]["tool_turns"], 1);
    let md = get(&format!(
        "http://{}/matrix?view=sessions&format=md",
        server.admin_addr
    ))
    .await;
    assert!(
        md.text()
            .contains("Sessions: 2 · turns after a user: 1 · after a tool: 1"),
        "{}",
        md.text()
    );
}

#[tokio::test]
async fn sessions_off_make_no_turns() {
    let upstream = ScriptedUpstream::start(answer).await;
    let (server, records) = proxy(
        &format!("http://{}", upstream.addr),
        "[sessions]\nenabled = false\n",
    )
    .await;
    chat(
        &server,
        &[("x-session-id", "a")],
        &messages_body(&["hi"], ""),
    )
    .await;
    assert_eq!(records.wait_for(1).await[0].turn, None);
    let view = get(&format!(
        "http://{}/matrix?view=sessions",
        server.admin_addr
    ))
    .await;
    assert_eq!(view.status, 404);
}
