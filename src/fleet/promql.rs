//! A small PromQL HTTP client: instant queries (`POST /api/v1/query`) against Prometheus or
//! anything that speaks its HTTP API (Thanos Query, Mimir, VictoriaMetrics), bounded in time
//! and in the size of the answer, with errors that name the URL (without userinfo) and the
//! server's own error text.

use crate::base::error::error_chain;
use std::collections::BTreeMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderName, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Longest wait for one answer, head and body together (Prometheus' own default query
/// timeout is 2 minutes; a matrix asks a dozen small questions).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer read: a matrix query returns one series per cell.
pub const MAX_BODY: usize = 16 << 20;

/// Characters a form value keeps as they are (`application/x-www-form-urlencoded`).
const FORM: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Why a query got no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum PromError {
    #[error("{url} is not a usable Prometheus URL: {reason}")]
    Url { url: String, reason: String },
    #[error("{url}: cannot set up TLS: {reason}")]
    Tls { url: String, reason: String },
    #[error("--header {header:?}: write it as `Name: value`")]
    Header { header: String },
    #[error("{url}: {message}")]
    Connect { url: String, message: String },
    #[error("{url}: no answer within {after:?}")]
    Timeout { url: String, after: Duration },
    #[error("{url}: the answer is larger than {limit} bytes")]
    TooLarge { url: String, limit: usize },
    #[error("{url} answered HTTP {status}: {error_type}: {error} (query: {query})")]
    Query {
        url: String,
        status: u16,
        error_type: String,
        error: String,
        query: String,
    },
    #[error(
        "{url} answered HTTP {status} with something that is not a Prometheus API answer: {body}"
    )]
    NotPrometheus {
        url: String,
        status: u16,
        body: String,
    },
}

/// One series of an instant vector: its labels and its value (finite or not, as sent).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, empty when absent (PromQL's reading).
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

/// A client of one PromQL endpoint.
pub struct PromClient {
    /// Base URL with any path prefix (`http://mimir:8080/prometheus`), no trailing slash.
    base: String,
    /// `base` as messages show it.
    shown: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    timeout: Duration,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl std::fmt::Debug for PromClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromClient")
            .field("base", &self.shown)
            .finish_non_exhaustive()
    }
}

impl PromClient {
    /// A client of `url` (`http://` or `https://`; a bare `host:port` means `http://`), sending
    /// `bearer` as a bearer token and `headers` (`Name: value`, e.g. Mimir's `X-Scope-OrgID:
    /// tenant`) with every query.
    pub fn new(
        url: &str,
        bearer: Option<&str>,
        headers: &[String],
        timeout: Duration,
    ) -> Result<PromClient, PromError> {
        let trimmed = url.trim().trim_end_matches('/');
        let base = if trimmed.contains("://") {
            trimmed.to_owned()
        } else {
            format!("http://{trimmed}")
        };
        let shown = crate::net::redact::redact_url(&base);
        let uri: http::Uri = base
            .parse()
            .map_err(|e: http::uri::InvalidUri| PromError::Url {
                url: shown.clone(),
                reason: e.to_string(),
            })?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(PromError::Url {
                url: shown,
                reason: "expected http://host:port or https://host:port".to_owned(),
            });
        }
        let mut parsed = Vec::new();
        if let Some(token) = bearer {
            let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                PromError::Header {
                    header: "Authorization: Bearer <token>".to_owned(),
                }
            })?;
            parsed.push((header::AUTHORIZATION, value));
        }
        for line in headers {
            let bad = || PromError::Header {
                header: line.clone(),
            };
            let (name, value) = line.split_once(':').ok_or_else(bad)?;
            let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| bad())?;
            let value = HeaderValue::from_str(value.trim()).map_err(|_| bad())?;
            parsed.push((name, value));
        }
        let tls = crate::net::tls::client_config(None, None).map_err(|e| PromError::Tls {
            url: shown.clone(),
            reason: e.to_string(),
        })?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(PromClient {
            base,
            shown,
            headers: parsed,
            timeout,
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// The base URL as messages show it.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Evaluates `query` at `time` (Unix seconds): the instant vector's series. A scalar answer
    /// is one series without labels; a string or matrix answer is an error.
    pub async fn query(&self, query: &str, time: f64) -> Result<Vec<Sample>, PromError> {
        let url = format!("{}/api/v1/query", self.base);
        let shown = format!("{}/api/v1/query", self.shown);
        let form = format!("query={}&time={time:.3}", utf8_percent_encode(query, FORM));
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(&url)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::ACCEPT, "application/json");
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        let request = builder
            .body(Full::new(Bytes::from(form)))
            .map_err(|e| PromError::Url {
                url: shown.clone(),
                reason: e.to_string(),
            })?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| PromError::Connect {
                    url: shown.clone(),
                    message: error_chain(&e),
                })?;
            let status = response.status().as_u16();
            let mut body = response.into_body();
            let mut bytes = BytesMut::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| PromError::Connect {
                    url: shown.clone(),
                    message: format!("the answer broke off: {}", error_chain(&e)),
                })?;
                if let Ok(data) = frame.into_data() {
                    if bytes.len() + data.len() > MAX_BODY {
                        return Err(PromError::TooLarge {
                            url: shown.clone(),
                            limit: MAX_BODY,
                        });
                    }
                    bytes.extend_from_slice(&data);
                }
            }
            Ok((status, bytes.freeze()))
        };
        let (status, body) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| PromError::Timeout {
                url: shown.clone(),
                after: self.timeout,
            })??;
        parse_answer(&shown, status, &body, query)
    }
}

