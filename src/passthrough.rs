//! Every route but the chat one: the request streams to the upstream and the answer
//! streams back, neither held in memory.

use http::{Request, Response};
use http_body_util::BodyExt;

use crate::app::App;
use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::limits::ClientBody;
use crate::server::RequestBody;

pub async fn forward(
    app: &App,
    request: Request<ClientBody<RequestBody>>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (parts, body) = request.into_parts();
    let body = body.map_err(Into::into).boxed_unsync();
    app.metrics.upstream_attempt();
    app.upstream
        .send(parts.method, &parts.uri, &parts.headers, body)
        .await
}
