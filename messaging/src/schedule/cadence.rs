//! When a schedule ticks: a cron expression in a time zone, or a fixed
//! interval. One file for the runtime and the `#[messaging::schedule]`
//! macro (which includes it with `#[path]`), so that an expression the
//! compiler accepts is read the same way when the service runs.
//!
//! # The dialect
//!
//! Vixie cron: five fields, `minute hour day-of-month month day-of-week`, or
//! six with `second` first; `*`, lists (`1,15`), ranges (`1-5`), steps
//! (`*/10`, `0-30/5`), month and weekday names (`JAN`, `MON-FRI`), the
//! nicknames `@yearly` `@monthly` `@weekly` `@daily` `@hourly`, and croner's
//! extensions `L` (last day of the month, last weekday `5L`), `W` (nearest
//! weekday) and `#` (`1#2`, the second Monday). Day-of-week counts from
//! Sunday: 0 and 7 are Sunday. When both day fields are restricted, a day
//! matching either one fires (Vixie's rule). Refused, with the reason: the
//! Quartz and AWS dialects (seven fields with a year, `?`), whose weekday
//! numbers differ (Quartz counts 1–7 from Sunday).
//!
//! # Time zones and daylight saving time
//!
//! A cron expression matches the wall clock of its zone (UTC by default).
//! Each matching local time fires once: a local time that occurs twice (the
//! clocks go back) fires at its first occurrence; local times that do not
//! occur (the clocks go forward) fire once, at the first instant after the
//! gap. A tick is keyed by its UTC instant, in milliseconds.
//!
//! An interval (`every = "5m"`) is elapsed time, aligned to the Unix epoch:
//! ticks at every multiple of the period since 1970-01-01T00:00:00Z, so that
//! every process computes the same ticks without talking to the others.

use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::Timestamp;

/// When a schedule ticks.
#[derive(Debug, Clone)]
pub(crate) enum Cadence {
    /// A cron expression, matched against the wall clock of `zone`.
    Cron {
        /// The parsed expression.
        cron: Box<Cron>,
        /// The zone whose wall clock it matches.
        zone: TimeZone,
    },
    /// Every `period_ms` milliseconds since the Unix epoch.
    Every {
        /// The period, at least one millisecond.
        period_ms: i64,
    },
}

/// The field names of a five-field expression, then of a six-field one.
const FIVE: [&str; 5] = ["minute", "hour", "day-of-month", "month", "day-of-week"];
const SIX: [&str; 6] = ["second", "minute", "hour", "day-of-month", "month", "day-of-week"];

/// What a field takes, for error messages.
fn takes(field: &str) -> &'static str {
    match field {
        "second" | "minute" => "0-59",
        "hour" => "0-23",
        "day-of-month" => "1-31, or L (last day) and W (nearest weekday)",
        "month" => "1-12 or JAN-DEC",
        _ => "0-7 (0 and 7 are Sunday) or SUN-SAT, or L (last) and # (nth)",
    }
}

/// The parser of the dialect: seconds optional, no year field.
fn parser() -> CronParser {
    CronParser::builder().seconds(Seconds::Optional).year(Year::Disallowed).build()
}

