//! What a Service asks for, read from its fields and annotations, and how it may share its
//! addresses. Pure parsing: nothing here looks at the pools' state.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use swimlb_config::pools::{Family, Pool};
use swimlb_config::service::{IpFamilyPolicy, ServicePort, ServiceView, TrafficPolicy};

use super::AllocationError;

/// The annotation prefixes read, in order of precedence for messages.
pub const ANNOTATION_PREFIXES: [&str; 3] = ["swimlb.io/", "metallb.io/", "metallb.universe.tf/"];

/// How a Service may share its addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Sharing {
    pub(super) key: Option<String>,
    pub(super) ports: BTreeSet<ServicePort>,
    pub(super) policy: TrafficPolicy,
    pub(super) selector: BTreeMap<String, String>,
}

impl Sharing {
    pub(super) fn of(svc: &ServiceView, key: Option<String>) -> Self {
        Self {
            key,
            ports: svc.ports.iter().copied().collect(),
            policy: svc.external_traffic_policy,
            selector: svc.selector.clone(),
        }
    }

    pub(super) fn compatible(&self, other: &Sharing) -> bool {
        match (&self.key, &other.key) {
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
        self.ports.is_disjoint(&other.ports)
            && self.policy == other.policy
            && (self.policy == TrafficPolicy::Cluster || self.selector == other.selector)
    }
}

/// What a Service asks for, parsed from its fields and annotations.
#[derive(Clone, Debug)]
pub(super) struct Request {
    pub(super) ips: Vec<IpAddr>,
    pub(super) pool: Option<String>,
    pub(super) sharing: Sharing,
}

fn annotation(svc: &ServiceView, name: &str) -> Result<Option<String>, AllocationError> {
    let mut found: Option<(&str, &str)> = None;
    for prefix in ANNOTATION_PREFIXES {
        let spelled = svc
            .annotations
            .iter()
            .find(|(k, _)| k.strip_prefix(prefix).is_some_and(|rest| rest == name));
        if let Some((key, value)) = spelled {
            let value = value.trim();
            match found {
                Some((first, v)) if v != value => {
                    return Err(AllocationError::ConflictingAnnotations {
                        first: first.to_string(),
                        second: key.clone(),
                    });
                }
                Some(_) => {}
                None => found = Some((key.as_str(), value)),
            }
        }
    }
    Ok(found.map(|(_, v)| v.to_string()).filter(|v| !v.is_empty()))
}

fn parse_ip_list(field: &str, value: &str) -> Result<Vec<IpAddr>, AllocationError> {
    let invalid = || AllocationError::InvalidIp {
        field: field.to_string(),
        value: value.to_string(),
    };
    let ips = value
        .split(',')
        .map(|s| s.trim().parse::<IpAddr>().map_err(|_| invalid()))
        .collect::<Result<Vec<_>, _>>()?;
    let families: BTreeSet<Family> = ips.iter().map(|ip| Family::of(*ip)).collect();
    if ips.is_empty() || ips.len() > 2 || families.len() != ips.len() {
        return Err(invalid());
    }
    Ok(ips)
}

pub(super) fn parse_request(svc: &ServiceView) -> Result<Request, AllocationError> {
    let spec_ip = svc
        .load_balancer_ip
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let spec_ips = spec_ip
        .map(|v| parse_ip_list("spec.loadBalancerIP", v))
        .transpose()?;
    let annotated = annotation(svc, "loadBalancerIPs")?
        .map(|v| parse_ip_list("loadBalancerIPs", &v))
        .transpose()?;
    let ips = match (spec_ips, annotated) {
        (Some(a), Some(b)) => {
            if a.iter().collect::<BTreeSet<_>>() != b.iter().collect::<BTreeSet<_>>() {
                return Err(AllocationError::ConflictingAnnotations {
                    first: "spec.loadBalancerIP".into(),
                    second: "loadBalancerIPs".into(),
                });
            }
            b
        }
        (Some(a), None) => a,
        (None, Some(b)) => b,
        (None, None) => Vec::new(),
    };
    let pool = annotation(svc, "address-pool")?;
    let key = annotation(svc, "allow-shared-ip")?;
    Ok(Request {
        ips,
        pool,
        sharing: Sharing::of(svc, key),
    })
}

/// The families a Service gets from a pool, in request order.
pub(super) fn families_for(svc: &ServiceView, pool: &Pool) -> Result<Vec<Family>, AllocationError> {
    let listed: Vec<Family> = if svc.ip_families.is_empty() {
        Family::ALL.to_vec()
    } else {
        svc.ip_families.clone()
    };
    match svc.ip_family_policy {
        IpFamilyPolicy::RequireDualStack => {
            let wanted = if svc.ip_families.len() == 2 {
                listed
            } else {
                Family::ALL.to_vec()
            };
            match wanted.iter().find(|f| !pool.has_family(**f)) {
                Some(missing) => Err(AllocationError::FamilyUnavailable(*missing)),
                None => Ok(wanted),
            }
        }
        IpFamilyPolicy::PreferDualStack => {
            let have: Vec<Family> = listed
                .iter()
                .copied()
                .filter(|f| pool.has_family(*f))
                .collect();
            if have.is_empty() {
                Err(AllocationError::FamilyUnavailable(listed[0]))
            } else {
                Ok(have)
            }
        }
        IpFamilyPolicy::SingleStack => {
            if svc.ip_families.is_empty() {
                listed
                    .iter()
                    .find(|f| pool.has_family(**f))
                    .map(|f| vec![*f])
                    .ok_or(AllocationError::FamilyUnavailable(Family::V4))
            } else if pool.has_family(listed[0]) {
                Ok(vec![listed[0]])
            } else {
                Err(AllocationError::FamilyUnavailable(listed[0]))
            }
        }
    }
}

/// Whether the families of these addresses are exactly what the Service wants from the pool.
pub(super) fn families_match(svc: &ServiceView, ips: &[IpAddr]) -> Result<(), AllocationError> {
    if !svc.ip_families.is_empty()
        && let Some(ip) = ips
            .iter()
            .find(|ip| !svc.ip_families.contains(&Family::of(**ip)))
    {
        return Err(AllocationError::IpFamilyMismatch(*ip));
    }
    let have: BTreeSet<Family> = ips.iter().map(|ip| Family::of(*ip)).collect();
    match svc.ip_family_policy {
        IpFamilyPolicy::SingleStack if ips.len() > 1 => {
            Err(AllocationError::IpFamilyMismatch(ips[1]))
        }
        IpFamilyPolicy::RequireDualStack if have.len() < 2 => {
            let missing = Family::ALL
                .into_iter()
                .find(|f| !have.contains(f))
                .unwrap_or(Family::V6);
            Err(AllocationError::FamilyUnavailable(missing))
        }
        _ => Ok(()),
    }
}
