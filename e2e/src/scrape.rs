//! Figures read out of a `/metrics` answer in the classic text format: its samples, what changed
//! between two answers, a counter summed by label, and a quantile estimated from a histogram's
//! cumulative buckets.
//!
//! Reading never fails: a line that is not a sample (a comment, a blank line, a malformed
//! sample) is skipped, so a figure read from a broken answer is low, never a panic.
//!
//! - Classic text format: <https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format>

/// One sample line: `name{label="value",...} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's name (for a counter `..._total`, for a histogram `..._bucket`, `_sum`,
    /// `_count`).
    pub name: String,
    /// Its labels, in the order written, values unescaped.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The samples of a classic text exposition, in order; lines that are not samples are skipped.
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines().filter_map(sample).collect()
}

/// One sample line, or `None` for a comment, a blank line or a malformed line.
fn sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() {
        return None;
    }
    let (labels, rest) = if line[name_end..].starts_with('{') {
        labels(&line[name_end + 1..])?
    } else {
        (Vec::new(), &line[name_end..])
    };
    // The value, then an optional timestamp.
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// The labels after a sample's `{`, and the text after the closing `}`; `None` when the braces
/// or quotes do not close.
pub(crate) fn labels(after_brace: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut out = Vec::new();
    let mut chars = after_brace.char_indices();
    let mut name = String::new();
    while let Some((at, c)) = chars.next() {
        match c {
            '}' => return Some((out, &after_brace[at + 1..])),
            '=' => {
                if chars.next()?.1 != '"' {
                    return None;
                }
                let mut value = String::new();
                loop {
                    match chars.next()?.1 {
                        '"' => break,
                        '\\' => match chars.next()?.1 {
                            'n' => value.push('\n'),
                            other => value.push(other),
                        },
                        other => value.push(other),
                    }
                }
                out.push((std::mem::take(&mut name).trim().to_string(), value));
            }
            ',' => {}
            c => name.push(c),
        }
    }
    None
}

/// What each series of `after` gained since `before` (same name and labels); a series missing
/// from `before` counts from zero. For counters and histograms, whose series only grow while
/// the process lives.
pub fn since(before: &[Sample], after: &[Sample]) -> Vec<Sample> {
    after
        .iter()
        .map(|a| {
            let base = before
                .iter()
                .find(|b| b.name == a.name && b.labels == a.labels)
                .map_or(0.0, |b| b.value);
            Sample {
                value: a.value - base,
                ..a.clone()
            }
        })
        .collect()
}

/// The sum of the samples named `name` whose label `label` is `value` (all of them when `label`
/// is `None`): a counter summed over nodes.
pub fn sum(samples: &[Sample], name: &str, label: Option<(&str, &str)>) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| label.is_none_or(|(l, v)| s.label(l) == Some(v)))
        .map(|s| s.value)
        .sum()
}

