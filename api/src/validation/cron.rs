//! Cron schedules as Kubernetes accepts them (`robfig/cron`'s standard
//! parser): five fields, or a descriptor such as `@hourly`. Validation
//! checks the syntax with [`Schedule::parse`]; the CronJob controller asks
//! the parsed [`Schedule`] for the times it fires, in the CronJob's zone.
//! The error texts are robfig/cron's, which Kubernetes passes on.
//!
//! Times are computed on the local wall clock of the zone, as robfig/cron
//! does: a time that does not exist there (the hour skipped when daylight
//! saving time starts) is skipped, and a time that exists twice (the hour
//! repeated when it ends) fires once, at its first occurrence.

use chrono::{DateTime, Datelike, Duration, LocalResult, NaiveDate, NaiveDateTime, TimeZone, Timelike};

/// The fields: name, minimum, maximum, and the names allowed in place of
/// numbers.
const FIELDS: [(&str, u32, u32, &[&str]); 5] = [
    ("minute", 0, 59, &[]),
    ("hour", 0, 23, &[]),
    ("day of month", 1, 31, &[]),
    ("month", 1, 12, &["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]),
    ("day of week", 0, 6, &["sun", "mon", "tue", "wed", "thu", "fri", "sat"]),
];

/// The descriptors and the five fields each stands for.
const DESCRIPTORS: &[(&str, &str)] = &[
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

/// How far ahead [`Schedule::next_after`] looks before deciding a schedule
/// never fires (`0 0 30 2 *`), as robfig/cron gives up after five years.
const SEARCH_YEARS: i32 = 5;

/// A parsed schedule: one bit per allowed value of each field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u64,
    days_of_month: u64,
    months: u64,
    days_of_week: u64,
    /// robfig/cron: when either day field is `*` (or `?`) a day must match
    /// both; when both are restricted, matching either is enough.
    day_star: bool,
    /// The zone of a `TZ=` or `CRON_TZ=` prefix, which old CronJobs may
    /// still carry (validation refuses it on new ones).
    zone: Option<String>,
}

/// A schedule that does not parse, with robfig/cron's message (which
/// Kubernetes shows in the field error and in the CronJob's events).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ScheduleError(pub String);

/// `Ok` if `spec` is a valid standard cron schedule, else robfig/cron's
/// error message.
pub(crate) fn parse_standard(spec: &str) -> Result<(), String> {
    Schedule::parse(spec).map(|_| ()).map_err(|e| e.0)
}

impl Schedule {
    /// Parses a standard schedule.
    pub fn parse(spec: &str) -> Result<Schedule, ScheduleError> {
        Schedule::parse_text(spec).map_err(ScheduleError)
    }

    fn parse_text(spec: &str) -> Result<Schedule, String> {
        let mut spec = spec.trim();
        let mut zone = None;
        // `CRON_TZ=Europe/Berlin 0 * * * *`: the zone is checked by the caller.
        if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
            match spec.split_once(' ') {
                Some((prefix, rest)) => {
                    zone = prefix.split_once('=').map(|(_, z)| z.to_string());
                    spec = rest.trim();
                }
                None => return Err(format!("provided bad location {spec}: unknown time zone")),
            }
        }
        if spec.starts_with('@') {
            return match DESCRIPTORS.iter().find(|(d, _)| *d == spec) {
                Some((_, fields)) => Schedule::parse_text(fields).map(|s| Schedule { zone, ..s }),
                None => Err(format!("unrecognized descriptor: {spec}")),
            };
        }
        let fields: Vec<&str> = spec.split_whitespace().collect();
        if fields.len() != FIELDS.len() {
            return Err(format!("expected exactly 5 fields, found {}: [{}]", fields.len(), fields.join(" ")));
        }
        let mut bits = [0u64; 5];
        let mut stars = [false; 5];
        for (i, (field, (_, min, max, names))) in fields.iter().zip(FIELDS).enumerate() {
            for expr in field.split(',') {
                let (b, star) = parse_range(expr, min, max, names)?;
                bits[i] |= b;
                stars[i] |= star;
            }
        }
        Ok(Schedule {
            minutes: bits[0],
            hours: bits[1],
            days_of_month: bits[2],
            months: bits[3],
            days_of_week: bits[4],
            day_star: stars[2] || stars[4],
            zone,
        })
    }

    /// The zone named by a `TZ=`/`CRON_TZ=` prefix, if the schedule had one.
    pub fn zone(&self) -> Option<&str> {
        self.zone.as_deref()
    }

    /// The first time strictly after `after` (at a whole minute) that the
    /// schedule fires, on the wall clock of `after`'s zone; `None` if it
    /// does not fire within five years.
    pub fn next_after<Tz: TimeZone>(&self, after: &DateTime<Tz>) -> Option<DateTime<Tz>> {
        let zone = after.timezone();
        let local = after.naive_local();
        // The next whole minute on the wall clock.
        let start = local.with_second(0)?.with_nanosecond(0)? + Duration::minutes(1);
        let mut date = start.date();
        let last = NaiveDate::from_ymd_opt(start.year() + SEARCH_YEARS, start.month(), 1)?;
        while date <= last {
            if self.day_matches(date) {
                let first_day = date == start.date();
                for hour in 0..24u32 {
                    if !bit(self.hours, hour) || (first_day && hour < start.hour()) {
                        continue;
                    }
                    for minute in 0..60u32 {
                        if !bit(self.minutes, minute) || (first_day && hour == start.hour() && minute < start.minute())
                        {
                            continue;
                        }
                        let wall: NaiveDateTime = date.and_hms_opt(hour, minute, 0)?;
                        let at = match zone.from_local_datetime(&wall) {
                            LocalResult::Single(t) => t,
                            LocalResult::Ambiguous(first, _) => first,
                            LocalResult::None => continue,
                        };
                        if at > *after {
                            return Some(at);
                        }
                    }
                }
            }
            date = date.succ_opt()?;
        }
        None
    }

    fn day_matches(&self, date: NaiveDate) -> bool {
        if !bit(self.months, date.month()) {
            return false;
        }
        let dom = bit(self.days_of_month, date.day());
        let dow = bit(self.days_of_week, date.weekday().num_days_from_sunday());
        if self.day_star {
            dom && dow
        } else {
            dom || dow
        }
    }
}

/// The IANA zone `name` (`Europe/Berlin`, `UTC`), from the database compiled
/// into the binary; `None` if there is no such zone.
pub fn time_zone(name: &str) -> Option<chrono_tz::Tz> {
    name.parse().ok()
}

fn bit(bits: u64, n: u32) -> bool {
    bits & (1u64 << n) != 0
}

/// One `*`, `?`, `a`, `a-b`, optionally `/step`: its bits, and whether it
/// was a plain star (robfig/cron's star bit, cleared by a step above 1).
fn parse_range(expr: &str, min: u32, max: u32, names: &[&str]) -> Result<(u64, bool), String> {
    let (range, step) = match expr.split('/').collect::<Vec<_>>().as_slice() {
        [r] => (*r, None),
        [r, s] => (*r, Some(*s)),
        _ => return Err(format!("too many slashes: {expr}")),
    };
    let star = range == "*" || range == "?";
    let (start, end) = if star {
        (min, max)
    } else {
        match range.split('-').collect::<Vec<_>>().as_slice() {
            [a] => {
                let a = parse_value(a, names)?;
                (a, if step.is_some() { max } else { a })
            }
            [a, b] => (parse_value(a, names)?, parse_value(b, names)?),
            _ => return Err(format!("too many hyphens: {expr}")),
        }
    };
    let mut stride = 1;
    if let Some(step) = step {
        stride = parse_int(step)?;
        if stride == 0 {
            return Err(format!("step of range should be a positive number: {expr}"));
        }
    }
    if start < min {
        return Err(format!("beginning of range ({start}) below minimum ({min}): {expr}"));
    }
    if end > max {
        return Err(format!("end of range ({end}) above maximum ({max}): {expr}"));
    }
    if start > end {
        return Err(format!("beginning of range ({start}) beyond end of range ({end}): {expr}"));
    }
    let bits = (start..=end).step_by(stride as usize).fold(0u64, |b, n| b | (1u64 << n));
    Ok((bits, star && stride == 1))
}

fn parse_value(s: &str, names: &[&str]) -> Result<u32, String> {
    let lower = s.to_ascii_lowercase();
    match names.iter().position(|n| *n == lower) {
        // Month names count from 1, weekday names from 0.
        Some(i) => Ok(u32::try_from(i).unwrap_or(0) + u32::from(names.len() == 12)),
        None => parse_int(s),
    }
}

fn parse_int(s: &str) -> Result<u32, String> {
    if let Some(rest) = s.strip_prefix('-') {
        if rest.parse::<u32>().is_ok() {
            return Err(format!("negative number ({s}) not allowed: {s}"));
        }
    }
    s.parse::<u32>().map_err(|_| format!("failed to parse int from {s}: strconv.Atoi: parsing \"{s}\": invalid syntax"))
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};

    use super::{parse_standard, time_zone, Schedule};

    fn must_parse(spec: &str) -> Schedule {
        Schedule::parse(spec).expect(spec)
    }

    #[test]
    fn the_next_time_is_strictly_after_and_on_a_whole_minute() {
        let s = must_parse("*/15 * * * *");
        let at = Utc.with_ymd_and_hms(2026, 1, 1, 10, 15, 0).unwrap();
        assert_eq!(s.next_after(&at), Some(Utc.with_ymd_and_hms(2026, 1, 1, 10, 30, 0).unwrap()));
        let mid = Utc.with_ymd_and_hms(2026, 1, 1, 10, 16, 30).unwrap();
        assert_eq!(s.next_after(&mid), Some(Utc.with_ymd_and_hms(2026, 1, 1, 10, 30, 0).unwrap()));
        let late = Utc.with_ymd_and_hms(2026, 12, 31, 23, 59, 0).unwrap();
        assert_eq!(s.next_after(&late), Some(Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap()));
    }

    #[test]
    fn descriptors_expand_to_their_fields() {
        let at = Utc.with_ymd_and_hms(2026, 3, 4, 5, 6, 0).unwrap();
        assert_eq!(must_parse("@hourly").next_after(&at), Some(Utc.with_ymd_and_hms(2026, 3, 4, 6, 0, 0).unwrap()));
        assert_eq!(must_parse("@monthly").next_after(&at), Some(Utc.with_ymd_and_hms(2026, 4, 1, 0, 0, 0).unwrap()));
        // 2026-03-08 is a Sunday.
        assert_eq!(must_parse("@weekly").next_after(&at), Some(Utc.with_ymd_and_hms(2026, 3, 8, 0, 0, 0).unwrap()));
    }

    #[test]
    fn restricted_day_fields_match_either_day_but_a_star_requires_both() {
        let at = Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap();
        // The 15th, or any Monday (2026-03-02).
        assert_eq!(must_parse("0 0 15 * 1").next_after(&at), Some(Utc.with_ymd_and_hms(2026, 3, 2, 0, 0, 0).unwrap()));
        // Any day of month that is a Monday.
        assert_eq!(must_parse("0 0 * * mon").next_after(&at), Some(Utc.with_ymd_and_hms(2026, 3, 2, 0, 0, 0).unwrap()));
        // A step clears the star: odd days of month or Fridays, so the 3rd.
        assert_eq!(must_parse("0 0 */2 * 5").next_after(&at), Some(Utc.with_ymd_and_hms(2026, 3, 3, 0, 0, 0).unwrap()));
    }

    #[test]
    fn a_schedule_that_never_fires_has_no_next_time() {
        let at = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(must_parse("0 0 30 2 *").next_after(&at), None);
    }

    #[test]
    fn a_zone_fires_on_its_wall_clock_and_skips_the_hour_that_daylight_saving_removes() {
        let berlin = time_zone("Europe/Berlin").expect("zone");
        let s = must_parse("30 2 * * *");
        // 2026-03-29: clocks go from 02:00 to 03:00 in Berlin; 02:30 does not exist.
        let before = berlin.with_ymd_and_hms(2026, 3, 28, 2, 30, 0).unwrap();
        let next = s.next_after(&before).expect("fires");
        assert_eq!(next, berlin.with_ymd_and_hms(2026, 3, 30, 2, 30, 0).unwrap());
        assert_eq!(next.with_timezone(&Utc), Utc.with_ymd_and_hms(2026, 3, 30, 0, 30, 0).unwrap());
        // 2026-10-25: 02:30 happens twice; the job fires once, at the first (CEST, UTC+2).
        let s = must_parse("30 2 * * *");
        let before = berlin.with_ymd_and_hms(2026, 10, 24, 3, 0, 0).unwrap();
        let next = s.next_after(&before).expect("fires");
        assert_eq!(next.with_timezone(&Utc), Utc.with_ymd_and_hms(2026, 10, 25, 0, 30, 0).unwrap());
        assert_eq!(
            s.next_after(&next).expect("fires").with_timezone(&Utc),
            Utc.with_ymd_and_hms(2026, 10, 26, 1, 30, 0).unwrap()
        );
    }

    #[test]
    fn a_tz_prefix_names_the_zone_and_unknown_zones_are_not_found() {
        assert_eq!(must_parse("CRON_TZ=Asia/Tokyo 0 9 * * *").zone(), Some("Asia/Tokyo"));
        assert_eq!(must_parse("0 9 * * *").zone(), None);
        assert!(time_zone("Mars/Olympus").is_none());
        assert!(time_zone("America/New_York").is_some() && time_zone("UTC").is_some());
    }

    #[test]
    fn standard_schedules_and_descriptors_parse() {
        for ok in ["*/5 * * * *", "0 0 * * 0", "15 2 1-15/2 jan,JUL mon-fri", "@hourly", "@daily", "0 0 1 1 ?"] {
            assert_eq!(parse_standard(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn malformed_schedules_explain_themselves_as_robfig_cron_does() {
        assert_eq!(parse_standard("* * *").unwrap_err(), "expected exactly 5 fields, found 3: [* * *]");
        assert_eq!(parse_standard("70 * * * *").unwrap_err(), "end of range (70) above maximum (59): 70");
        assert_eq!(parse_standard("5-3 * * * *").unwrap_err(), "beginning of range (5) beyond end of range (3): 5-3");
        assert_eq!(parse_standard("@fortnightly").unwrap_err(), "unrecognized descriptor: @fortnightly");
        assert!(parse_standard("x * * * *").unwrap_err().starts_with("failed to parse int from x"));
        assert!(parse_standard("*/0 * * * *").unwrap_err().starts_with("step of range should be a positive number"));
        assert!(parse_standard("0 0 0 * *").unwrap_err().starts_with("beginning of range (0) below minimum (1)"));
    }
}