/// Reads a cron expression of the dialect, or says what is wrong with it and
/// how to write it.
pub(crate) fn parse_cron(text: &str) -> Result<Cron, String> {
    let trimmed = text.trim();
    let example = "e.g. \"*/5 * * * *\" (every five minutes) or \"0 30 9 * * MON-FRI\" (9:30:00 on weekdays)";
    if trimmed.is_empty() {
        return Err(format!(
            "the cron expression is empty: write 5 fields (minute hour day-of-month month day-of-week), or 6 with \
             seconds first, {example}"
        ));
    }
    if trimmed.contains('?') {
        return Err("`?` belongs to the Quartz and AWS cron dialects; this one is Vixie cron: write `*` (and note \
                    that day-of-week here counts 0-7 from Sunday, where Quartz counts 1-7)"
            .to_owned());
    }
    if let Some(nickname) = trimmed.strip_prefix('@') {
        const NICKNAMES: [&str; 7] = ["yearly", "annually", "monthly", "weekly", "daily", "midnight", "hourly"];
        if !NICKNAMES.contains(&nickname.to_ascii_lowercase().as_str()) {
            return Err(format!("unknown nickname `{trimmed}`: use one of @{}", NICKNAMES.join(", @")));
        }
        return parser().parse(trimmed).map_err(|e| format!("`{trimmed}`: {e}"));
    }
    let fields: Vec<&str> = trimmed.split_whitespace().collect();
    let names: &[&str] = match fields.len() {
        5 => &FIVE,
        6 => &SIX,
        7 => {
            return Err(format!(
                "7 fields is the Quartz dialect, which ends with a year; this one has 5 fields (minute hour \
                 day-of-month month day-of-week) or 6 with seconds first: drop the year, {example}"
            ))
        }
        n => {
            return Err(format!(
                "{n} field{}: write 5 (minute hour day-of-month month day-of-week), or 6 with seconds first, {example}",
                if n == 1 { "" } else { "s" }
            ))
        }
    };
    parser().parse(trimmed).map_err(|whole| {
        // Name the field at fault: the first that fails alone, the others `*`.
        let faulty = (0..fields.len()).find_map(|i| {
            let alone: Vec<&str> = (0..fields.len()).map(|j| if i == j { fields[i] } else { "*" }).collect();
            parser().parse(&alone.join(" ")).err().map(|e| (i, e))
        });
        match faulty {
            Some((i, e)) => format!(
                "the {} field `{}` is invalid ({}); it takes {}",
                names[i],
                fields[i],
                reason(&e),
                takes(names[i])
            ),
            None => format!("`{trimmed}` is invalid: {}", reason(&whole)),
        }
    })
}

/// croner's message without its category prefix, in lower case.
fn reason(e: &croner::errors::CronError) -> String {
    let text = e.to_string();
    let text = text.split_once(": ").map_or(text.as_str(), |(_, rest)| rest).trim_end_matches('.');
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text.to_owned(),
    }
}

/// Finds an IANA time zone by name (`Europe/Oslo`, `UTC`).
pub(crate) fn parse_zone(name: &str) -> Result<TimeZone, String> {
    if name.trim().is_empty() {
        return Err("the time zone is empty: name an IANA zone, e.g. \"Europe/Oslo\" or \"UTC\"".to_owned());
    }
    TimeZone::get(name).map_err(|_| {
        // The nearest zone name, if one is near (names are case-insensitive).
        let lower = name.to_ascii_lowercase();
        let hint = jiff::tz::db()
            .available()
            .map(|n| n.as_str().to_owned())
            .map(|n| (crate::hint::edit_distance(&lower, &n.to_ascii_lowercase()), n))
            .filter(|(d, _)| *d <= 2)
            .min()
            .map(|(_, n)| format!("; did you mean \"{n}\"?"))
            .unwrap_or_default();
        format!(
            "unknown time zone \"{name}\": name an IANA zone, e.g. \"Europe/Oslo\", \"America/New_York\" or \
             \"UTC\"{hint}"
        )
    })
}

/// A reference instant for compile-time checks: 2026-01-01T00:00:00Z.
pub(crate) const REFERENCE_MS: i64 = 1_767_225_600_000;

impl Cadence {
    /// A cron expression in `zone` (UTC when `None`), checked: it must fire.
    pub(crate) fn cron(expression: &str, zone: Option<&str>) -> Result<Cadence, String> {
        let cron = parse_cron(expression)?;
        let zone = match zone {
            Some(name) => parse_zone(name)?,
            None => TimeZone::UTC,
        };
        let cadence = Cadence::Cron { cron: Box::new(cron), zone };
        if cadence.next_after(REFERENCE_MS).is_none() {
            return Err(format!("`{}` never fires: no date matches it", expression.trim()));
        }
        Ok(cadence)
    }

    /// Every `period_ms` milliseconds.
    pub(crate) fn every(period_ms: u64) -> Result<Cadence, String> {
        match i64::try_from(period_ms) {
            Ok(period_ms) if period_ms > 0 => Ok(Cadence::Every { period_ms }),
            _ => Err("the interval must be longer than zero, e.g. \"30s\" or \"5m\"".to_owned()),
        }
    }