/// The cumulative buckets of histogram `family` (`(upper bound, count)` from its
/// `{family}_bucket` samples), summed over every series with the same bound (several nodes'
/// answers concatenated), by increasing bound. A bucket whose `le` does not parse is skipped.
pub fn buckets(samples: &[Sample], family: &str) -> Vec<(f64, f64)> {
    let name = format!("{family}_bucket");
    let mut out: Vec<(f64, f64)> = Vec::new();
    for s in samples.iter().filter(|s| s.name == name) {
        let Some(le) = s.label("le").and_then(|le| le.parse::<f64>().ok()) else {
            continue;
        };
        match out.iter_mut().find(|(bound, _)| *bound == le) {
            Some((_, count)) => *count += s.value,
            None => out.push((le, s.value)),
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// The upper bound of the bucket that holds quantile `q` (0 to 1) of the observations in
/// cumulative `buckets` (by increasing bound): the first whose count reaches `q` of the total.
/// `None` with no observation. May be `f64::INFINITY` (the `+Inf` bucket). Unlike Prometheus'
/// `histogram_quantile` it does not interpolate: the answer is a bound, never below the truth.
pub fn quantile_bound(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.iter().map(|(_, count)| *count).fold(0.0, f64::max);
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    buckets
        .iter()
        .find(|(_, count)| *count >= rank)
        .map(|(bound, _)| *bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two speakers' lateness histograms, as prometheus-client writes them.
    const TWO_NODES: &str = "\
# HELP swimlb_owner_watch_timer_lateness_seconds How late the owner watch thread's timers fired
# TYPE swimlb_owner_watch_timer_lateness_seconds histogram
swimlb_owner_watch_timer_lateness_seconds_sum 0.25
swimlb_owner_watch_timer_lateness_seconds_count 100
swimlb_owner_watch_timer_lateness_seconds_bucket{le=\"0.0001\"} 90
swimlb_owner_watch_timer_lateness_seconds_bucket{le=\"0.0002\"} 98
swimlb_owner_watch_timer_lateness_seconds_bucket{le=\"0.0004\"} 100
swimlb_owner_watch_timer_lateness_seconds_bucket{le=\"+Inf\"} 100
# TYPE swimlb_owner_watch_takeovers counter
swimlb_owner_watch_takeovers_total{result=\"refuted\"} 2
swimlb_owner_watch_timer_lateness_seconds_bucket{le=\"0.0001\"} 50
swimlb_owner_watch_timer_lateness_seconds_bucket{le=\"0.0002\"} 60
swimlb_owner_watch_timer_lateness_seconds_bucket{le=\"0.0004\"} 98
swimlb_owner_watch_timer_lateness_seconds_bucket{le=\"+Inf\"} 100
swimlb_owner_watch_takeovers_total{result=\"confirmed\"} 1
swimlb_owner_watch_takeovers_total{result=\"refuted\"} 3 1700000000000
";

    #[test]
    fn samples_are_read_with_their_labels_and_values_and_comments_are_skipped() {
        let s = samples(TWO_NODES);
        assert_eq!(s.len(), 13);
        assert_eq!(s[0].name, "swimlb_owner_watch_timer_lateness_seconds_sum");
        assert!(s[0].labels.is_empty());
        assert_eq!(s[0].value, 0.25);
        assert_eq!(s[5].label("le"), Some("+Inf"));
        assert_eq!(s[5].value, 100.0);
        assert_eq!(s[12].value, 3.0, "the timestamp is not the value");
    }

    #[test]
    fn quoted_label_values_may_hold_braces_commas_and_escapes() {
        let s = samples("x_total{a=\"}{,\",b=\"say \\\"hi\\\"\\n\"} 7\n");
        assert_eq!(
            s[0].labels,
            vec![
                ("a".to_string(), "}{,".to_string()),
                ("b".to_string(), "say \"hi\"\n".to_string())
            ]
        );
        assert_eq!(s[0].value, 7.0);
    }

    #[test]
    fn malformed_lines_are_skipped_not_fatal() {
        let text =
            "ok 1\nno_value\nbad{le=\"1\" 3\nbad{le=1} 3\nnan_is_a_value NaN\nworse{ 2\n{} 4\n";
        let s = samples(text);
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["ok", "nan_is_a_value"]);
    }

    #[test]
    fn counters_are_summed_over_nodes_by_label() {
        let s = samples(TWO_NODES);
        let name = "swimlb_owner_watch_takeovers_total";
        assert_eq!(sum(&s, name, Some(("result", "refuted"))), 5.0);
        assert_eq!(sum(&s, name, Some(("result", "confirmed"))), 1.0);
        assert_eq!(sum(&s, name, None), 6.0);
        assert_eq!(sum(&s, "absent_total", None), 0.0);
    }

    #[test]
    fn buckets_of_two_nodes_add_up_by_bound() {
        let b = buckets(
            &samples(TWO_NODES),
            "swimlb_owner_watch_timer_lateness_seconds",
        );
        assert_eq!(
            b,
            vec![
                (0.0001, 140.0),
                (0.0002, 158.0),
                (0.0004, 198.0),
                (f64::INFINITY, 200.0)
            ]
        );
    }

    #[test]
    fn the_p99_is_the_upper_bound_of_the_bucket_that_holds_it() {
        let b = buckets(
            &samples(TWO_NODES),
            "swimlb_owner_watch_timer_lateness_seconds",
        );
        // 99 % of 200 is 198: the 0.4 ms bucket holds the 198th observation.
        assert_eq!(quantile_bound(&b, 0.99), Some(0.0004));
        assert_eq!(quantile_bound(&b, 0.5), Some(0.0001));
        assert_eq!(quantile_bound(&b, 0.79), Some(0.0002));
        // Only the +Inf bucket reaches the total: its bound is infinite.
        let tail = [(0.001, 90.0), (f64::INFINITY, 100.0)];
        assert_eq!(quantile_bound(&tail, 0.99), Some(f64::INFINITY));
    }

    #[test]
    fn no_observation_has_no_quantile() {
        assert_eq!(quantile_bound(&[], 0.99), None);
        assert_eq!(
            quantile_bound(&[(0.001, 0.0), (f64::INFINITY, 0.0)], 0.99),
            None
        );
    }

    #[test]
    fn since_subtracts_the_earlier_answer_series_by_series() {
        let before = samples("a_total{r=\"x\"} 2\nh_bucket{le=\"1\"} 5\n");
        let after = samples("a_total{r=\"x\"} 3\na_total{r=\"y\"} 4\nh_bucket{le=\"1\"} 9\n");
        let d = since(&before, &after);
        assert_eq!(sum(&d, "a_total", Some(("r", "x"))), 1.0);
        assert_eq!(sum(&d, "a_total", Some(("r", "y"))), 4.0);
        assert_eq!(buckets(&d, "h"), vec![(1.0, 4.0)]);
    }
}
