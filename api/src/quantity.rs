//! The Kubernetes quantity grammar (`100m`, `1Gi`, `1.5`, `2e3`), shared by
//! the scheduler's accounting and the node agent's cgroup limits.

/// Why a quantity string does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not the quantity grammar (`<sign><digits>[.<digits>]<suffix>`).
    #[error("quantity {0:?} does not match the quantity grammar")]
    Syntax(String),
    /// Parses, but its value does not fit.
    #[error("quantity {0:?} is too large")]
    TooLarge(String),
}

/// Parses a Kubernetes quantity and returns its value in thousandths of the
/// unit, rounded up (so `"100m"` is 100, `"1"` is 1000, `"1Ki"` is 1024000).
/// Suffixes: `n u m "" k M G T P E`, `Ki Mi Gi Ti Pi Ei`, and decimal
/// exponents `e<n>`/`E<n>`.
pub fn parse_quantity(s: &str) -> Result<i128, QuantityError> {
    let syntax = || QuantityError::Syntax(s.to_string());
    let too_large = || QuantityError::TooLarge(s.to_string());
    let bytes = s.trim().as_bytes();
    let (negative, rest) = match bytes.first() {
        Some(b'-') => (true, &bytes[1..]),
        Some(b'+') => (false, &bytes[1..]),
        _ => (false, bytes),
    };
    // Mantissa: digits, optional fraction. `numerator / 10^scale`.
    let mut numerator: i128 = 0;
    let mut scale: i32 = 0;
    let mut digits = 0;
    let mut i = 0;
    let mut seen_dot = false;
    while i < rest.len() {
        let c = rest[i];
        if c.is_ascii_digit() {
            numerator =
                numerator.checked_mul(10).and_then(|n| n.checked_add(i128::from(c - b'0'))).ok_or_else(too_large)?;
            digits += 1;
            if seen_dot {
                scale += 1;
            }
        } else if c == b'.' && !seen_dot {
            seen_dot = true;
        } else {
            break;
        }
        i += 1;
    }
    if digits == 0 {
        return Err(syntax());
    }
    let suffix = std::str::from_utf8(&rest[i..]).map_err(|_| syntax())?;
    // The value is numerator * 10^exp10 * 2^exp2 / 10^scale, times 1000.
    let (exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        other => {
            let exponent = other.strip_prefix('e').or_else(|| other.strip_prefix('E')).ok_or_else(syntax)?;
            let e: i32 = exponent.parse().map_err(|_| syntax())?;
            (e, 0)
        }
    };
    let mut exp = exp10 + 3 - scale;
    let mut value = numerator.checked_mul(1i128 << exp2).ok_or_else(too_large)?;
    if exp > 40 {
        return Err(too_large());
    }
    while exp > 0 {
        value = value.checked_mul(10).ok_or_else(too_large)?;
        exp -= 1;
    }
    if exp < 0 {
        let divisor = if exp < -38 { None } else { 10i128.checked_pow((-exp) as u32) };
        value = match divisor {
            Some(d) => value / d + i128::from(value % d != 0),
            None => i128::from(value != 0),
        };
    }
    Ok(if negative { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_in_thousandths_rounding_up() {
        let cases: &[(&str, i128)] = &[
            ("1", 1000),
            ("100m", 100),
            ("0.5", 500),
            ("1.5", 1500),
            ("0.1m", 1),
            ("1k", 1_000_000),
            ("1Ki", 1_024_000),
            ("128Mi", 128 * 1024 * 1024 * 1000),
            ("2G", 2_000_000_000_000),
            ("1Ei", (1i128 << 60) * 1000),
            ("1E", 1_000_000_000_000_000_000_000),
            ("1e3", 1_000_000),
            ("1E3", 1_000_000),
            ("5e-3", 5),
            ("+2", 2000),
            ("-2", -2000),
            ("500n", 1),
            ("2u", 1),
            ("0", 0),
        ];
        for (s, want) in cases {
            assert_eq!(parse_quantity(s), Ok(*want), "{s}");
        }
    }

    #[test]
    fn malformed_quantities_are_errors_not_zero() {
        for s in ["", "abc", "1x", "1.2.3", "Mi", "1e", "1e+", "1KiB", "--1", "1e99999999999"] {
            assert!(parse_quantity(s).is_err(), "{s} should not parse");
        }
        assert!(matches!(parse_quantity("99999999999999999999999999999999999999999"), Err(QuantityError::TooLarge(_))));
    }
}
