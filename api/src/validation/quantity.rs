//! Resource quantities (`500m`, `1Gi`, `1e3`): parsing and exact comparison,
//! enough for the checks validation and QoS classification need, and the
//! sums a ResourceQuota's `status.used` reports, printed in Kubernetes'
//! canonical form.

use std::cmp::Ordering;

/// `mantissa * 10^exp`, exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantity {
    mantissa: i128,
    exp: i32,
}

/// Kubernetes' message for a malformed quantity.
pub const QUANTITY_FORMAT: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// More digits than this are not parsed (the arithmetic is on `i128`).
const MAX_DIGITS: usize = 24;

/// The decimal suffixes by power of ten.
const DECIMAL_SUFFIXES: [(i32, &str); 10] =
    [(-9, "n"), (-6, "u"), (-3, "m"), (0, ""), (3, "k"), (6, "M"), (9, "G"), (12, "T"), (15, "P"), (18, "E")];

/// The binary suffixes by power of 1024, largest first.
const BINARY_SUFFIXES: [(u32, &str); 6] = [(6, "Ei"), (5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")];

impl Quantity {
    /// Zero.
    pub const ZERO: Quantity = Quantity { mantissa: 0, exp: 0 };

    /// Whether `s` is written with a binary suffix (`Ki` .. `Ei`), the form
    /// Kubernetes keeps when it prints a sum.
    pub fn is_binary_form(s: &str) -> bool {
        BINARY_SUFFIXES.iter().any(|(_, suffix)| s.ends_with(suffix))
    }

    /// The canonical text, as Kubernetes prints a quantity: with `binary`,
    /// a whole number as the largest binary suffix that divides it
    /// (`3Gi`); otherwise the largest decimal suffix that keeps the number
    /// whole (`1500m`, `2k`). Values finer than `1n` round up to it.
    pub fn format(&self, binary: bool) -> String {
        if self.mantissa == 0 {
            return "0".to_string();
        }
        if binary {
            if let Some(whole) = self.whole() {
                for (power, suffix) in BINARY_SUFFIXES {
                    let unit = 1024_i128.pow(power);
                    if whole % unit == 0 {
                        return format!("{}{suffix}", whole / unit);
                    }
                }
                return whole.to_string();
            }
        }
        let (mut mantissa, mut exp) = (self.mantissa, self.exp);
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exp += 1;
        }
        if exp < -9 {
            // Round away from zero to whole nanos.
            let Some(d) = 10_i128.checked_pow((-9 - exp).unsigned_abs()) else {
                return format!("{}n", mantissa.signum());
            };
            let rounded = mantissa / d + i128::from(mantissa % d != 0) * mantissa.signum();
            return format!("{rounded}n");
        }
        let power = (exp.div_euclid(3) * 3).min(18);
        let suffix = DECIMAL_SUFFIXES.iter().find(|(p, _)| *p == power).map_or("", |(_, s)| *s);
        match 10_i128.checked_pow((exp - power).unsigned_abs()).and_then(|m| mantissa.checked_mul(m)) {
            Some(m) => format!("{m}{suffix}"),
            None => format!("{mantissa}e{exp}"),
        }
    }

    /// The value as a whole number, if it is one and fits.
    fn whole(&self) -> Option<i128> {
        if self.exp >= 0 {
            return self.mantissa.checked_mul(10_i128.checked_pow(self.exp.unsigned_abs())?);
        }
        let d = 10_i128.checked_pow(self.exp.unsigned_abs())?;
        (self.mantissa % d == 0).then(|| self.mantissa / d)
    }

    /// Parses Kubernetes' quantity syntax; `None` if malformed.
    pub fn parse(s: &str) -> Option<Quantity> {
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

    /// Below zero.
    pub fn is_negative(&self) -> bool {
        self.mantissa < 0
    }

    /// Exactly zero.
    pub fn is_zero(&self) -> bool {
        self.mantissa == 0
    }

    /// Whether the value is a whole number.
    pub fn is_integer(&self) -> bool {
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

    /// Orders by value (`500m` equals `0.5`). Not `Ord`: the derived
    /// equality is of the representation.
    pub fn compare(&self, other: &Quantity) -> Ordering {
        self.cmp(other)
    }

    pub(crate) fn cmp(&self, other: &Quantity) -> Ordering {
        match self.aligned(*other) {
            Some((a, b, _)) => a.cmp(&b),
            None => self.approx().partial_cmp(&other.approx()).unwrap_or(Ordering::Equal),
        }
    }

    /// The sum, if it fits.
    pub fn checked_add(&self, other: &Quantity) -> Option<Quantity> {
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
    fn sums_print_in_kubernetes_canonical_form() {
        assert_eq!(q("500m").checked_add(&q("1")).unwrap().format(false), "1500m");
        assert_eq!(q("1k").checked_add(&q("1000")).unwrap().format(false), "2k");
        assert_eq!(q("1Gi").checked_add(&q("2Gi")).unwrap().format(true), "3Gi");
        assert_eq!(q("1536Mi").format(true), "1536Mi");
        assert_eq!(q("1000").format(true), "1000");
        assert_eq!(q("100m").format(true), "100m");
        assert_eq!(Quantity::ZERO.format(true), "0");
        assert_eq!(q("1e-12").format(false), "1n");
        assert!(Quantity::is_binary_form("64Mi") && !Quantity::is_binary_form("64M"));
    }

    #[test]
    fn malformed_quantities_do_not_parse() {
        for bad in ["", "abc", "1.2.3", "1Qi", "--1", "1e", ".", "1 Gi"] {
            assert!(Quantity::parse(bad).is_none(), "{bad}");
        }
    }
}
