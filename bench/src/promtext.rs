//! Histograms read from a Prometheus text scrape, and what a window of
//! them says: the difference of two scrapes (the observations made in
//! between), merged over processes, and quantiles interpolated within
//! buckets as Prometheus' `histogram_quantile` does.

/// One histogram: cumulative counts by upper bound (`le`), ascending, with
/// the `+Inf` bucket last; its sum and count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

/// `name{labels}` and the labels as pairs, or `None` if `line` is not a
/// sample of the metric `name`.
fn sample<'a>(line: &'a str, name: &str) -> Option<(Vec<(&'a str, &'a str)>, f64)> {
    let rest = line.strip_prefix(name)?;
    let (labels, value) = match rest.strip_prefix('{') {
        Some(r) => {
            let (labels, value) = r.split_once('}')?;
            (labels, value)
        }
        None if rest.starts_with(' ') => ("", rest),
        None => return None,
    };
    let pairs = labels
        .split(',')
        .filter(|p| !p.is_empty())
        .filter_map(|p| {
            let (k, v) = p.split_once('=')?;
            Some((k.trim(), v.trim().trim_matches('"')))
        })
        .collect();
    let value = value.trim().parse().ok()?;
    Some((pairs, value))
}

/// The histogram `name` of `text` whose labels include `select` (every
/// one of them); `None` if the scrape has no such histogram.
pub fn histogram(text: &str, name: &str, select: &[(&str, &str)]) -> Option<Histogram> {
    let wanted = |labels: &[(&str, &str)]| select.iter().all(|s| labels.contains(s));
    let mut h = Histogram::default();
    let mut found = false;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if let Some((labels, value)) = sample(line, &format!("{name}_bucket")) {
            if !wanted(&labels) {
                continue;
            }
            let Some(le) = labels.iter().find(|(k, _)| *k == "le").map(|(_, v)| *v) else { continue };
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) };
            h.buckets.push((le, value));
            found = true;
        } else if let Some((labels, value)) = sample(line, &format!("{name}_sum")) {
            if wanted(&labels) {
                h.sum = value;
            }
        } else if let Some((labels, value)) = sample(line, &format!("{name}_count")) {
            if wanted(&labels) {
                h.count = value;
            }
        }
    }
    h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    found.then_some(h)
}

/// The samples of the counter `name` by the value of its label `label`.
pub fn counters(text: &str, name: &str, label: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (labels, value) = sample(l, name)?;
            let (_, v) = labels.iter().find(|(k, _)| *k == label)?;
            Some((v.to_string(), value))
        })
        .collect()
}

impl Histogram {
    /// What was observed after `earlier`, a scrape of the same histogram.
    pub fn since(&self, earlier: Option<&Histogram>) -> Histogram {
        let Some(earlier) = earlier else { return self.clone() };
        let before = |le: f64| earlier.buckets.iter().find(|(l, _)| *l == le).map_or(0.0, |(_, c)| *c);
        Histogram {
            buckets: self.buckets.iter().map(|(le, c)| (*le, c - before(*le))).collect(),
            sum: self.sum - earlier.sum,
            count: self.count - earlier.count,
        }
    }

