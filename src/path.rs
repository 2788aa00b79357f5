//! Dot segments in a client's path (`/v1/a/../b`), resolved before the path is routed
//! and joined to the base URL, so no path can step outside the upstream's base path
//! (`/api/v1` + `/../admin`), where the proxy's own key would go with it in sidecar mode.

use http::uri::{PathAndQuery, Uri};

#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// More `..` than there are segments to climb out of: nginx refuses these too.
    #[error("the path climbs above its root with `..`")]
    AboveRoot,
    /// A `.` or `..` behind an encoded separator (`..%2f`, `%2e%2e%5c`): an upstream that
    /// decodes it would climb where the proxy could not see.
    #[error("the path hides a dot segment behind an encoded separator")]
    Hidden,
}

/// The URI with its path's dot segments resolved (RFC 3986 section 5.2.4, `%2e` counted
/// as a dot), `Ok(None)` when there are none, which is the fast, common case.
pub fn normalise(uri: &Uri) -> Result<Option<Uri>, PathError> {
    let path = uri.path();
    // A dot segment starts after a slash; a hidden one needs a `%` or a backslash. Paths
    // with dots elsewhere (`/deployments/gpt-4.1/...`) take the fast way.
    if !path.contains("/.") && !path.contains(['%', '\\']) {
        return Ok(None);
    }
    let mut kept: Vec<&str> = Vec::new();
    let mut changed = false;
    let mut segments = path.strip_prefix('/').unwrap_or(path).split('/').peekable();
    while let Some(segment) = segments.next() {
        if hides_dot_segment(segment) {
            return Err(PathError::Hidden);
        }
        let dots = dots(segment);
        match dots {
            0 => kept.push(segment),
            1 => {}
            _ => {
                kept.pop().ok_or(PathError::AboveRoot)?;
            }
        }
        changed |= dots > 0;
        // `/a/..` is `/`, and `/a/.` is `/a/`: the trailing slash stays.
        if dots > 0 && segments.peek().is_none() {
            kept.push("");
        }
    }
    if !changed {
        return Ok(None);
    }
    let mut normal = String::with_capacity(path.len());
    for segment in kept {
        normal.push('/');
        normal.push_str(segment);
    }
    if normal.is_empty() {
        normal.push('/');
    }
    if let Some(query) = uri.query() {
        normal.push('?');
        normal.push_str(query);
    }
    let mut parts = uri.clone().into_parts();
    // Made of the parts of a valid path and query, so it parses.
    parts.path_and_query = PathAndQuery::try_from(normal).ok();
    Ok(Uri::from_parts(parts).ok())
}

/// 1 for a `.` segment, 2 for `..` (either dot may be written `%2e`), 0 otherwise.
fn dots(segment: &str) -> usize {
    let mut rest = segment.as_bytes();
    let mut dots = 0;
    while !rest.is_empty() {
        rest = match rest {
            [b'.', tail @ ..] => tail,
            [b'%', b'2', b'e' | b'E', tail @ ..] => tail,
            _ => return 0,
        };
        dots += 1;
    }
    if dots <= 2 {
        dots
    } else {
        0
    }
}

/// Whether a segment holds a dot segment once encoded slashes and backslashes are read
/// as separators (which some servers do).
fn hides_dot_segment(segment: &str) -> bool {
    if !segment.contains('%') && !segment.contains('\\') {
        return false;
    }
    let decoded = segment
        .to_ascii_lowercase()
        .replace("%2e", ".")
        .replace("%2f", "/")
        .replace("%5c", "/")
        .replace('\\', "/");
    decoded.contains('/') && decoded.split('/').any(|part| part == "." || part == "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normal(uri: &str) -> Result<String, PathError> {
        let uri: Uri = uri.parse().unwrap();
        Ok(normalise(&uri)?.map_or_else(|| uri.to_string(), |u| u.to_string()))
    }

    #[test]
    fn paths_without_dot_segments_are_left_alone() {
        for uri in [
            "/v1/models",
            "/v1/files/a.b.c?x=../y",
            "/v1/.well-known",
            "/",
            "/v1/...",
        ] {
            assert_eq!(normal(uri).unwrap(), uri);
        }
    }

    #[test]
    fn dot_segments_are_resolved() {
        assert_eq!(normal("/v1/m/x/../../y?q=1").unwrap(), "/v1/y?q=1");
        assert_eq!(normal("/v1/./models").unwrap(), "/v1/models");
        assert_eq!(normal("/v1/models/%2E%2e/files").unwrap(), "/v1/files");
        assert_eq!(normal("/v1/a/..").unwrap(), "/v1/");
        assert_eq!(normal("/v1/a/.").unwrap(), "/v1/a/");
        assert_eq!(normal("/v1/..").unwrap(), "/");
        assert_eq!(
            normal("http://h/v1/x/../models").unwrap(),
            "http://h/v1/models"
        );
    }

    #[test]
    fn climbing_above_the_root_is_refused() {
        for uri in ["/..", "/v1/../../admin", "/v1/%2e%2e/.%2E/admin"] {
            assert!(matches!(normal(uri), Err(PathError::AboveRoot)), "{uri}");
        }
    }

    #[test]
    fn dot_segments_behind_encoded_separators_are_refused() {
        for uri in [
            "/v1/..%2f..%2fadmin",
            "/v1/x/%2e%2e%5cadmin",
            "/v1/a%2F.%2Fb",
        ] {
            assert!(matches!(normal(uri), Err(PathError::Hidden)), "{uri}");
        }
        assert_eq!(normal("/v1/a%2fb/..").unwrap(), "/v1/");
    }
}
