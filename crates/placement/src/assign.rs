//! Assigning devices to the PGs of one pool: keep, fill, even out.
//!
//! 1. **Keep**: each PG starts with the devices it had in the previous map that are still
//!    eligible (in their previous order), as long as the failure-domain rule allows.
//! 2. **Fill**: missing slots go to the most under-loaded device (count minus weighted target)
//!    that the PG does not hold yet and whose failure domain still has room in the PG; ties are
//!    broken by a hash of (pool, pg, device), so equal devices share evenly.
//! 3. **Even out**: while some device is more than one PG above another relative to their
//!    targets, one PG moves from the first to the second. Every move lowers the sum of squared
//!    deviations, so the loop ends, and only moves that fix an imbalance happen (minimal
//!    movement).
//! 4. **Primaries**: see [`crate::primary`].

use crate::compute::{Candidate, PoolSpec};
use crate::hash::mix;
use crate::map::PoolMap;
use crate::primary::balance_primaries;
use crate::targets::{domain_cap, slot_targets};
use basalt_types::{DeviceId, PoolId};
use std::collections::{BTreeSet, HashMap};

/// Deviations closer than this are equal (guards float noise in the targets).
const EPS: f64 = 1e-9;

/// The working state of one pool's assignment. Devices are indices into `cands`.
pub(crate) struct Assignment<'a> {
    pub pool: PoolId,
    pub cands: &'a [Candidate],
    pub targets: Vec<f64>,
    pub counts: Vec<u32>,
    /// Ordered members of each PG.
    pub pgs: Vec<Vec<usize>>,
    pub width: usize,
    /// The most copies of one PG a failure domain may hold.
    pub cap: usize,
    /// How many distinct failure domains every full PG must span: `min(width, domains)`.
    pub spread: usize,
}

pub(crate) fn assign_pool(
    pool: PoolId,
    spec: &PoolSpec,
    cands: &[Candidate],
    prev: Option<&PoolMap>,
) -> PoolMap {
    let width = usize::from(spec.replicas).min(cands.len());
    let mut a = Assignment {
        pool,
        cands,
        targets: slot_targets(cands, spec.pg_count, width),
        counts: vec![0; cands.len()],
        pgs: vec![Vec::new(); spec.pg_count as usize],
        width,
        cap: domain_cap(cands, width),
        spread: width.min(
            cands
                .iter()
                .map(|c| c.domain)
                .collect::<BTreeSet<_>>()
                .len(),
        ),
    };
    a.keep(prev);
    a.fill();
    a.even_out();
    balance_primaries(&mut a);
    a.into_pool_map(spec)
}