    /// Adds `other`'s observations (the same buckets, another process).
    pub fn merge(&mut self, other: &Histogram) {
        if self.buckets.is_empty() {
            *self = other.clone();
            return;
        }
        for (le, c) in &mut self.buckets {
            *c += other.buckets.iter().find(|(l, _)| l == le).map_or(0.0, |(_, c)| *c);
        }
        self.sum += other.sum;
        self.count += other.count;
    }

    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }

    /// The bucket `(lower, upper]` that holds the `q` quantile (the upper
    /// bound infinite for the `+Inf` bucket).
    pub fn bucket_of(&self, q: f64) -> Option<(f64, f64)> {
        let total = self.buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let mut lower = 0.0;
        for &(le, count) in &self.buckets {
            if count >= q * total {
                return Some((lower, le));
            }
            lower = le;
        }
        None
    }

    /// The `q` quantile, interpolated linearly within its bucket (from the
    /// bucket below's bound, or 0); a quantile in the `+Inf` bucket is the
    /// highest finite bound.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let mut lower = (0.0, 0.0);
        for &(le, count) in &self.buckets {
            if count >= rank {
                if le.is_infinite() {
                    return Some(lower.0);
                }
                let within = count - lower.1;
                let share = if within > 0.0 { (rank - lower.1) / within } else { 1.0 };
                return Some(lower.0 + (le - lower.0) * share);
            }
            lower = (le, count);
        }
        Some(lower.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = "\
# HELP kubelet_runtime_operations_duration_seconds Duration.
# TYPE kubelet_runtime_operations_duration_seconds histogram
kubelet_runtime_operations_duration_seconds_bucket{operation_type=\"run_podsandbox\",le=\"0.1\"} 2
kubelet_runtime_operations_duration_seconds_bucket{operation_type=\"run_podsandbox\",le=\"0.2\"} 6
kubelet_runtime_operations_duration_seconds_bucket{operation_type=\"run_podsandbox\",le=\"+Inf\"} 10
kubelet_runtime_operations_duration_seconds_sum{operation_type=\"run_podsandbox\"} 2.5
kubelet_runtime_operations_duration_seconds_count{operation_type=\"run_podsandbox\"} 10
kubelet_runtime_operations_duration_seconds_bucket{operation_type=\"start_container\",le=\"0.1\"} 7
kubelet_runtime_operations_duration_seconds_bucket{operation_type=\"start_container\",le=\"0.2\"} 7
kubelet_runtime_operations_duration_seconds_bucket{operation_type=\"start_container\",le=\"+Inf\"} 7
kubelet_runtime_operations_duration_seconds_sum{operation_type=\"start_container\"} 0.3
kubelet_runtime_operations_duration_seconds_count{operation_type=\"start_container\"} 7
kubelet_pod_start_duration_seconds_bucket{le=\"1\"} 3
kubelet_pod_start_duration_seconds_bucket{le=\"+Inf\"} 3
kubelet_pod_start_duration_seconds_sum 1.2
kubelet_pod_start_duration_seconds_count 3
";

    #[test]
    fn a_histogram_is_read_by_name_and_labels() {
        let name = "kubelet_runtime_operations_duration_seconds";
        let h = histogram(SCRAPE, name, &[("operation_type", "run_podsandbox")]).unwrap();
        assert_eq!(h.buckets, vec![(0.1, 2.0), (0.2, 6.0), (f64::INFINITY, 10.0)]);
        assert_eq!((h.sum, h.count), (2.5, 10.0));
        let start = histogram(SCRAPE, name, &[("operation_type", "start_container")]).unwrap();
        assert_eq!(start.count, 7.0);
        let unlabelled = histogram(SCRAPE, "kubelet_pod_start_duration_seconds", &[]).unwrap();
        assert_eq!((unlabelled.sum, unlabelled.count), (1.2, 3.0));
        assert_eq!(histogram(SCRAPE, name, &[("operation_type", "stop_container")]), None);
        // A name that only begins another metric's is not that metric.
        assert_eq!(histogram(SCRAPE, "kubelet_runtime_operations", &[]), None);
    }

    #[test]
    fn counters_are_read_by_label() {
        let text = "# TYPE kubelet_runtime_operations_total counter\n\
                    kubelet_runtime_operations_total{operation_type=\"list_containers\"} 12\n\
                    kubelet_runtime_operations_total{operation_type=\"version\"} 1\n\
                    kubelet_runtime_operations_errors_total{operation_type=\"version\"} 1\n";
        let found = counters(text, "kubelet_runtime_operations_total", "operation_type");
        assert_eq!(found, vec![("list_containers".to_string(), 12.0), ("version".to_string(), 1.0)]);
    }

    #[test]
    fn quantiles_interpolate_within_a_bucket_and_stop_at_the_last_finite_bound() {
        let h =
            histogram(SCRAPE, "kubelet_runtime_operations_duration_seconds", &[("operation_type", "run_podsandbox")])
                .unwrap();
        // Rank 1 of 2 in the first bucket: half of 0..0.1.
        assert!((h.quantile(0.1).unwrap() - 0.05).abs() < 1e-9);
        // Rank 5: 3 of the 4 in 0.1..0.2.
        assert!((h.quantile(0.5).unwrap() - 0.175).abs() < 1e-9);
        assert_eq!(h.quantile(0.99), Some(0.2));
        assert_eq!(h.bucket_of(0.5), Some((0.1, 0.2)));
        assert_eq!(h.bucket_of(0.99), Some((0.2, f64::INFINITY)));
        assert_eq!(h.mean(), Some(0.25));
        assert_eq!(Histogram::default().quantile(0.5), None);
    }

    #[test]
    fn a_window_is_the_difference_of_two_scrapes_merged_over_processes() {
        let name = "kubelet_runtime_operations_duration_seconds";
        let select = [("operation_type", "run_podsandbox")];
        let after = histogram(SCRAPE, name, &select).unwrap();
        let before = Histogram { buckets: vec![(0.1, 2.0), (0.2, 2.0), (f64::INFINITY, 2.0)], sum: 0.1, count: 2.0 };
        let window = after.since(Some(&before));
        assert_eq!(window.buckets, vec![(0.1, 0.0), (0.2, 4.0), (f64::INFINITY, 8.0)]);
        assert_eq!(window.count, 8.0);
        let mut both = window.clone();
        both.merge(&window);
        assert_eq!(both.buckets, vec![(0.1, 0.0), (0.2, 8.0), (f64::INFINITY, 16.0)]);
        assert!((both.sum - 4.8).abs() < 1e-9);
        // A process with no scrape before counts everything it has.
        assert_eq!(after.since(None), after);
    }
}
