//! "Did you mean …?": the edit distance between names (URL options and time
//! zones here; attribute keys in the macro crate, which compiles this file in).

/// Levenshtein's distance between two names.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            current.push((previous[j] + cost).min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// The candidate nearest `name` within two edits, if any (the first of equals).
pub(crate) fn nearest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances_and_the_nearest_name() {
        assert_eq!(edit_distance("migrate", "migrate"), 0);
        assert_eq!(edit_distance("migrat", "migrate"), 1);
        assert_eq!(edit_distance("retension", "retention"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(nearest("retension", ["poll", "retention", "schema"]), Some("retention"));
        assert_eq!(nearest("pol", ["poll", "pool"]), Some("poll"), "the first of equals");
        assert_eq!(nearest("sslmode", ["poll", "retention", "schema"]), None);
    }
}
