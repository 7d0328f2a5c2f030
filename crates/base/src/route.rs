//! The generation routes tokentap meters: which request paths they are, their label values,
//! and what each route's dialect allows. The proxy, the meter, the exporters and the simulator
//! all name a route with this one type.

/// The metered routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `/v1/chat/completions`
    ChatCompletions,
    /// `/v1/completions`
    Completions,
    /// sglang native `/generate`
    Generate,
    /// Anthropic-style `/v1/messages`
    Messages,
    /// OpenAI Responses `/v1/responses`
    Responses,
}

impl Route {
    /// Every metered route, in label order.
    pub const ALL: [Route; 5] = [
        Route::ChatCompletions,
        Route::Completions,
        Route::Generate,
        Route::Messages,
        Route::Responses,
    ];

    /// The metered route for a request path, if any.
    pub fn from_path(path: &str) -> Option<Route> {
        match path.trim_end_matches('/') {
            "/v1/chat/completions" => Some(Route::ChatCompletions),
            "/v1/completions" => Some(Route::Completions),
            "/generate" => Some(Route::Generate),
            "/v1/messages" => Some(Route::Messages),
            "/v1/responses" => Some(Route::Responses),
            _ => None,
        }
    }

    /// The Prometheus label value (a static string: no allocation when labelling).
    pub fn label(self) -> &'static str {
        match self {
            Route::ChatCompletions => "chat_completions",
            Route::Completions => "completions",
            Route::Generate => "generate",
            Route::Messages => "messages",
            Route::Responses => "responses",
        }
    }

    /// Whether `stream_options` usage injection applies to this route.
    pub fn accepts_stream_options(self) -> bool {
        matches!(self, Route::ChatCompletions | Route::Completions)
    }
}
