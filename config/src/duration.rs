//! Durations as people write them in configuration files: `900ms`, `1s`, `1.5s`, `2m`, `1m30s`.
//!
//! Units are `ms`, `s`, `m` and `h`; a value is one or more number+unit parts; a bare number is
//! rejected (a file that says `interval: 1` is ambiguous). Parsing is pure and never panics.

use std::time::Duration;

/// Why a duration string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The string is empty.
    #[error("empty duration")]
    Empty,
    /// A number without a unit.
    #[error("`{0}` has no unit (use ms, s, m or h, for example `1s`)")]
    MissingUnit(String),
    /// A unit this parser does not know.
    #[error("`{0}`: unknown unit `{1}` (use ms, s, m or h)")]
    UnknownUnit(String, String),
    /// Not a number where one was expected.
    #[error("`{0}` is not a duration (for example `900ms`, `1s`, `1m30s`)")]
    Malformed(String),
    /// Too large to represent.
    #[error("`{0}` is too large")]
    Overflow(String),
}

/// Parses `text` into a [`Duration`].
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if number_len == 0 {
            return Err(DurationError::Malformed(s.to_string()));
        }
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        if unit_len == 0 {
            return Err(DurationError::MissingUnit(s.to_string()));
        }
        let (unit, after) = after.split_at(unit_len);
        let scale_ms: f64 = match unit {
            "ms" => 1.0,
            "s" => 1_000.0,
            "m" => 60_000.0,
            "h" => 3_600_000.0,
            other => return Err(DurationError::UnknownUnit(s.to_string(), other.to_string())),
        };
        let value: f64 = number
            .parse()
            .map_err(|_| DurationError::Malformed(s.to_string()))?;
        let ms = value * scale_ms;
        if !ms.is_finite() || ms > 1e15 {
            return Err(DurationError::Overflow(s.to_string()));
        }
        // Sub-millisecond precision is not meaningful for any setting here; round to microseconds.
        let part = Duration::from_micros((ms * 1_000.0).round() as u64);
        total = total
            .checked_add(part)
            .ok_or_else(|| DurationError::Overflow(s.to_string()))?;
        rest = after;
    }
    Ok(total)
}

/// Formats a duration the way [`parse_duration`] reads it: `900ms`, `1s`, `2.5s`, `1m30s`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_string();
    }
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    if ms.is_multiple_of(60_000) {
        return format!("{}m", ms / 60_000);
    }
    if ms >= 60_000 {
        let minutes = ms / 60_000;
        let rest = Duration::from_millis((ms % 60_000) as u64);
        return format!("{minutes}m{}", format_duration(rest));
    }
    if ms.is_multiple_of(1_000) {
        format!("{}s", ms / 1_000)
    } else {
        let text = format!("{:.3}", ms as f64 / 1_000.0);
        format!("{}s", text.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_forms_people_write() {
        let table = [
            ("900ms", 900),
            ("1s", 1_000),
            ("1.5s", 1_500),
            ("0s", 0),
            ("2m", 120_000),
            ("1m30s", 90_000),
            ("1h", 3_600_000),
            (" 250ms ", 250),
        ];
        for (text, ms) in table {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
    }

    #[test]
    fn rejects_what_is_ambiguous_or_wrong() {
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        assert_eq!(
            parse_duration("1"),
            Err(DurationError::MissingUnit("1".into()))
        );
        assert_eq!(
            parse_duration("1sec"),
            Err(DurationError::UnknownUnit("1sec".into(), "sec".into()))
        );
        assert_eq!(
            parse_duration("s"),
            Err(DurationError::Malformed("s".into()))
        );
        assert_eq!(
            parse_duration("1.2.3s"),
            Err(DurationError::Malformed("1.2.3s".into()))
        );
        assert_eq!(
            parse_duration("-1s"),
            Err(DurationError::Malformed("-1s".into()))
        );
        assert!(matches!(
            parse_duration("99999999999999h"),
            Err(DurationError::Overflow(_))
        ));
    }

    #[test]
    fn formatting_reads_back() {
        for ms in [
            0, 1, 250, 900, 1_000, 1_500, 2_250, 60_000, 90_000, 3_600_000,
        ] {
            let d = Duration::from_millis(ms);
            assert_eq!(
                parse_duration(&format_duration(d)),
                Ok(d),
                "{}",
                format_duration(d)
            );
        }
    }
}
