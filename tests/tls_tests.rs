//! TLS on both sides with rustls: the data listener (HTTP/1.1 and HTTP/2 over ALPN), client
//! certificates when `tls.client_ca` is set, and https:// upstreams trusting a private CA.
//! Certificates are made per test run with rcgen; everything stays on 127.0.0.1.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::pki::Pki;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokentap::app::serve::ProxyServer;
use tokentap::config::ConfigLoader;
use tokio::net::TcpListener;

async fn start(config_text: &str) -> ProxyServer {
    proxy_from_config(&format!("{config_text}\n[store]\ndata_dir = \"\"\n"))
        .await
        .0
}

/// One HTTPS request over a fresh TLS connection with `config`; returns (version, body).
async fn https_post(
    addr: std::net::SocketAddr,
    config: rustls::ClientConfig,
    body: &str,
) -> Result<(http::Version, String), String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let request = http::Request::post(format!("https://{addr}/v1/chat/completions"))
        .header("host", "127.0.0.1")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = if h2 {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?
    };
    let version = response.version();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((version, String::from_utf8_lossy(&bytes).into_owned()))
}

/// Sends a plain HTTP request to `addr` and returns every byte that comes back until the
/// server closes the connection (a reset after its last byte counts as closing).
async fn plain_http_answer(addr: std::net::SocketAddr) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket
        .write_all(b"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .expect("the TLS listener closes a plain HTTP connection");
    answer
}

const STREAM: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n";
const BODY: &str = r#"{"model":"m","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#;

#[tokio::test]
async fn tls_listener_serves_http1_and_http2_over_alpn() {
    let pki = Pki::new("listener");
    let upstream = ScriptedUpstream::start(|_| {
        Script::sse(vec![Step::Send(Bytes::from_static(STREAM.as_bytes()))])
    })
    .await;
    let server = start(&format!(
        "[upstream]\nurl = \"{}\"\n[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        upstream.url(),
        pki.path("server.pem"),
        pki.path("server.key")
    ))
    .await;
    let (version, body) = https_post(
        server.proxy_addr,
        pki.client_config(false, &[b"http/1.1"]),
        BODY,
    )
    .await
    .unwrap();
    assert_eq!((version, body.as_str()), (http::Version::HTTP_11, STREAM));
    let (version, body) = https_post(server.proxy_addr, pki.client_config(false, &[b"h2"]), BODY)
        .await
        .unwrap();
    assert_eq!((version, body.as_str()), (http::Version::HTTP_2, STREAM));
    // Plain HTTP to a TLS listener gets nowhere, and the listener keeps serving.
    let forwarded = upstream.requests().len();
    let answer = plain_http_answer(server.proxy_addr).await;
    // rustls reads `GET ` as a TLS record of an unknown content type and answers with one
    // fatal decode_error alert (record type 21, TLS 1.2 framing, 2 bytes: level 2, code 50);
    // no HTTP answer, and nothing reaches the upstream.
    assert_eq!(
        answer,
        [21, 3, 3, 0, 2, 2, 50],
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(upstream.requests().len(), forwarded);
    assert!(
        https_post(server.proxy_addr, pki.client_config(false, &[]), BODY)
            .await
            .is_ok()
    );
    server.shutdown().await;
}

#[tokio::test]
async fn client_certificates_are_required_when_a_client_ca_is_set() {
    let pki = Pki::new("mtls");
    let upstream = ScriptedUpstream::start(|_| {
        Script::sse(vec![Step::Send(Bytes::from_static(STREAM.as_bytes()))])
    })
    .await;
    let server = start(&format!(
        "[upstream]\nurl = \"{}\"\n[tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n",
        upstream.url(),
        pki.path("server.pem"),
        pki.path("server.key"),
        pki.path("ca.pem")
    ))
    .await;
    assert!(
        https_post(server.proxy_addr, pki.client_config(false, &[]), BODY)
            .await
            .is_err(),
        "no client certificate must be refused"
    );
    let (_, body) = https_post(server.proxy_addr, pki.client_config(true, &[]), BODY)
        .await
        .unwrap();
    assert_eq!(body, STREAM);
    server.shutdown().await;
}

/// An https:// upstream: the scripted upstream's TCP behind a rustls acceptor.
async fn tls_upstream(pki: &Pki) -> std::net::SocketAddr {
    let config = tokentap::net::tls::server_config(
        Path::new(&pki.path("server.pem")),
        Path::new(&pki.path("server.key")),
        None,
        &[b"http/1.1"],
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(|_request| async {
                    let mut response =
                        http::Response::new(Full::new(Bytes::from_static(STREAM.as_bytes())));
                    response
                        .headers_mut()
                        .insert("content-type", "text/event-stream".parse().unwrap());
                    Ok::<_, std::convert::Infallible>(response)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn https_upstreams_are_verified_against_the_configured_ca() {
    let pki = Pki::new("upstream");
    let upstream = tls_upstream(&pki).await;
    let server = start(&format!(
        "[upstream]\nurl = \"https://{upstream}\"\ntls_ca = \"{}\"\n",
        pki.path("ca.pem")
    ))
    .await;
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        BODY,
    )
    .await;
    assert_eq!((response.status, response.text().as_str()), (200, STREAM));
    server.shutdown().await;

    // Without the CA (public web roots only) the upstream is refused, and the 502 says why.
    let server = start(&format!("[upstream]\nurl = \"https://{upstream}\"\n")).await;
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        BODY,
    )
    .await;
    assert_eq!(response.status, 502);
    assert!(
        response.text().to_lowercase().contains("certificate"),
        "{}",
        response.text()
    );
    server.shutdown().await;
}

#[tokio::test]
async fn tls_misconfiguration_is_a_clear_start_up_error() {
    let config = ConfigLoader::new()
        .text(
            "[tls]\ncert = \"/nonexistent/cert.pem\"\nkey = \"/nonexistent/key.pem\"\n[store]\ndata_dir = \"\"\n",
            "t.toml",
        )
        .unwrap()
        .load()
        .unwrap();
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let error = format!(
        "{:#}",
        ProxyServer::start_on(config, proxy, admin)
            .await
            .unwrap_err()
    );
    assert!(
        error.contains("/nonexistent/cert.pem") && error.contains("tls"),
        "{error}"
    );
}
