//! Timing handed back (`metering.server_timing`, docs/metrics.md "Timing handed back"): off by
//! default and then byte-transparent even when a client asks; on request, a non-streamed
//! answer carries a `Server-Timing` header, a stream a trailer where the client takes trailers
//! (HTTP/2; HTTP/1.1 with `TE: trailers`) and a final SSE comment where it does not, each tied
//! to the record by the request id; and the OpenAI Python SDK parses the same answers with it
//! on as off. Real sockets on loopback, a scripted upstream, bounded waits.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokentap::meter::identity::{ConfigFacts, FingerprintId};

use crate::common::{data, proxy, send, wait_ms, Received, Records, Script, ScriptedUpstream};

const ASK: &str = "x-tokentap-timing";
const ID: &str = "x-chatcmpl-7";
const CONTENT: &str = "Hello from the scripted upstream";

/// A chat completion as an OpenAI-compatible server streams it: a role chunk, three tokens a
/// little apart (so the stream has a TBT), the finish chunk, `[DONE]`.
fn stream_script() -> Script {
    let chunk = |delta: &str, finish: &str| {
        data(&format!(
            r#"{{"id":"{ID}","object":"chat.completion.chunk","created":1767225600,"model":"m","choices":[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{finish}}}]}}"#
        ))
    };
    let words: Vec<&str> = CONTENT.split_inclusive(' ').collect();
    let mut steps = vec![chunk(r#"{"role":"assistant","content":""}"#, "null")];
    for word in &words {
        steps.push(wait_ms(15));
        steps.push(chunk(&format!(r#"{{"content":"{word}"}}"#), "null"));
    }
    steps.push(chunk("{}", r#""stop""#));
    steps.push(crate::common::Step::Send(Bytes::from_static(
        b"data: [DONE]\n\n",
    )));
    Script::sse(steps)
}

fn whole_answer() -> String {
    format!(
        r#"{{"id":"{ID}","object":"chat.completion","created":1767225600,"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"{CONTENT}"}},"logprobs":null,"finish_reason":"stop"}}],"usage":{{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}}}}"#
    )
}

fn script_for(request: &Received) -> Script {
    let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap_or_default();
    if body["stream"] == true {
        stream_script()
    } else {
        let mut script = Script::json(200, &whole_answer());
        script
            .headers
            .push(("content-length", whole_answer().len().to_string()));
        script
    }
}

const STREAMED: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true}"#;
const WHOLE: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;

/// One answer as a raw HTTP client reads it: the head, the body's bytes, the trailers.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Vec<u8>,
    trailers: Option<HeaderMap>,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

async fn read(response: Response<Incoming>) -> Answer {
    let (head, mut body) = response.into_parts();
    let mut bytes = Vec::new();
    let mut trailers = None;
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(30), body.frame())
        .await
        .expect("a frame within 30 s")
    {
        let frame = frame.expect("the body reads to its end");
        match frame.into_data() {
            Ok(data) => bytes.extend_from_slice(&data),
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
    }
    Answer {
        status: head.status.as_u16(),
        headers: head.headers,
        body: bytes,
        trailers,
    }
}

fn chat(uri: &str, body: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut request = Request::post(uri)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    for (name, value) in headers {
        request.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    request
}

/// POSTs over a fresh HTTP/1.1 connection with hyper's own client connection (which reads
/// trailers).
async fn http1(addr: SocketAddr, body: &str, headers: &[(&str, &str)]) -> Answer {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = chat("/v1/chat/completions", body, headers);
    request
        .headers_mut()
        .insert(http::header::HOST, addr.to_string().parse().unwrap());
    let response = tokio::time::timeout(Duration::from_secs(30), sender.send_request(request))
        .await
        .expect("a head within 30 s")
        .unwrap();
    read(response).await
}

/// POSTs over a fresh HTTP/2 connection, cleartext with prior knowledge (the proxy serves h2c).
async fn http2(addr: SocketAddr, body: &str, headers: &[(&str, &str)]) -> Answer {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = chat(&format!("http://{addr}/v1/chat/completions"), body, headers);
    let response = tokio::time::timeout(Duration::from_secs(30), sender.send_request(request))
        .await
        .expect("a head within 30 s")
        .unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    read(response).await
}

/// A `Server-Timing` value's entries: each metric's name and its parameters (`dur`, `desc`),
/// quoted-strings unescaped (W3C Server Timing over RFC 9110's list and quoted-string syntax).
fn parse_server_timing(value: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut entries = Vec::new();
    let mut chars = value.chars().peekable();
    let token = |chars: &mut std::iter::Peekable<std::str::Chars>| {
        let mut out = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c) {
                out.push(c);
                chars.next();
            } else {
                break;
            }
        }
        out
    };
    let skip_ws = |chars: &mut std::iter::Peekable<std::str::Chars>| {
        while chars.peek().is_some_and(|c| *c == ' ' || *c == '\t') {
            chars.next();
        }
    };
    loop {
        skip_ws(&mut chars);
        let name = token(&mut chars);
        assert!(!name.is_empty(), "a metric name in {value:?}");
        let mut params = Vec::new();
        loop {
            skip_ws(&mut chars);
            match chars.peek() {
                Some(';') => {
                    chars.next();
                    skip_ws(&mut chars);
                    let key = token(&mut chars);
                    skip_ws(&mut chars);
                    assert_eq!(chars.next(), Some('='), "{key}= in {value:?}");
                    skip_ws(&mut chars);
                    let param = if chars.peek() == Some(&'"') {
                        chars.next();
                        let mut out = String::new();
                        loop {
                            match chars.next() {
                                Some('"') => break,
                                Some('\\') => out.push(chars.next().expect("an escaped char")),
                                Some(c) => {
                                    assert!(c == ' ' || c == '\t' || c.is_ascii_graphic());
                                    out.push(c);
                                }
                                None => panic!("an unclosed quoted-string in {value:?}"),
                            }
                        }
                        out
                    } else {
                        token(&mut chars)
                    };
                    params.push((key, param));
                }
                Some(',') => {
                    chars.next();
                    break;
                }
                None => break,
                Some(c) => panic!("unexpected {c:?} in {value:?}"),
            }
        }
        entries.push((name, params));
        if chars.peek().is_none() {
            return entries;
        }
    }
}

/// The entries of `value` as name → (dur in ms, desc).
fn metrics(value: &str) -> std::collections::BTreeMap<String, (Option<f64>, Option<String>)> {
    parse_server_timing(value)
        .into_iter()
        .map(|(name, params)| {
            let dur = params
                .iter()
                .find(|(k, _)| k == "dur")
                .map(|(_, v)| v.parse::<f64>().unwrap());
            let desc = params
                .iter()
                .find(|(k, _)| k == "desc")
                .map(|(_, v)| v.clone());
            (name, (dur, desc))
        })
        .collect()
}

fn server_timing_header(headers: &HeaderMap) -> Option<String> {
    headers
        .get("server-timing")
        .map(|v| v.to_str().unwrap().to_string())
}

/// The upstream reads as one configuration: its fingerprint goes into the timing.
fn fingerprinted(server: &tokentap::app::serve::ProxyServer) -> String {
    let id = FingerprintId::from_hash(0x00ab_cdef_1234);
    server.proxy.router.default_upstream().identity.observe(
        id,
        ConfigFacts::default(),
        SystemTime::now(),
    );
    id.to_string()
}

async fn record_with_id(records: &Records, n: usize, id: &str) {
    let all = records.wait_for(n).await;
    assert!(
        all.iter().any(|r| r.request_id.as_deref() == Some(id)),
        "a record with request id {id}: {:?}",
        all.iter().map(|r| &r.request_id).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_by_default_the_answers_are_the_upstream_s_bytes_even_when_a_client_asks() {
    let upstream = ScriptedUpstream::start(script_for).await;
    let (server, _records) = proxy(&upstream.url(), "").await;
    let addr = server.proxy_addr;
    let url = format!("http://{addr}/v1/chat/completions");
    let expected_stream = stream_script().bytes();
    let expected_whole = whole_answer().into_bytes();
    for ask in [&[][..], &[(ASK, "1"), ("te", "trailers")][..]] {
        for (body, expected) in [(STREAMED, &expected_stream), (WHOLE, &expected_whole)] {
            let legacy = send(chat(&url, body, ask)).await;
            assert_eq!(legacy.bytes(), *expected, "{ask:?} {body}");
            assert_eq!(server_timing_header(&legacy.headers), None);
            for answer in [http1(addr, body, ask).await, http2(addr, body, ask).await] {
                assert_eq!(answer.status, 200);
                assert_eq!(answer.body, *expected, "{ask:?} {body}: {}", answer.text());
                assert_eq!(server_timing_header(&answer.headers), None);
                assert!(
                    !answer.headers.contains_key("trailer"),
                    "{:?}",
                    answer.headers
                );
                assert!(
                    answer
                        .trailers
                        .as_ref()
                        .is_none_or(|t| !t.contains_key("server-timing")),
                    "{:?}",
                    answer.trailers
                );
            }
        }
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_request_a_non_streamed_answer_carries_a_server_timing_header_tied_to_its_record() {
    let upstream = ScriptedUpstream::start(script_for).await;
    let (server, records) = proxy(
        &upstream.url(),
        "[metering]\nserver_timing = \"on_request\"\n",
    )
    .await;
    let fingerprint = fingerprinted(&server);
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);

    let answer = send(chat(
        &url,
        WHOLE,
        &[(ASK, "yes"), ("x-request-id", "client-req-1")],
    ))
    .await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.bytes(),
        whole_answer().into_bytes(),
        "the body untouched"
    );
    assert_eq!(
        answer.headers["content-length"],
        whole_answer().len().to_string().as_str()
    );
    let value = server_timing_header(&answer.headers).expect("a Server-Timing header");
    let figures = metrics(&value);
    let (ttft, _) = figures["ttft"];
    let (total, _) = figures["total"];
    let (ttft, total) = (ttft.unwrap(), total.unwrap());
    assert!(0.0 < ttft && ttft <= total && total < 30_000.0, "{value}");
    assert!(
        !figures.contains_key("tbt"),
        "a whole answer has no TBT: {value}"
    );
    assert!(
        !figures.contains_key("queue"),
        "no queue time where the engine reports none: {value}"
    );
    assert_eq!(figures["cell"].1.as_deref(), Some("8K x 1"), "{value}");
    assert_eq!(
        figures["fingerprint"].1.as_deref(),
        Some(fingerprint.as_str())
    );
    assert_eq!(figures["request"].1.as_deref(), Some("client-req-1"));
    record_with_id(&records, 1, "client-req-1").await;

    // Not asked: nothing added.
    let plain = send(chat(&url, WHOLE, &[("x-request-id", "client-req-2")])).await;
    assert_eq!(plain.bytes(), whole_answer().into_bytes());
    assert_eq!(server_timing_header(&plain.headers), None);

    // A hostile id is not repeated: tokentap's own ties the timing to the record.
    let hostile = send(chat(
        &url,
        WHOLE,
        &[(ASK, ""), ("x-request-id", "two words \"quoted\"")],
    ))
    .await;
    let value = server_timing_header(&hostile.headers).expect("a Server-Timing header");
    let own = metrics(&value)["request"].1.clone().unwrap();
    assert!(own.starts_with("tt-") && own.len() <= 128, "{value}");
    record_with_id(&records, 3, &own).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_streamed_answer_over_the_parse_limit_passes_as_it_is_without_the_header() {
    let big = format!(
        r#"{{"id":"{ID}","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"{}"}},"finish_reason":"stop"}}]}}"#,
        "x".repeat(20_000)
    );
    let answer_bytes = big.clone();
    let upstream = ScriptedUpstream::start(move |_| {
        let mut script = Script::json(200, &answer_bytes);
        // Sent in pieces: the limit is crossed part-way.
        script.steps = answer_bytes
            .as_bytes()
            .chunks(3000)
            .map(|piece| crate::common::Step::Send(Bytes::copy_from_slice(piece)))
            .collect();
        script
    })
    .await;
    let (server, records) = proxy(
        &upstream.url(),
        "[metering]\nserver_timing = \"always\"\nmax_parse_bytes = 8192\n",
    )
    .await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    let answer = send(chat(&url, WHOLE, &[("x-request-id", "big-1")])).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.bytes(), big.into_bytes());
    assert_eq!(server_timing_header(&answer.headers), None);
    record_with_id(&records, 1, "big-1").await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_request_a_stream_ends_with_a_comment_over_http1_and_a_trailer_where_trailers_are_taken()
{
    let upstream = ScriptedUpstream::start(script_for).await;
    let (server, records) = proxy(
        &upstream.url(),
        "[metering]\nserver_timing = \"on_request\"\n",
    )
    .await;
    let fingerprint = fingerprinted(&server);
    let addr = server.proxy_addr;
    let expected = stream_script().bytes();
    let check = |value: &str, id: &str| {
        let figures = metrics(value);
        for name in ["ttft", "tbt", "total"] {
            let dur = figures[name]
                .0
                .unwrap_or_else(|| panic!("{name} in {value}"));
            assert!(0.0 < dur && dur < 30_000.0, "{value}");
        }
        assert!(figures["ttft"].0 <= figures["total"].0, "{value}");
        assert_eq!(figures["cell"].1.as_deref(), Some("8K x 1"), "{value}");
        assert_eq!(
            figures["fingerprint"].1.as_deref(),
            Some(fingerprint.as_str())
        );
        assert_eq!(figures["request"].1.as_deref(), Some(id), "{value}");
    };

    // HTTP/1.1 without `TE: trailers`: a final SSE comment after the upstream's last bytes.
    let answer = http1(addr, STREAMED, &[(ASK, "1"), ("x-request-id", "s-comment")]).await;
    assert_eq!(answer.status, 200);
    assert!(!answer.headers.contains_key("content-length"));
    let (before, comment) = answer.body.split_at(expected.len().min(answer.body.len()));
    assert_eq!(before, &expected[..], "{}", answer.text());
    let comment = std::str::from_utf8(comment).unwrap();
    let value = comment
        .strip_prefix(": server-timing ")
        .and_then(|rest| rest.strip_suffix("\n\n"))
        .unwrap_or_else(|| panic!("a final comment line: {comment:?}"));
    assert!(!value.contains('\n'), "{comment:?}");
    check(value, "s-comment");
    assert_eq!(server_timing_header(&answer.headers), None);

    // HTTP/1.1 with `TE: trailers`: a chunked answer announcing its trailer, the bytes untouched.
    let answer = http1(
        addr,
        STREAMED,
        &[(ASK, "1"), ("te", "trailers"), ("x-request-id", "s-h1")],
    )
    .await;
    assert_eq!(answer.body, expected, "{}", answer.text());
    assert_eq!(answer.headers["trailer"], "server-timing");
    assert_eq!(answer.headers["transfer-encoding"], "chunked");
    let trailers = answer.trailers.expect("trailers");
    check(trailers["server-timing"].to_str().unwrap(), "s-h1");

    // HTTP/2 (h2c): always trailers.
    let answer = http2(addr, STREAMED, &[(ASK, "1"), ("x-request-id", "s-h2")]).await;
    assert_eq!(answer.body, expected, "{}", answer.text());
    let trailers = answer.trailers.expect("trailers");
    check(trailers["server-timing"].to_str().unwrap(), "s-h2");

    for id in ["s-comment", "s-h1", "s-h2"] {
        record_with_id(&records, 3, id).await;
    }
    server.shutdown().await;
}

/// An upstream that sends its own `Server-Timing` (a header on whole answers, an announced
/// trailer on streams) keeps every entry: tokentap's is added beside it, and `Trailer` names
/// the field once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_s_own_server_timing_is_kept_and_tokentap_s_is_added_beside_it() {
    let upstream = ScriptedUpstream::start(|request: &Received| {
        let mut script = script_for(request);
        if script.headers[0].1.starts_with("text/event-stream") {
            script
                .headers
                .push(("trailer", "Server-Timing".to_string()));
            script.steps.push(crate::common::Step::Trailers(vec![(
                "server-timing",
                "engine;dur=7",
            )]));
        } else {
            script
                .headers
                .push(("server-timing", "engine;dur=12".to_string()));
        }
        script
    })
    .await;
    let (server, _records) = proxy(
        &upstream.url(),
        "[metering]\nserver_timing = \"on_request\"\n",
    )
    .await;
    let addr = server.proxy_addr;
    // The upstream's entry first, tokentap's beside it, in the field lines of `fields`.
    let engine_then_ours = |fields: &HeaderMap| {
        let names: Vec<String> = fields
            .get_all("server-timing")
            .iter()
            .flat_map(|v| parse_server_timing(v.to_str().unwrap()))
            .map(|(name, _)| name)
            .collect();
        assert_eq!(
            names.first().map(String::as_str),
            Some("engine"),
            "{names:?}"
        );
        assert!(names.iter().any(|n| n == "ttft"), "{names:?}");
    };

    // A whole answer: the upstream's header, then tokentap's.
    let answer = http1(addr, WHOLE, &[(ASK, "1")]).await;
    engine_then_ours(&answer.headers);

    // A stream over HTTP/1.1 with `TE: trailers`: one `Trailer` naming the field, both entries.
    let answer = http1(addr, STREAMED, &[(ASK, "1"), ("te", "trailers")]).await;
    let announced: Vec<_> = answer.headers.get_all("trailer").iter().collect();
    assert_eq!(announced.len(), 1, "{announced:?}");
    assert!(announced[0]
        .to_str()
        .unwrap()
        .eq_ignore_ascii_case("server-timing"));
    engine_then_ours(&answer.trailers.expect("trailers"));

    // HTTP/2 (the client says it takes trailers, so the HTTP/1 upstream sends its own): the
    // same trailer.
    let answer = http2(addr, STREAMED, &[(ASK, "1"), ("te", "trailers")]).await;
    engine_then_ours(&answer.trailers.expect("trailers"));
    server.shutdown().await;
}

/// The OpenAI Python SDK, a real client: `scripts/test` installs it (PyPI `openai`) when missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_sdk_parses_the_same_answers_with_timing_on_as_off() {
    let python = std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("python3"))
                .find(|candidate| candidate.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "`python3` is not on the PATH: it comes with Debian's `python3` package; \
                 scripts/test (the README's test command) installs it when missing"
            )
        });
    let import = std::process::Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .unwrap();
    assert!(
        import.status.success(),
        "{} cannot import openai ({}): the OpenAI Python SDK comes from PyPI (`openai`); \
         scripts/test (the README's test command) installs it when missing",
        python.display(),
        String::from_utf8_lossy(&import.stderr).trim()
    );
    let upstream = ScriptedUpstream::start(script_for).await;
    let (on, _) = proxy(&upstream.url(), "[metering]\nserver_timing = \"always\"\n").await;
    let (off, _) = proxy(&upstream.url(), "").await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/openai_timing.py");
    let mut child = std::process::Command::new(&python)
        .arg(script)
        .arg(format!("http://{}", on.proxy_addr))
        .arg(format!("http://{}", off.proxy_addr))
        .args([ID, CONTENT])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: its output is a line or two, well within a pipe's buffer while it runs.
    if crate::common::wait::child_exit_async(&mut child, Duration::from_secs(60))
        .await
        .is_none()
    {
        let _ = child.kill();
        panic!("openai_timing.py did not finish within 60 s");
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "openai_timing.py: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let value = seen["on"]["server_timing"].as_str().unwrap();
    let figures = metrics(value);
    assert!(figures["total"].0.is_some(), "{value}");
    assert!(
        figures["request"]
            .1
            .as_deref()
            .is_some_and(|id| !id.is_empty()),
        "{value}"
    );
    on.shutdown().await;
    off.shutdown().await;
}