impl Assignment<'_> {
    fn deviation(&self, d: usize) -> f64 {
        f64::from(self.counts[d]) - self.targets[d]
    }

    /// Whether device `d` may join PG `pg` in place of `leaving` (if any): it is not there yet,
    /// its failure domain stays within the cap, and the PG can still end up spread over as many
    /// domains as the pool has (up to its width).
    fn fits(&self, pg: usize, d: usize, leaving: Option<usize>) -> bool {
        let members = &self.pgs[pg];
        if members.contains(&d) {
            return false;
        }
        let after: Vec<u64> = members
            .iter()
            .filter(|&&m| Some(m) != leaving)
            .map(|&m| self.cands[m].domain)
            .chain(std::iter::once(self.cands[d].domain))
            .collect();
        let domain = self.cands[d].domain;
        if after.iter().filter(|&&x| x == domain).count() > self.cap {
            return false;
        }
        let distinct = after.iter().collect::<BTreeSet<_>>().len();
        let open_slots = self.width.saturating_sub(after.len());
        distinct + open_slots >= self.spread
    }

    fn keep(&mut self, prev: Option<&PoolMap>) {
        let Some(prev) = prev else { return };
        let index: HashMap<DeviceId, usize> = self
            .cands
            .iter()
            .enumerate()
            .map(|(i, c)| (c.id, i))
            .collect();
        for (pg, old) in prev.pgs.iter().enumerate().take(self.pgs.len()) {
            for dev in old {
                let Some(&d) = index.get(dev) else { continue };
                if self.pgs[pg].len() < self.width && self.fits(pg, d, None) {
                    self.pgs[pg].push(d);
                    self.counts[d] += 1;
                }
            }
        }
    }

    fn fill(&mut self) {
        for pg in 0..self.pgs.len() {
            while self.pgs[pg].len() < self.width {
                let best = (0..self.cands.len())
                    .filter(|&d| self.fits(pg, d, None))
                    .min_by(|&x, &y| {
                        let (dx, dy) = (self.deviation(x), self.deviation(y));
                        if (dx - dy).abs() > EPS {
                            dx.total_cmp(&dy)
                        } else {
                            self.tie(pg, x).cmp(&self.tie(pg, y))
                        }
                    });
                // The domain cap guarantees a candidate exists while len < width.
                let Some(d) = best else { break };
                self.pgs[pg].push(d);
                self.counts[d] += 1;
            }
        }
    }

    fn tie(&self, pg: usize, d: usize) -> u64 {
        mix(&[
            u64::from(self.pool.0),
            pg as u64,
            u64::from(self.cands[d].id.0),
        ])
    }

    /// Moves PGs from over- to under-loaded devices until no move lowers the imbalance.
    fn even_out(&mut self) {
        // Each move lowers the sum of squared deviations by more than 0; the bound only guards
        // against a float surprise.
        let max_moves = self.pgs.len() * self.width * 4 + 16;
        for _ in 0..max_moves {
            if !self.move_one() {
                return;
            }
        }
    }

    /// Finds and makes one improving move: the most loaded device gives a PG to the least
    /// loaded device that can take one. Returns false when no move improves the balance.
    fn move_one(&mut self) -> bool {
        let mut order: Vec<usize> = (0..self.cands.len()).collect();
        order.sort_by(|&x, &y| {
            self.deviation(y)
                .total_cmp(&self.deviation(x))
                .then(x.cmp(&y))
        });
        for (oi, &from) in order.iter().enumerate() {
            for &to in order[oi + 1..].iter().rev() {
                if self.deviation(from) - self.deviation(to) <= 1.0 + EPS {
                    break;
                }
                if let Some(pg) = self.movable_pg(from, to) {
                    let pos = self.pgs[pg]
                        .iter()
                        .position(|&m| m == from)
                        .unwrap_or_default();
                    self.pgs[pg][pos] = to;
                    self.counts[from] -= 1;
                    self.counts[to] += 1;
                    return true;
                }
            }
        }
        false
    }

    /// A PG holding `from` that `to` may take over, chosen by hash so that moves between the
    /// same two devices are spread over the pool's PGs.
    fn movable_pg(&self, from: usize, to: usize) -> Option<usize> {
        (0..self.pgs.len())
            .filter(|&pg| self.pgs[pg].contains(&from) && self.fits(pg, to, Some(from)))
            .min_by_key(|&pg| self.tie(pg, to))
    }

    fn into_pool_map(self, spec: &PoolSpec) -> PoolMap {
        let pgs: Vec<Vec<DeviceId>> = self
            .pgs
            .iter()
            .map(|members| members.iter().map(|&d| self.cands[d].id).collect())
            .collect();
        let degraded: BTreeSet<u32> = pgs
            .iter()
            .enumerate()
            .filter(|(_, m)| m.len() < usize::from(spec.replicas))
            .map(|(i, _)| i as u32)
            .collect();
        PoolMap {
            pg_count: spec.pg_count,
            replicas: spec.replicas,
            object_size: spec.object_size,
            failure_domain: spec.failure_domain,
            device_class: spec.device_class.clone(),
            pgs,
            degraded,
        }
    }
}