/// Reads an API answer: `{"status":"success","data":{"resultType":"vector","result":[…]}}`
/// or `{"status":"error","errorType":…,"error":…}`.
pub fn parse_answer(
    url: &str,
    status: u16,
    body: &[u8],
    query: &str,
) -> Result<Vec<Sample>, PromError> {
    let not_prometheus = || {
        let text = String::from_utf8_lossy(body);
        let mut shown: String = text.chars().take(200).collect();
        if text.chars().count() > 200 {
            shown.push('…');
        }
        PromError::NotPrometheus {
            url: url.to_owned(),
            status,
            body: shown,
        }
    };
    let json: serde_json::Value = serde_json::from_slice(body).map_err(|_| not_prometheus())?;
    let text = |key: &str| json.get(key).and_then(|v| v.as_str()).unwrap_or_default();
    match text("status") {
        "success" => {}
        "error" => {
            return Err(PromError::Query {
                url: url.to_owned(),
                status,
                error_type: text("errorType").to_owned(),
                error: text("error").to_owned(),
                query: query.to_owned(),
            })
        }
        _ => return Err(not_prometheus()),
    }
    let data = json.get("data").ok_or_else(not_prometheus)?;
    let value_of = |point: &serde_json::Value| -> Option<f64> {
        point.get(1)?.as_str()?.trim().parse::<f64>().ok()
    };
    match data.get("resultType").and_then(|t| t.as_str()) {
        Some("vector") => {
            let series = data
                .get("result")
                .and_then(|r| r.as_array())
                .ok_or_else(not_prometheus)?;
            Ok(series
                .iter()
                .filter_map(|s| {
                    let labels = s
                        .get("metric")
                        .and_then(|m| m.as_object())
                        .map(|m| {
                            m.iter()
                                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                                .collect()
                        })
                        .unwrap_or_default();
                    Some(Sample {
                        labels,
                        value: value_of(s.get("value")?)?,
                    })
                })
                .collect())
        }
        Some("scalar") => Ok(data
            .get("result")
            .and_then(value_of)
            .map(|value| Sample {
                labels: BTreeMap::new(),
                value,
            })
            .into_iter()
            .collect()),
        _ => Err(not_prometheus()),
    }
}

