//! The one duration syntax of the framework: `500ms`, `30s`, `5m`, `1h`, `7d`. The
//! macros (at compile time), the command line and the connection URLs all
//! parse durations here (the macro crate compiles this same file), so that a
//! value means the same everywhere. A unit is always required: a bare `60`
//! could mean seconds or milliseconds, and guessing wrong is a silent bug.

use std::time::Duration;

/// Parses a whole number followed by `ms`, `s`, `m`, `h` or `d`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let Ok(n) = number.parse::<u64>() else {
        return Err(format!("`{text}` is not a duration; write a whole number and a unit, e.g. 500ms, 30s, 5m or 1h"));
    };
    let too_long = || format!("`{text}` is too long a duration");
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs).ok_or_else(too_long),
        "h" => n.checked_mul(3600).map(Duration::from_secs).ok_or_else(too_long),
        "d" => n.checked_mul(86_400).map(Duration::from_secs).ok_or_else(too_long),
        "" => Err(format!("`{text}` has no unit; write {n}s for seconds (or {n}ms, {n}m, {n}h)")),
        other => Err(format!("unknown unit `{other}` in `{text}`; use ms, s, m, h or d")),
    }
}

/// Writes `ms` milliseconds in the largest unit that holds it whole:
/// `5m`, `90s`, `1500ms` (what [`parse_duration`] reads back).
#[allow(dead_code)] // the macro crate compiles this file and formats nothing
pub(crate) fn format_duration(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(86_400_000, "d"), (3_600_000, "h"), (60_000, "m"), (1_000, "s")];
    for (size, unit) in UNITS {
        if ms >= size && ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_reads_back() {
        for (ms, text) in [(300_000, "5m"), (90_000, "90s"), (1_500, "1500ms"), (86_400_000, "1d"), (0, "0ms")] {
            assert_eq!(format_duration(ms), text);
            assert_eq!(parse_duration(text), Ok(Duration::from_millis(ms)));
        }
    }

    #[test]
    fn one_syntax_with_a_unit_always() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration(" 5m "), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("60").unwrap_err().contains("write 60s"));
        assert!(parse_duration("5 parsecs").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("").unwrap_err().contains("not a duration"));
        assert!(parse_duration("1.5s").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("18446744073709551615h").unwrap_err().contains("too long"));
    }
}
