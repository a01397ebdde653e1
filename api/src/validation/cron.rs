//! Cron schedules as Kubernetes accepts them (`robfig/cron`'s standard
//! parser): five fields, or a descriptor such as `@hourly`. Only the syntax
//! is checked here; the CronJob controller computes the times. The error
//! texts are robfig/cron's, which Kubernetes passes on.

/// The fields: name, minimum, maximum, and the names allowed in place of
/// numbers.
const FIELDS: [(&str, u32, u32, &[&str]); 5] = [
    ("minute", 0, 59, &[]),
    ("hour", 0, 23, &[]),
    ("day of month", 1, 31, &[]),
    ("month", 1, 12, &["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]),
    ("day of week", 0, 6, &["sun", "mon", "tue", "wed", "thu", "fri", "sat"]),
];

const DESCRIPTORS: &[&str] = &["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"];

/// `Ok` if `spec` is a valid standard cron schedule, else robfig/cron's
/// error message.
pub(crate) fn parse_standard(spec: &str) -> Result<(), String> {
    let mut spec = spec.trim();
    // `CRON_TZ=Europe/Berlin 0 * * * *`: the zone is checked by the caller.
    if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
        match spec.split_once(' ') {
            Some((_, rest)) => spec = rest.trim(),
            None => return Err(format!("provided bad location {spec}: unknown time zone")),
        }
    }
    if spec.starts_with('@') {
        return if DESCRIPTORS.contains(&spec) { Ok(()) } else { Err(format!("unrecognized descriptor: {spec}")) };
    }
    let fields: Vec<&str> = spec.split_whitespace().collect();
    if fields.len() != FIELDS.len() {
        return Err(format!("expected exactly 5 fields, found {}: [{}]", fields.len(), fields.join(" ")));
    }
    for (field, (_, min, max, names)) in fields.iter().zip(FIELDS) {
        for expr in field.split(',') {
            parse_range(expr, min, max, names)?;
        }
    }
    Ok(())
}

/// One `*`, `?`, `a`, `a-b`, optionally `/step`.
fn parse_range(expr: &str, min: u32, max: u32, names: &[&str]) -> Result<(), String> {
    let (range, step) = match expr.split('/').collect::<Vec<_>>().as_slice() {
        [r] => (*r, None),
        [r, s] => (*r, Some(*s)),
        _ => return Err(format!("too many slashes: {expr}")),
    };
    let (start, end) = if range == "*" || range == "?" {
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
    if let Some(step) = step {
        let n = parse_int(step)?;
        if n == 0 {
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
    Ok(())
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
    use super::parse_standard;

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
