//! The two text formats of a `/metrics` answer, and which one a client asked for.
//!
//! prometheus-client encodes OpenMetrics 1.0 only. Prometheus asks for OpenMetrics first (its
//! `Accept` header names it) and reads it natively; most other readers of `/metrics` (`curl`,
//! `promtool check metrics`, older scrapers, exporters' test harnesses) speak the classic
//! Prometheus text format 0.0.4, in which OpenMetrics output is subtly wrong: a counter's
//! `# HELP` and `# TYPE` name the family (`x`) while its sample is `x_total`, so the classic
//! parser sees an untyped metric without help. Prometheus' own Go client answers the same way:
//! OpenMetrics only to a client that asks for it ([`Format::negotiate`]), the classic format
//! otherwise ([`to_text`]).
//!
//! The conversion works on the text line by line and never fails: what it does not know it
//! passes through unchanged.
//!
//! - OpenMetrics: <https://github.com/prometheus/OpenMetrics/blob/v1.0.0/specification/OpenMetrics.md>
//! - Classic text format: <https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format>

/// `Content-Type` of an OpenMetrics answer.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of a classic text answer.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A text format of `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text (what prometheus-client writes).
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4.
    Text,
}

impl Format {
    /// The format to answer a request whose `Accept` header is `accept`: the media ranges are
    /// taken by decreasing quality (ties in the header's order) and the first that names one of
    /// the two formats exactly wins; wildcards and an absent header get the classic format, as
    /// Prometheus' Go client (`expfmt.Negotiate`) answers them.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Text;
        };
        let mut ranges: Vec<(f32, &str)> = accept
            .split(',')
            .filter_map(|range| {
                let mut parts = range.split(';');
                let media = parts.next()?.trim();
                let q = parts
                    .filter_map(|p| p.trim().strip_prefix("q="))
                    .find_map(|q| q.trim().parse::<f32>().ok())
                    .unwrap_or(1.0);
                (q > 0.0).then_some((q, media))
            })
            .collect();
        // Stable: equal qualities keep the client's order.
        ranges.sort_by(|a, b| b.0.total_cmp(&a.0));
        ranges
            .iter()
            .find_map(|(_, media)| {
                if media.eq_ignore_ascii_case("application/openmetrics-text") {
                    Some(Format::OpenMetrics)
                } else if media.eq_ignore_ascii_case("text/plain") {
                    Some(Format::Text)
                } else {
                    None
                }
            })
            .unwrap_or(Format::Text)
    }

    /// The `Content-Type` of an answer in this format.
    pub const fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Format::Text => TEXT_CONTENT_TYPE,
        }
    }
}

/// The classic text format of an OpenMetrics exposition.
///
/// - A counter family `x` is described as `x_total` (the name of its sample); its `x_created`
///   samples, which the classic format has no place for, are dropped.
/// - An `info` family `x` becomes the gauge `x_info`; `unknown` becomes `untyped`; a `stateset`
///   becomes a gauge (its samples are already 0 or 1).
/// - `# UNIT` lines and `# EOF` are dropped; `\"` in help text becomes `"`.
/// - Exemplars are dropped; timestamps go from seconds to milliseconds.
pub fn to_text(openmetrics: &str) -> String {
    // The classic format adds a suffix to some names: room for it, so that a large exposition
    // (1.9 MB at 10,000 IPs) is not copied into a buffer twice its size.
    let mut out = String::with_capacity(openmetrics.len() + openmetrics.len() / 8);
    // The current family, as (OpenMetrics name, OpenMetrics type).
    let mut family: Option<(&str, &str)> = None;
    // A `# HELP` waits for its `# TYPE`, which may rename the family.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some((name, text)) = help.take() {
                // A HELP without TYPE: keep it as it was.
                push_help(&mut out, name, "", text);
            }
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (suffix, classic_kind) = match kind {
                "counter" => ("_total", "counter"),
                "info" => ("_info", "gauge"),
                "unknown" => ("", "untyped"),
                "stateset" => ("", "gauge"),
                other => ("", other),
            };
            match help.take() {
                Some((help_name, text)) if help_name == name => {
                    push_help(&mut out, name, suffix, text);
                }
                Some((help_name, text)) => push_help(&mut out, help_name, "", text),
                None => {}
            }
            out.push_str("# TYPE ");
            out.push_str(name);
            out.push_str(suffix);
            out.push(' ');
            out.push_str(classic_kind);
            out.push('\n');
            family = Some((name, kind));
        } else if line.starts_with('#') || line.trim().is_empty() {
            // `# UNIT`, `# EOF`, anything else OpenMetrics does not define: no place for it.
        } else {
            if let Some((name, text)) = help.take() {
                push_help(&mut out, name, "", text);
            }
            if let Some((name, "counter")) = family
                && line
                    .strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with("_created"))
            {
                continue;
            }
            push_sample(&mut out, line);
        }
    }
    if let Some((name, text)) = help {
        push_help(&mut out, name, "", text);
    }
    out
}

fn push_help(out: &mut String, name: &str, suffix: &str, text: &str) {
    out.push_str("# HELP ");
    out.push_str(name);
    out.push_str(suffix);
    out.push(' ');
    // OpenMetrics escapes `\`, `"` and newlines in help text; the classic format only `\` and
    // newlines.
    out.push_str(&text.replace("\\\"", "\""));
    out.push('\n');
}

