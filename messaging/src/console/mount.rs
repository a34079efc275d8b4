//! Where the console is mounted: the part of the original path before the
//! console's own, which its links and redirects start with.

use axum::extract::{OriginalUri, Request};

/// The mount point of `request` (empty at the root; `/ops` when nested there).
pub(super) fn base_of(request: &Request) -> String {
    let inner = request.uri().path();
    let original = request.extensions().get::<OriginalUri>().map_or(inner, |o| o.0.path());
    base(original, inner)
}

/// The mount point, from the original path and the console's own part of it.
pub(super) fn base(original: &str, inner: &str) -> String {
    let inner = if inner == "/" { "" } else { inner };
    original.strip_suffix(inner).unwrap_or("").trim_end_matches('/').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_is_what_the_mount_adds_to_the_path() {
        assert_eq!(base("/", "/"), "");
        assert_eq!(base("/queues/q", "/queues/q"), "");
        assert_eq!(base("/ops/queues/q", "/queues/q"), "/ops");
        assert_eq!(base("/ops/", "/"), "/ops");
        assert_eq!(base("/ops", "/"), "/ops");
    }
}
