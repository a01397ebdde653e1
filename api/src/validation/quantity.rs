//! Resource quantities (`500m`, `1Gi`, `1e3`): parsing and exact comparison,
//! enough for the checks validation and QoS classification need.

use std::cmp::Ordering;

/// `mantissa * 10^exp`, exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Quantity {
    mantissa: i128,
    exp: i32,
}

/// Kubernetes' message for a malformed quantity.
pub(crate) const QUANTITY_FORMAT: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// More digits than this are not parsed (the arithmetic is on `i128`).
const MAX_DIGITS: usize = 24;

impl Quantity {
    /// Parses Kubernetes' quantity syntax; `None` if malformed.
    pub(crate) fn parse(s: &str) -> Option<Quantity> {
        let (neg, rest) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let num_len = rest.bytes().take_while(|c| c.is_ascii_digit() || *c == b'.').count();
        let (num, suffix) = rest.split_at(num_len);
        let (int_part, frac_part) = match num.split_once('.') {
            Some((i, f)) => (i, f),
            None => (num, ""),
        };
        if frac_part.contains('.') || (int_part.is_empty() && frac_part.is_empty()) {
            return None;
        }
        let digits = format!("{int_part}{frac_part}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > MAX_DIGITS {
            return None;
        }
        let mut mantissa: i128 = if digits.is_empty() { 0 } else { digits.parse().ok()? };
        let mut exp = -i32::try_from(frac_part.len()).ok()?;
        let binary = |k: u32| 1024_i128.checked_pow(k);
        match suffix {
            "" => {}
            "Ki" => mantissa = mantissa.checked_mul(binary(1)?)?,
            "Mi" => mantissa = mantissa.checked_mul(binary(2)?)?,
            "Gi" => mantissa = mantissa.checked_mul(binary(3)?)?,
            "Ti" => mantissa = mantissa.checked_mul(binary(4)?)?,
            "Pi" => mantissa = mantissa.checked_mul(binary(5)?)?,
            "Ei" => mantissa = mantissa.checked_mul(binary(6)?)?,
            "n" => exp -= 9,
            "u" => exp -= 6,
            "m" => exp -= 3,
            "k" => exp += 3,
            "M" => exp += 6,
            "G" => exp += 9,
            "T" => exp += 12,
            "P" => exp += 15,
            "E" => exp += 18,
            s if s.starts_with(['e', 'E']) => {
                let e = &s[1..];
                let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
                if digits.is_empty() || digits.len() > 6 || !digits.bytes().all(|c| c.is_ascii_digit()) {
                    return None;
                }
                exp = exp.checked_add(e.parse::<i32>().ok()?)?;
            }
            _ => return None,
        }
        if neg {
            mantissa = -mantissa;
        }
        Some(Quantity { mantissa, exp })
    }

    pub(crate) fn is_negative(&self) -> bool {
        self.mantissa < 0
    }

    pub(crate) fn is_zero(&self) -> bool {
        self.mantissa == 0
    }

    /// Whether the value is a whole number.
    pub(crate) fn is_integer(&self) -> bool {
        if self.exp >= 0 || self.mantissa == 0 {
            return true;
        }
        match 10_i128.checked_pow(self.exp.unsigned_abs()) {
            Some(d) => self.mantissa % d == 0,
            None => false,
        }
    }

    /// Both at one exponent, if that fits.
    fn aligned(self, other: Quantity) -> Option<(i128, i128, i32)> {
        let exp = self.exp.min(other.exp);
        let scale = |q: Quantity| -> Option<i128> {
            if q.mantissa == 0 {
                return Some(0);
            }
            let d = u32::try_from(q.exp - exp).ok()?;
            q.mantissa.checked_mul(10_i128.checked_pow(d)?)
        };
        Some((scale(self)?, scale(other)?, exp))
    }

    fn approx(&self) -> f64 {
        (self.mantissa as f64) * 10f64.powi(self.exp)
    }

    pub(crate) fn cmp(&self, other: &Quantity) -> Ordering {
        match self.aligned(*other) {
            Some((a, b, _)) => a.cmp(&b),
            None => self.approx().partial_cmp(&other.approx()).unwrap_or(Ordering::Equal),
        }
    }

    /// The sum, if it fits.
    pub(crate) fn checked_add(&self, other: &Quantity) -> Option<Quantity> {
        let (a, b, exp) = self.aligned(*other)?;
        Some(Quantity { mantissa: a.checked_add(b)?, exp })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn quantities_in_every_suffix_compare_by_value() {
        assert_eq!(q("500m").cmp(&q("0.5")), Ordering::Equal);
        assert_eq!(q("1Gi").cmp(&q("1073741824")), Ordering::Equal);
        assert_eq!(q("1G").cmp(&q("1Gi")), Ordering::Less);
        assert_eq!(q("1e3").cmp(&q("1k")), Ordering::Equal);
        assert_eq!(q("2").cmp(&q("1500m")), Ordering::Greater);
        assert_eq!(q("100Mi").checked_add(&q("100Mi")), Some(q("200Mi")));
        assert!(q("-1").is_negative());
        assert!(q("0").is_zero() && q("0m").is_zero());
        assert!(q("2").is_integer() && !q("1500m").is_integer() && q("2000m").is_integer());
    }

    #[test]
    fn malformed_quantities_do_not_parse() {
        for bad in ["", "abc", "1.2.3", "1Qi", "--1", "1e", ".", "1 Gi"] {
            assert!(Quantity::parse(bad).is_none(), "{bad}");
        }
    }
}