/// Writes `name{labels} value [timestamp]` of an OpenMetrics sample line, without its exemplar
/// and with the timestamp in milliseconds.
fn push_sample(out: &mut String, line: &str) {
    let split = series_end(line);
    let (series, rest) = line.split_at(split);
    let mut words = rest.split_whitespace();
    out.push_str(series);
    if let Some(value) = words.next() {
        out.push(' ');
        out.push_str(value);
    }
    match words.next() {
        // An exemplar follows.
        Some("#") | None => {}
        Some(timestamp) => {
            out.push(' ');
            match timestamp.parse::<f64>() {
                Ok(seconds) => out.push_str(&format!("{}", (seconds * 1000.0).round() as i64)),
                Err(_) => out.push_str(timestamp),
            }
        }
    }
    out.push('\n');
}

/// Where the series (name and label set) of a sample line ends: at the first space outside the
/// quoted label values.
fn series_end(line: &str) -> usize {
    let bytes = line.as_bytes();
    let (mut in_labels, mut in_quotes, mut escaped) = (false, false, false);
    for (i, &b) in bytes.iter().enumerate() {
        if in_quotes {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_quotes = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'{' => in_labels = true,
            b'}' => in_labels = false,
            b'"' if in_labels => in_quotes = true,
            b' ' if !in_labels => return i,
            _ => {}
        }
    }
    line.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What prometheus-client 0.25 writes for a counter, a labelled gauge, a histogram and an
    /// empty-help gauge.
    const OPENMETRICS: &str = "\
# HELP swimlb_member_down Members declared down.
# TYPE swimlb_member_down counter
swimlb_member_down_total 3
# HELP swimlb_members Gossip members by state.
# TYPE swimlb_members gauge
swimlb_members{state=\"alive\"} 3
swimlb_members{state=\"down\"} 0
# HELP swimlb_failover_detect_seconds Detection.
# TYPE swimlb_failover_detect_seconds histogram
swimlb_failover_detect_seconds_sum 0.5
swimlb_failover_detect_seconds_count 1
swimlb_failover_detect_seconds_bucket{le=\"0.5\"} 1
swimlb_failover_detect_seconds_bucket{le=\"+Inf\"} 1
# EOF
";

    const TEXT: &str = "\
# HELP swimlb_member_down_total Members declared down.
# TYPE swimlb_member_down_total counter
swimlb_member_down_total 3
# HELP swimlb_members Gossip members by state.
# TYPE swimlb_members gauge
swimlb_members{state=\"alive\"} 3
swimlb_members{state=\"down\"} 0
# HELP swimlb_failover_detect_seconds Detection.
# TYPE swimlb_failover_detect_seconds histogram
swimlb_failover_detect_seconds_sum 0.5
swimlb_failover_detect_seconds_count 1
swimlb_failover_detect_seconds_bucket{le=\"0.5\"} 1
swimlb_failover_detect_seconds_bucket{le=\"+Inf\"} 1
";

    #[test]
    fn a_counter_is_described_by_its_sample_name_and_eof_goes() {
        assert_eq!(to_text(OPENMETRICS), TEXT);
    }

    #[test]
    fn info_unknown_and_units_take_their_classic_forms() {
        let om = "# HELP b Build.\n# TYPE b info\nb_info{version=\"1\"} 1\n\
                  # HELP t_celsius Temp.\n# TYPE t_celsius unknown\n# UNIT t_celsius celsius\nt_celsius 2\n# EOF\n";
        assert_eq!(
            to_text(om),
            "# HELP b_info Build.\n# TYPE b_info gauge\nb_info{version=\"1\"} 1\n\
             # HELP t_celsius Temp.\n# TYPE t_celsius untyped\nt_celsius 2\n"
        );
    }

    #[test]
    fn exemplars_and_created_go_and_timestamps_become_milliseconds() {
        let om = "# HELP c C.\n# TYPE c counter\n\
                  c_total{path=\"/a b # {x}\"} 5 1700000000.25 # {trace=\"t\"} 1.0\n\
                  c_created 1700000000.0\n# HELP g G \\\"quoted\\\".\n# TYPE g gauge\ng 1 # {a=\"b\"} 1\n";
        assert_eq!(
            to_text(om),
            "# HELP c_total C.\n# TYPE c_total counter\n\
             c_total{path=\"/a b # {x}\"} 5 1700000000250\n\
             # HELP g G \"quoted\".\n# TYPE g gauge\ng 1\n"
        );
    }

    #[test]
    fn garbage_passes_through_without_a_panic() {
        for input in [
            "",
            "x",
            "# HELP",
            "# TYPE",
            "{\"",
            "a{b=\"\\",
            "# HELP a\nb 1 2 3",
        ] {
            let _ = to_text(input);
        }
        assert_eq!(to_text("a{b=\"c\"}"), "a{b=\"c\"}\n");
    }

    proptest::proptest! {
        #[test]
        fn any_text_and_any_accept_header_are_answered_without_a_panic(
            text in r#"(# (HELP|TYPE|UNIT) )?[a-z_{}=" #\\\n.0-9]{0,80}"#,
            accept in "[a-z/;=,.* 0-9-]{0,40}",
        ) {
            let _ = to_text(&text);
            let _ = Format::negotiate(Some(&accept));
        }
    }

    #[test]
    fn prometheus_gets_openmetrics_and_everyone_else_the_classic_format() {
        // Prometheus 2.42's scrape header.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::negotiate(None), Format::Text);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Text);
        assert_eq!(
            Format::negotiate(Some("text/plain;q=0.9, application/openmetrics-text;q=0.8")),
            Format::Text
        );
        assert_eq!(
            Format::negotiate(Some("text/plain;q=0.5, Application/OpenMetrics-Text")),
            Format::OpenMetrics
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=0, text/html")),
            Format::Text
        );
        assert_eq!(
            Format::OpenMetrics.content_type(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
    }
}
