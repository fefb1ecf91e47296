//! What the API server's RBAC (and the Node authorizer) made of a user's requests, from its
//! audit log: refused (403), retried (429), failed otherwise, and what was answered.

use std::collections::BTreeSet;

use swimlb_control_plane::control_plane::AuditRecord;

/// What the API server answered a user's requests, from its audit log.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// Requests of the user.
    pub requests: usize,
    /// The requests the authorizers refused (403).
    pub refused: Vec<AuditRecord>,
    /// The requests the server asked to retry (429): a watch of a custom resource while the
    /// API server's watch cache for it still initializes, just after its CRD was created.
    pub retried: Vec<AuditRecord>,
    /// The requests that failed otherwise: neither answered (2xx), retried, nor an expected
    /// 404 (a missing object) or 409 (a conflict the client resolves).
    pub failed: Vec<AuditRecord>,
    /// What was answered, as `verb resource`.
    pub used: BTreeSet<String>,
}

/// The verdict of the audit log `log` on the requests of `user`.
pub fn audited(log: &[AuditRecord], user: &str) -> Verdict {
    let mut out = Verdict::default();
    for r in log.iter().filter(|r| r.user == user) {
        out.requests += 1;
        match r.code {
            200..=299 => {
                out.used.insert(format!("{} {}", r.verb, r.resource));
            }
            403 => out.refused.push(r.clone()),
            429 => out.retried.push(r.clone()),
            404 | 409 => {}
            _ => out.failed.push(r.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(user: &str, verb: &str, resource: &str, code: u16) -> AuditRecord {
        AuditRecord {
            user: user.to_string(),
            verb: verb.to_string(),
            group: String::new(),
            resource: resource.to_string(),
            namespace: "swimlb-system".to_string(),
            name: String::new(),
            code,
        }
    }

    #[test]
    fn the_audit_log_sorts_a_users_requests_by_their_answer() {
        let sa = "system:serviceaccount:swimlb-system:swimlb-speaker";
        let log = [
            record(sa, "watch", "pods", 200),
            record(sa, "create", "servicel2statuses", 201),
            record(sa, "delete", "servicel2statuses", 404),
            record(sa, "patch", "servicel2statuses", 409),
            record(sa, "get", "secrets", 403),
            record(sa, "patch", "servicel2statuses/status", 500),
            record(sa, "watch", "l2advertisements", 429),
            record("system:node:node1", "get", "secrets", 403),
        ];
        let verdict = audited(&log, sa);
        assert_eq!(verdict.requests, 7);
        assert_eq!(verdict.retried, [log[6].clone()]);
        assert_eq!(verdict.refused, [log[4].clone()]);
        assert_eq!(verdict.failed, [log[5].clone()]);
        assert_eq!(
            verdict.used.into_iter().collect::<Vec<_>>(),
            ["create servicel2statuses", "watch pods"]
        );
    }
}
