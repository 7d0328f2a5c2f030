//! The fail phase: tokentap's own answer when the upstream gave none (it could not be reached
//! or asked, was busy or too slow, or the client's body stalled on the way), and, for a metered
//! request, its record published with that status and no tokens.

use http::Response;

use super::start::MeteredRequest;
use crate::proxy::body::ResponseBody;
use crate::proxy::error::ProxyError;

/// The answer for `error`; a metered request's record says it.
pub(crate) fn fail(error: ProxyError, metered: Option<MeteredRequest>) -> Response<ResponseBody> {
    if let Some(mut m) = metered {
        m.meter.set_status(error.status().as_u16());
        m.meter
            .finish(error.outcome(), Default::default(), 0, false);
    }
    error.into_response()
}
