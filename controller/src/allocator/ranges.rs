//! A pool's ranges and their used addresses: the lowest free address in O(log n) amortised.

use std::collections::BTreeSet;
use std::net::IpAddr;

use swimlb_config::pools::{AddressRange, Family, Pool, is_buggy, u128_to_ip};

/// One range of a pool and its used addresses.
#[derive(Clone, Debug)]
pub(super) struct RangeState {
    pub(super) range: AddressRange,
    pub(super) used: BTreeSet<u128>,
    /// Every address of the range below the cursor is used or skipped.
    pub(super) cursor: u128,
}

impl RangeState {
    fn new(range: AddressRange) -> Self {
        Self {
            range,
            used: BTreeSet::new(),
            cursor: range.start,
        }
    }

    /// The lowest free address, moving the cursor up to it.
    pub(super) fn lowest_free(&mut self, avoid_buggy: bool) -> Option<u128> {
        let end = self.range.end;
        let mut n = self.cursor;
        if n > end {
            return None;
        }
        let mut used = self.used.range(n..=end).peekable();
        let found = loop {
            if n > end {
                break None;
            }
            if avoid_buggy && is_buggy(self.range.family, n) {
                match n.checked_add(1) {
                    Some(next) => n = next,
                    None => break None,
                }
                continue;
            }
            while used.next_if(|u| **u < n).is_some() {}
            if used.peek().is_some_and(|u| **u == n) {
                match n.checked_add(1) {
                    Some(next) => n = next,
                    None => break None,
                }
                continue;
            }
            break Some(n);
        };
        self.cursor = found.unwrap_or(n.max(self.cursor));
        found
    }
}

#[derive(Clone, Debug)]
pub(super) struct PoolState {
    pub(super) pool: Pool,
    pub(super) ranges: Vec<RangeState>,
}

impl PoolState {
    pub(super) fn new(pool: Pool) -> Self {
        let ranges = pool.ranges.iter().copied().map(RangeState::new).collect();
        Self { pool, ranges }
    }

    pub(super) fn range_of(&mut self, ip: IpAddr) -> Option<&mut RangeState> {
        self.ranges.iter_mut().find(|r| r.range.contains(ip))
    }

    pub(super) fn lowest_free(&mut self, family: Family) -> Option<IpAddr> {
        let avoid = self.pool.avoid_buggy_ips;
        self.ranges
            .iter_mut()
            .filter(|r| r.range.family == family)
            .find_map(|r| r.lowest_free(avoid))
            .map(|n| u128_to_ip(family, n))
    }
}