    /// The first tick strictly after `after_ms` (milliseconds since the
    /// Unix epoch); `None` when there is none (a pattern whose dates never
    /// come, or past the year 9999).
    pub(crate) fn next_after(&self, after_ms: i64) -> Option<i64> {
        match self {
            Cadence::Every { period_ms } => after_ms.div_euclid(*period_ms).checked_add(1)?.checked_mul(*period_ms),
            Cadence::Cron { cron, zone } => {
                let after = after_ms.div_euclid(1000);
                let mut civil = Timestamp::from_second(after).ok()?.to_zoned(zone.clone()).datetime();
                // Local times after `civil` whose instant is not: the second
                // pass of a repeated hour, which fired on the first one.
                for _ in 0..MAX_STEPS {
                    civil = next_civil(cron, civil)?;
                    let at = instant(zone, civil)?;
                    if at > after {
                        return at.checked_mul(1000);
                    }
                }
                None
            }
        }
    }

    /// The last tick at or before `at_ms`.
    pub(crate) fn last_at_or_before(&self, at_ms: i64) -> Option<i64> {
        match self {
            Cadence::Every { period_ms } => at_ms.div_euclid(*period_ms).checked_mul(*period_ms),
            Cadence::Cron { cron, zone } => {
                let at = at_ms.div_euclid(1000);
                let mut civil = Timestamp::from_second(at).ok()?.to_zoned(zone.clone()).datetime();
                let mut found = None;
                let mut inclusive = true;
                for _ in 0..MAX_STEPS {
                    civil = previous_civil(cron, civil, inclusive)?;
                    inclusive = false;
                    let instant = instant(zone, civil)?;
                    if instant <= at {
                        found = Some(instant * 1000);
                        break;
                    }
                }
                // Walking back by wall clock misses, after a repeated hour,
                // ticks of its first pass that lie later on the wall clock
                // than `at` does: walk forward from what was found.
                let mut last = found?;
                while let Some(next) = self.next_after(last) {
                    if next > at_ms {
                        break;
                    }
                    last = next;
                }
                Some(last)
            }
        }
    }

    /// Up to `n` ticks after `after_ms`, in order.
    pub(crate) fn upcoming(&self, after_ms: i64, n: usize) -> Vec<i64> {
        let mut ticks = Vec::with_capacity(n);
        let mut at = after_ms;
        while ticks.len() < n {
            match self.next_after(at) {
                Some(next) => {
                    ticks.push(next);
                    at = next;
                }
                None => break,
            }
        }
        ticks
    }

    /// The tick `at_ms` as an RFC 3339 time in the cadence's zone (UTC for
    /// an interval): `2026-03-29T03:00:00+02:00`.
    pub(crate) fn local(&self, at_ms: i64) -> String {
        let zone = match self {
            Cadence::Cron { zone, .. } => zone.clone(),
            Cadence::Every { .. } => TimeZone::UTC,
        };
        match Timestamp::from_millisecond(at_ms) {
            Ok(t) => {
                let zoned = t.to_zoned(zone);
                let offset = zoned.offset();
                format!("{}{}", zoned.datetime().strftime("%Y-%m-%dT%H:%M:%S%.f"), rfc3339_offset(offset))
            }
            Err(_) => at_ms.to_string(),
        }
    }
}

/// `Z` for UTC, else `+HH:MM`.
fn rfc3339_offset(offset: jiff::tz::Offset) -> String {
    let seconds = offset.seconds();
    if seconds == 0 {
        return "Z".to_owned();
    }
    let sign = if seconds < 0 { '-' } else { '+' };
    let minutes = seconds.unsigned_abs() / 60;
    format!("{sign}{:02}:{:02}", minutes / 60, minutes % 60)
}

/// How many wall-clock candidates one search looks at before giving up
/// (a repeated hour of a pattern that fires every second holds 3,600).
const MAX_STEPS: usize = 10_000;

/// The next wall-clock time after `civil` that the pattern matches: croner
/// walks civil time as if it were UTC, where every local time occurs once.
fn next_civil(cron: &Cron, civil: DateTime) -> Option<DateTime> {
    let zoned = civil.to_zoned(TimeZone::UTC).ok()?;
    cron.find_next_occurrence(&zoned, false).ok().map(|z| z.datetime())
}

/// The wall-clock time at (`inclusive`) or before `civil` that the pattern matches.
fn previous_civil(cron: &Cron, civil: DateTime, inclusive: bool) -> Option<DateTime> {
    let zoned = civil.to_zoned(TimeZone::UTC).ok()?;
    cron.find_previous_occurrence(&zoned, inclusive).ok().map(|z| z.datetime())
}