/// A PromQL string literal of `value` (double quotes, `\` and `"` escaped, newlines written
/// as `\n`).
pub fn quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_scalar_and_error_answers() {
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"context_bucket":"8K","concurrency_bucket":"4"},"value":[1.5,"12.25"]},
            {"metric":{"context_bucket":"16K"},"value":[1.5,"NaN"]},
            {"metric":{},"value":[1.5,"+Inf"]}]}}"#;
        let samples = parse_answer("u", 200, body, "q").unwrap();
        assert_eq!(samples.len(), 3);
        assert_eq!(samples[0].label("context_bucket"), "8K");
        assert_eq!(samples[0].label("missing"), "");
        assert_eq!(samples[0].value, 12.25);
        assert!(samples[1].value.is_nan());
        assert!(samples[2].value.is_infinite());

        let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[1.5,"3"]}}"#;
        assert_eq!(parse_answer("u", 200, scalar, "q").unwrap()[0].value, 3.0);

        let error = br#"{"status":"error","errorType":"bad_data","error":"parse error at char 4"}"#;
        let message = parse_answer("http://p/api/v1/query", 400, error, "sum(")
            .unwrap_err()
            .to_string();
        assert!(message.contains("http://p/api/v1/query"), "{message}");
        assert!(
            message.contains("bad_data: parse error at char 4"),
            "{message}"
        );
        assert!(message.contains("sum("), "{message}");

        for junk in [
            &b"<html>nope</html>"[..],
            b"{}",
            b"{\"status\":\"success\"}",
            b"",
        ] {
            assert!(matches!(
                parse_answer("u", 502, junk, "q"),
                Err(PromError::NotPrometheus { .. })
            ));
        }
    }

    /// A loopback server that answers every connection with `answer` (or never, when `None`).
    async fn server(answer: Option<&'static str>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = socket.read(&mut buf).await;
                    match answer {
                        Some(text) => {
                            let _ = socket.write_all(text.as_bytes()).await;
                        }
                        None => tokio::time::sleep(Duration::from_secs(30)).await,
                    }
                });
            }
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn failures_name_the_url() {
        let timeout = Duration::from_millis(300);
        // Nothing listens.
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let client = PromClient::new(&format!("http://{closed}"), None, &[], timeout).unwrap();
        let err = client.query("up", 0.0).await.unwrap_err();
        assert!(matches!(err, PromError::Connect { .. }), "{err}");
        assert!(
            err.to_string()
                .contains(&format!("http://{closed}/api/v1/query")),
            "{err}"
        );
        // Something that is not Prometheus.
        let html = server(Some(
            "HTTP/1.1 502 Bad Gateway\r\ncontent-length: 13\r\nconnection: close\r\n\r\n<html>x</html",
        ))
        .await;
        let err = PromClient::new(&html, None, &[], timeout)
            .unwrap()
            .query("up", 0.0)
            .await
            .unwrap_err();
        assert!(
            matches!(err, PromError::NotPrometheus { status: 502, .. }),
            "{err}"
        );
        // A server that never answers: the deadline.
        let silent = server(None).await;
        let err = PromClient::new(&silent, None, &[], timeout)
            .unwrap()
            .query("up", 0.0)
            .await
            .unwrap_err();
        assert!(matches!(err, PromError::Timeout { .. }), "{err}");
        assert!(err.to_string().contains(&silent), "{err}");
    }

    #[test]
    fn quoting_escapes_what_promql_reads() {
        assert_eq!(quote("a/b"), "\"a/b\"");
        assert_eq!(quote("x\"y\\z\n"), "\"x\\\"y\\\\z\\n\"");
    }

    #[test]
    fn bad_urls_and_headers_are_named() {
        let timeout = Duration::from_secs(1);
        assert!(PromClient::new("ftp://x", None, &[], timeout).is_err());
        assert!(PromClient::new("http://bad host", None, &[], timeout).is_err());
        let err = PromClient::new("127.0.0.1:9090", None, &["no colon".into()], timeout)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no colon"), "{err}");
        let client = PromClient::new(
            "http://user:secret@127.0.0.1:9090/prom/",
            Some("t"),
            &["X-Scope-OrgID: tenant".into()],
            timeout,
        )
        .unwrap();
        assert!(!client.shown().contains("secret"), "{}", client.shown());
        assert!(client.shown().ends_with("/prom"), "{}", client.shown());
    }
}
