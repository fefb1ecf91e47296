//! The health checks of a group: `groups[i].checks[j]`.

use std::num::NonZeroU32;
use std::time::Duration;

use serde_json::{Map, Value};

use super::{Check, CheckKind, Walker, join, kind};

impl Walker {
    pub(super) fn check(&mut self, path: &str, v: &Value) -> Option<Check> {
        let map = self.object(path, v, "groups[].checks[]")?;
        let name = self.required_label(path, map);
        let kinds: Vec<&str> = super::keys::CHECK_KINDS
            .into_iter()
            .filter(|k| map.contains_key(*k))
            .collect();
        let kind = match kinds.as_slice() {
            [] => {
                self.error(path, "needs one of `http`, `tcp` or `exec`");
                None
            }
            [one] => self.check_kind(path, one, map),
            many => {
                self.error(
                    path,
                    format!("has {}: a check is exactly one of them", many.join(" and ")),
                );
                None
            }
        };
        if map.contains_key("user")
            && kind.is_some()
            && !matches!(kind, Some(CheckKind::Exec { .. }))
        {
            self.error(&join(path, "user"), "applies to `exec` checks only");
        }
        if !matches!(kind, Some(CheckKind::Http { .. })) {
            for key in ["insecure", "expectStatus"] {
                if map.contains_key(key) && kind.is_some() {
                    self.error(&join(path, key), "applies to `http` checks only");
                }
            }
        }
        let interval = match map.get("interval") {
            Some(v) => self.duration(&join(path, "interval"), v),
            None => Some(Duration::from_secs(1)),
        };
        if interval.is_some_and(|d| d < Duration::from_millis(10)) {
            self.error(&join(path, "interval"), "must be at least `10ms`");
        }
        let timeout = match map.get("timeout") {
            Some(v) => self.duration(&join(path, "timeout"), v),
            None => interval,
        };
        if timeout.is_some_and(|d| d.is_zero()) {
            self.error(&join(path, "timeout"), "must be more than `0s`");
        }
        if let (Some(i), Some(t)) = (interval, timeout)
            && t > i
        {
            self.error(
                &join(path, "timeout"),
                format!(
                    "{} is longer than the interval ({}): runs would overlap",
                    crate::duration::format_duration(t),
                    crate::duration::format_duration(i)
                ),
            );
        }
        let count = |w: &mut Walker, key: &str| match map.get(key) {
            Some(v) => w
                .integer(&join(path, key), v, 1, 1000)
                .and_then(|n| NonZeroU32::new(n as u32)),
            None => NonZeroU32::new(1),
        };
        let rise = count(self, "rise");
        let fall = count(self, "fall");
        let weight = match map.get("weight") {
            Some(v) => self
                .integer(&join(path, "weight"), v, -253, 253)
                .map(|n| n as i32),
            None => Some(0),
        };
        Some(Check {
            name: name?,
            kind: kind?,
            interval: interval?,
            timeout: timeout?,
            rise: rise?,
            fall: fall?,
            weight: weight?,
        })
    }

    fn check_kind(&mut self, path: &str, key: &str, map: &Map<String, Value>) -> Option<CheckKind> {
        let here = join(path, key);
        let v = map.get(key)?;
        match key {
            "http" | "https" => {
                let url = self.string(&here, v)?;
                let url = if key == "https" && !url.contains("://") {
                    format!("https://{url}")
                } else {
                    url
                };
                let rest = url
                    .strip_prefix("http://")
                    .or_else(|| url.strip_prefix("https://"));
                let Some(rest) = rest else {
                    self.error(
                        &here,
                        format!("`{url}` must start with http:// or https://"),
                    );
                    return None;
                };
                let authority = rest.split('/').next().unwrap_or("");
                if authority.is_empty() {
                    self.error(&here, format!("`{url}` has no host"));
                    return None;
                }
                if let Some(problem) = url_problem(&url, authority) {
                    self.error(&here, format!("`{url}`: {problem}"));
                    return None;
                }
                let insecure = map
                    .get("insecure")
                    .and_then(|v| self.bool(&join(path, "insecure"), v))
                    .unwrap_or(false);
                if insecure && url.starts_with("http://") {
                    self.error(
                        &join(path, "insecure"),
                        "applies to `https://` URLs only (a plain `http://` check has no certificate)",
                    );
                }
                let expect_status = map
                    .get("expectStatus")
                    .and_then(|v| self.integer(&join(path, "expectStatus"), v, 100, 599))
                    .map(|n| n as u16);
                Some(CheckKind::Http {
                    url,
                    insecure,
                    expect_status,
                })
            }
            "tcp" => {
                let target = self.string(&here, v)?;
                match target.rsplit_once(':') {
                    Some((host, port))
                        if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) =>
                    {
                        Some(CheckKind::Tcp { target })
                    }
                    _ => {
                        self.error(&here, format!("`{target}` is not `host:port`"));
                        None
                    }
                }
            }
            "exec" => {
                let argv: Vec<String> = match v {
                    Value::String(s) => s.split_whitespace().map(str::to_string).collect(),
                    Value::Array(items) => {
                        let mut argv = Vec::new();
                        for (k, item) in items.iter().enumerate() {
                            argv.push(self.string(&format!("{here}[{k}]"), item)?);
                        }
                        argv
                    }
                    other => {
                        self.error(
                            &here,
                            format!("expected a command line or a list, found {}", kind(other)),
                        );
                        return None;
                    }
                };
                if argv.is_empty() {
                    self.error(&here, "empty command");
                    return None;
                }
                let user = match map.get("user") {
                    Some(v) => Some(self.script_user(&join(path, "user"), v)?),
                    None => self.script_user.clone(),
                };
                Some(CheckKind::Exec { argv, user })
            }
            _ => None,
        }
    }
}

/// What the speaker's HTTP check could never request in `url` (whose `authority` is not empty):
/// a port that is not a number, an unclosed `[`, a space or a control character.
fn url_problem(url: &str, authority: &str) -> Option<&'static str> {
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("contains a space or a control character (percent-encode it)");
    }
    let port = if let Some(bracketed) = authority.strip_prefix('[') {
        let Some((host, after)) = bracketed.split_once(']') else {
            return Some("`[` without `]` around an IPv6 address");
        };
        if host.is_empty() {
            return Some("has no host");
        }
        match after {
            "" => return None,
            p => match p.strip_prefix(':') {
                Some(port) => port,
                None => return Some("only `:port` may follow `]`"),
            },
        }
    } else {
        match authority.rsplit_once(':') {
            Some(("", _)) => return Some("has no host"),
            Some((_, port)) => port,
            None => return None,
        }
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 => None,
        _ => Some("the port is not a number from 1 to 65535"),
    }
}