/// The instant (seconds since the epoch) a local time fires at: itself when
/// it occurs once; its first occurrence when it occurs twice; the end of the
/// gap when it does not occur.
fn instant(zone: &TimeZone, civil: DateTime) -> Option<i64> {
    let civil = civil.round(jiff::Unit::Second).ok()?;
    match zone.to_ambiguous_timestamp(civil).offset() {
        AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(civil).ok().map(Timestamp::as_second),
        // `before` is the offset before the clocks went back: the first pass.
        AmbiguousOffset::Fold { before, .. } => before.to_timestamp(civil).ok().map(Timestamp::as_second),
        AmbiguousOffset::Gap { after, .. } => {
            // Read with the offset after the gap, the local time is an
            // instant before the transition; the transition follows it.
            let early = after.to_timestamp(civil).ok()?;
            zone.following(early).next().map(|t| t.timestamp().as_second())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> i64 {
        text.parse::<Timestamp>().unwrap().as_millisecond()
    }

    fn local(cadence: &Cadence, at: i64) -> String {
        cadence.local(at)
    }

    fn ticks(cadence: &Cadence, from: &str, n: usize) -> Vec<String> {
        cadence.upcoming(ms(from), n).into_iter().map(|t| local(cadence, t)).collect()
    }

    #[test]
    fn five_and_six_fields_nicknames_and_names() {
        let every_five = Cadence::cron("*/5 * * * *", None).unwrap();
        assert_eq!(
            ticks(&every_five, "2026-05-01T10:02:30Z", 3),
            ["2026-05-01T10:05:00Z", "2026-05-01T10:10:00Z", "2026-05-01T10:15:00Z"]
        );
        let with_seconds = Cadence::cron("*/20 * * * * *", None).unwrap();
        assert_eq!(
            ticks(&with_seconds, "2026-05-01T10:00:00Z", 3),
            ["2026-05-01T10:00:20Z", "2026-05-01T10:00:40Z", "2026-05-01T10:01:00Z"]
        );
        let weekdays = Cadence::cron("0 30 9 * * MON-FRI", None).unwrap();
        // 2026-05-01 is a Friday.
        assert_eq!(ticks(&weekdays, "2026-05-01T12:00:00Z", 2), ["2026-05-04T09:30:00Z", "2026-05-05T09:30:00Z"]);
        let daily = Cadence::cron("@daily", None).unwrap();
        assert_eq!(ticks(&daily, "2026-05-01T12:00:00Z", 1), ["2026-05-02T00:00:00Z"]);
        let sunday = Cadence::cron("0 12 * * 7", None).unwrap();
        assert_eq!(ticks(&sunday, "2026-05-01T12:00:00Z", 1), ["2026-05-03T12:00:00Z"]);
    }

    #[test]
    fn other_dialects_and_mistakes_are_refused_with_the_reason() {
        let cases = [
            ("", "is empty"),
            ("* * * *", "4 fields: write 5"),
            ("0 0 12 * * MON 2026", "Quartz dialect, which ends with a year"),
            ("0 0 12 ? * 2", "`?` belongs to the Quartz and AWS"),
            ("61 * * * *", "the minute field `61` is invalid (number out of bounds); it takes 0-59"),
            ("* 24 * * *", "the hour field `24` is invalid"),
            ("0 0 0 0 * *", "the day-of-month field `0`"),
            ("* * * 13 *", "the month field `13`"),
            ("* * * * FUNDAY", "the day-of-week field `FUNDAY`"),
            ("*/0 * * * *", "step cannot be zero"),
            ("@reboot", "unknown nickname `@reboot`"),
            ("0 0 30 2 *", "never fires"),
        ];
        for (expression, expected) in cases {
            let error = Cadence::cron(expression, None).err().unwrap_or_default();
            assert!(error.contains(expected), "{expression:?}: {error}");
        }
        let error = Cadence::cron("0 * * * *", Some("Europe/Olso")).err().unwrap_or_default();
        assert!(error.contains("unknown time zone \"Europe/Olso\""), "{error}");
        assert!(error.contains("did you mean \"Europe/Oslo\""), "{error}");
        let error = Cadence::cron("0 * * * *", Some("Mars/Olympus_Mons")).err().unwrap_or_default();
        assert!(error.contains("unknown time zone") && !error.contains("did you mean"), "{error}");
        assert!(Cadence::cron("0 * * * *", Some("europe/oslo")).is_ok(), "zone names are case-insensitive");
    }

    #[test]
    fn a_skipped_local_time_fires_once_at_the_end_of_the_gap() {
        // Europe/Oslo went from 02:00 to 03:00 on 2026-03-29.
        let daily = Cadence::cron("30 2 * * *", Some("Europe/Oslo")).unwrap();
        assert_eq!(
            ticks(&daily, "2026-03-27T12:00:00Z", 4),
            [
                "2026-03-28T02:30:00+01:00",
                "2026-03-29T03:00:00+02:00",
                "2026-03-30T02:30:00+02:00",
                "2026-03-31T02:30:00+02:00"
            ]
        );
        // An interval pattern: 02:00 and 02:30 do not occur; they fire
        // once, with 03:00, at the end of the gap.
        let half_hourly = Cadence::cron("*/30 * * * *", Some("Europe/Oslo")).unwrap();
        assert_eq!(
            ticks(&half_hourly, "2026-03-29T00:10:00+01:00", 4),
            [
                "2026-03-29T00:30:00+01:00",
                "2026-03-29T01:00:00+01:00",
                "2026-03-29T01:30:00+01:00",
                "2026-03-29T03:00:00+02:00"
            ]
        );
        let quarter_past = Cadence::cron("15,45 * * * *", Some("Europe/Oslo")).unwrap();
        assert_eq!(
            ticks(&quarter_past, "2026-03-29T01:30:00+01:00", 3),
            ["2026-03-29T01:45:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T03:15:00+02:00"]
        );
    }

    #[test]
    fn a_repeated_local_time_fires_once_at_its_first_occurrence() {
        // Europe/Oslo went from 03:00 back to 02:00 on 2026-10-25.
        let daily = Cadence::cron("30 2 * * *", Some("Europe/Oslo")).unwrap();
        assert_eq!(
            ticks(&daily, "2026-10-24T12:00:00Z", 3),
            ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00", "2026-10-27T02:30:00+01:00"]
        );
        let half_hourly = Cadence::cron("*/30 * * * *", Some("Europe/Oslo")).unwrap();
        assert_eq!(
            ticks(&half_hourly, "2026-10-25T01:10:00+02:00", 5),
            [
                "2026-10-25T01:30:00+02:00",
                "2026-10-25T02:00:00+02:00",
                "2026-10-25T02:30:00+02:00",
                "2026-10-25T03:00:00+01:00",
                "2026-10-25T03:30:00+01:00"
            ]
        );
        // From inside the second pass, the next tick is after it.
        assert_eq!(ticks(&half_hourly, "2026-10-25T02:10:00+01:00", 1), ["2026-10-25T03:00:00+01:00"]);
        // And the last tick at that moment is the first pass's 02:30,
        // which is later on the wall clock than 02:10.
        let last = half_hourly.last_at_or_before(ms("2026-10-25T02:10:00+01:00")).unwrap();
        assert_eq!(local(&half_hourly, last), "2026-10-25T02:30:00+02:00");
    }

    #[test]
    fn the_last_tick_at_or_before_a_time() {
        let hourly = Cadence::cron("0 * * * *", None).unwrap();
        assert_eq!(
            local(&hourly, hourly.last_at_or_before(ms("2026-05-01T10:00:00Z")).unwrap()),
            "2026-05-01T10:00:00Z"
        );
        assert_eq!(
            local(&hourly, hourly.last_at_or_before(ms("2026-05-01T10:59:59.999Z")).unwrap()),
            "2026-05-01T10:00:00Z"
        );
        let gap = Cadence::cron("30 2 * * *", Some("Europe/Oslo")).unwrap();
        let last = gap.last_at_or_before(ms("2026-03-29T03:10:00+02:00")).unwrap();
        assert_eq!(local(&gap, last), "2026-03-29T03:00:00+02:00");
    }

    #[test]
    fn intervals_are_aligned_to_the_epoch() {
        let five = Cadence::every(300_000).unwrap();
        assert_eq!(ticks(&five, "2026-05-01T10:02:30Z", 2), ["2026-05-01T10:05:00Z", "2026-05-01T10:10:00Z"]);
        assert_eq!(five.last_at_or_before(ms("2026-05-01T10:05:00Z")), Some(ms("2026-05-01T10:05:00Z")));
        assert_eq!(five.next_after(ms("2026-05-01T10:05:00Z")), Some(ms("2026-05-01T10:10:00Z")));
        let fast = Cadence::every(250).unwrap();
        assert_eq!(fast.upcoming(1_000, 3), [1_250, 1_500, 1_750]);
        assert!(Cadence::every(0).is_err());
    }
}
