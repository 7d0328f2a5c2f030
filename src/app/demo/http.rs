//! The demo's plain HTTP client: one exchange (a request sent, its whole answer read, within a
//! time limit) that the mixed requests, the steady phase's warming request and the simulator's
//! load reads all go through.

use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// A pooled HTTP/1 client to loopback.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A POST of a JSON body, or `None` when `uri` is not one.
pub fn post_json(uri: &str, body: String) -> Option<Request<Full<Bytes>>> {
    Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .ok()
}

/// A GET, or `None` when `uri` is not one.
pub fn get(uri: &str) -> Option<Request<Full<Bytes>>> {
    Request::get(uri).body(Full::new(Bytes::new())).ok()
}

/// Sends `request` and reads its whole answer within `limit`: the status and the body, or
/// `None` when it could not be sent, its body failed, or it took longer.
pub async fn exchange(
    client: &HttpClient,
    request: Request<Full<Bytes>>,
    limit: Duration,
) -> Option<(StatusCode, Bytes)> {
    let answer = async {
        let response = client.request(request).await.ok()?;
        let status = response.status();
        let body = response.into_body().collect().await.ok()?.to_bytes();
        Some((status, body))
    };
    tokio::time::timeout(limit, answer).await.ok().flatten()
}

/// [`exchange`] answered with a success status.
pub async fn succeeds(client: &HttpClient, request: Request<Full<Bytes>>, limit: Duration) -> bool {
    exchange(client, request, limit)
        .await
        .is_some_and(|(status, _)| status.is_success())
}
