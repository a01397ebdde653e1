//! Latency histograms: one per task while a scenario runs, merged at the end.

use std::time::Duration;

use hdrhistogram::Histogram;

/// Microsecond resolution, up to two minutes, three significant digits.
const MAX_MICROS: u64 = 120_000_000;

/// A latency histogram in microseconds.
#[derive(Clone)]
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        Latency(Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("constant histogram bounds are valid"))
    }
}

impl Latency {
    pub fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX).clamp(1, MAX_MICROS);
        self.0.saturating_record(micros);
    }

    pub fn merge(&mut self, other: &Latency) {
        self.0.add(&other.0).expect("histograms with the same bounds always merge");
    }

    /// The latency at quantile `q` (0.0 to 1.0) in milliseconds; 0 when empty.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.value_at_quantile(q) as f64 / 1000.0
    }

    /// Latencies recorded.
    pub fn count(&self) -> u64 {
        self.0.len()
    }

    pub fn max_ms(&self) -> f64 {
        self.0.max() as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_a_known_distribution() {
        let mut a = Latency::default();
        let mut b = Latency::default();
        for ms in 1..=50 {
            a.record(Duration::from_millis(ms));
        }
        for ms in 51..=100 {
            b.record(Duration::from_millis(ms));
        }
        a.merge(&b);
        assert!((a.quantile_ms(0.5) - 50.0).abs() < 0.1, "{}", a.quantile_ms(0.5));
        assert!((a.quantile_ms(0.99) - 99.0).abs() < 0.1, "{}", a.quantile_ms(0.99));
        assert!((a.max_ms() - 100.0).abs() < 0.1);
        assert_eq!(Latency::default().quantile_ms(0.99), 0.0);
    }
}
