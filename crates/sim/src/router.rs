//! The simulator's routes: one table listing every path once with the methods it answers and
//! what answers it, and [`handle`], which looks a request up in it.
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::Body;

use super::body::SimBody;
use super::engine_info;
use super::error_body::Reply;
use super::generation;
use super::metrics;
use super::request::Api;
use super::state::AppState;

/// What answers a route.
#[derive(Debug, Clone, Copy)]
enum Handler {
    Generation(Api),
    Models,
    ServerInfo,
    ModelInfo,
    Health,
    Version,
    Metrics,
    AbortRequest,
    Tokenize,
}

/// The methods a route answers, and what the others get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Methods {
    Get,
    Post,
    /// GET or POST; other methods get 404, as the health routes always have here.
    GetOrPost,
    /// GET only; other methods get 404, as `/version` always has here.
    GetElseNotFound,
}

impl Methods {
    fn allows(self, method: &Method) -> bool {
        match self {
            Methods::Get | Methods::GetElseNotFound => method == Method::GET,
            Methods::Post => method == Method::POST,
            Methods::GetOrPost => method == Method::GET || method == Method::POST,
        }
    }

    /// The answer to a method the route does not serve.
    fn refusal(self) -> Reply {
        match self {
            Methods::Get | Methods::Post => Reply::method_not_allowed(),
            Methods::GetOrPost | Methods::GetElseNotFound => Reply::not_found(),
        }
    }
}

/// One row of the table: the paths (aliases included) answered the same way.
struct Route {
    paths: &'static [&'static str],
    methods: Methods,
    handler: Handler,
}

const ROUTES: &[Route] = &[
    Route {
        paths: &["/v1/chat/completions"],
        methods: Methods::Post,
        handler: Handler::Generation(Api::Chat),
    },
    Route {
        paths: &["/v1/completions"],
        methods: Methods::Post,
        handler: Handler::Generation(Api::Completion),
    },
    Route {
        paths: &["/generate"],
        methods: Methods::Post,
        handler: Handler::Generation(Api::Generate),
    },
    Route {
        paths: &["/v1/messages"],
        methods: Methods::Post,
        handler: Handler::Generation(Api::Messages),
    },
    Route {
        paths: &["/v1/responses"],
        methods: Methods::Post,
        handler: Handler::Generation(Api::Responses),
    },
    Route {
        paths: &["/v1/models"],
        methods: Methods::Get,
        handler: Handler::Models,
    },
    Route {
        // sglang's names of it (its current one, then the older), as tokentap asks them.
        paths: tokentap_base::engine::Engine::SGLANG
            .spec()
            .describe
            .server_info,
        methods: Methods::Get,
        handler: Handler::ServerInfo,
    },
    Route {
        paths: &["/model_info", "/get_model_info"],
        methods: Methods::Get,
        handler: Handler::ModelInfo,
    },
    Route {
        paths: &["/health", "/health_generate", "/ping"],
        methods: Methods::GetOrPost,
        handler: Handler::Health,
    },
    Route {
        paths: &["/version"],
        methods: Methods::GetElseNotFound,
        handler: Handler::Version,
    },
    Route {
        paths: &["/metrics"],
        methods: Methods::Get,
        handler: Handler::Metrics,
    },
    Route {
        paths: &["/abort_request"],
        methods: Methods::Post,
        handler: Handler::AbortRequest,
    },
    Route {
        paths: &["/tokenize", "/v1/tokenize"],
        methods: Methods::Post,
        handler: Handler::Tokenize,
    },
];

/// Route one request. Never fails: every problem becomes the status and body the server sends.
pub async fn handle<B>(
    state: Arc<AppState>,
    request: Request<B>,
) -> Result<Response<SimBody>, Infallible>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let path = request.uri().path();
    let Some(route) = ROUTES.iter().find(|route| route.paths.contains(&path)) else {
        return Ok(Reply::not_found().into());
    };
    if !route.methods.allows(request.method()) {
        return Ok(route.methods.refusal().into());
    }
    let reply = match route.handler {
        Handler::Generation(api) => return Ok(generation::handle(&state, request, api).await),
        Handler::Models => engine_info::models(&state),
        Handler::ServerInfo if state.options.hang_server_info => {
            // Until the client gives up: its connection closing drops this future.
            std::future::pending::<()>().await;
            engine_info::server_info(&state)
        }
        Handler::ServerInfo => engine_info::server_info(&state),
        Handler::ModelInfo => engine_info::model_info(&state),
        Handler::Health => Reply {
            status: StatusCode::OK,
            content_type: "text/plain; charset=utf-8",
            body: String::new(),
        },
        Handler::Version => engine_info::version(&state),
        Handler::Metrics => metrics::metrics(&state),
        Handler::AbortRequest => engine_info::abort_request(&state, request).await,
        Handler::Tokenize => engine_info::tokenize(&state, request).await,
    };
    Ok(reply.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_is_listed_once() {
        let mut paths: Vec<&str> = ROUTES
            .iter()
            .flat_map(|r| r.paths.iter().copied())
            .collect();
        let listed = paths.len();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), listed, "a path appears in two rows");
    }
}
