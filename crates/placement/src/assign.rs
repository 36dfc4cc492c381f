//! Assigning devices to the `up` sets of one pool's PGs: keep, fill, even out.
//!
//! 1. **Keep**: each PG starts with the devices it had in the previous map that are still
//!    candidates (in their previous order), as long as the failure-domain rule allows.
//! 2. **Fill**: missing slots go to the most under-loaded device (count minus weighted target)
//!    that the PG does not hold yet and whose failure domain still has room in the PG; ties are
//!    broken by a hash of (pool, device, its count), so equal devices share evenly.
//! 3. **Even out**: while some device is more than one PG above another relative to their
//!    targets, one PG moves from the first to the second. Every move lowers the sum of squared
//!    deviations, so the loop ends, and only moves that fix an imbalance happen (minimal
//!    movement).
//! 4. **Primaries**: see [`crate::primary`].
//!
//! Devices are kept in an ordered index by deviation and each device knows the PGs it holds, so
//! a slot costs O(log devices) and a move O(PGs per device): a pool of 2^18 PGs over 10 000
//! devices is placed in about a second (docs/design/placement.md).

use crate::compute::{Candidate, PoolSpec};
use crate::hash::mix;
use crate::primary::balance_primaries;
use crate::targets::{domain_cap, slot_targets};
use basalt_types::{DeviceId, PoolId};
use std::collections::{BTreeSet, HashMap};

/// Deviations are compared in fixed point with this many units per PG, so equal targets give
/// exactly equal keys (no float noise).
const SCALE: f64 = (1u64 << 20) as f64;
/// Differences up to this many units count as equal (rounding of the fixed point).
const SLACK: i64 = 2;

/// The working state of one pool's assignment. Devices are indices into `cands`.
pub(crate) struct Assignment<'a> {
    pub pool: PoolId,
    pub cands: &'a [Candidate],
    pub targets: Vec<f64>,
    pub counts: Vec<u32>,
    /// Ordered members of each PG.
    pub pgs: Vec<Vec<usize>>,
    /// The PGs each device is a member of (any order).
    held: Vec<Vec<u32>>,
    /// Every device by (deviation key, tie, index): the first is the most under-loaded.
    order: BTreeSet<(i64, u64, usize)>,
    pub width: usize,
    /// The most copies of one PG a failure domain may hold.
    pub cap: usize,
    /// How many distinct failure domains every full PG must span: `min(width, domains)`.
    pub spread: usize,
}

/// The ordered `up` set of every PG of the pool.
pub(crate) fn assign_pool(
    pool: PoolId,
    spec: &PoolSpec,
    cands: &[Candidate],
    prev: Option<&[Vec<DeviceId>]>,
) -> Vec<Vec<DeviceId>> {
    let width = usize::from(spec.replicas).min(cands.len());
    let spread = width.min(
        cands
            .iter()
            .map(|c| c.domain)
            .collect::<BTreeSet<_>>()
            .len(),
    );
    let mut a = Assignment {
        pool,
        cands,
        targets: slot_targets(cands, spec.pg_count, width),
        counts: vec![0; cands.len()],
        pgs: vec![Vec::new(); spec.pg_count as usize],
        held: vec![Vec::new(); cands.len()],
        order: BTreeSet::new(),
        width,
        cap: domain_cap(cands, width),
        spread,
    };
    a.keep(prev);
    a.order = (0..cands.len()).map(|d| a.order_key(d)).collect();
    a.fill();
    a.even_out();
    balance_primaries(&mut a);
    a.pgs
        .iter()
        .map(|members| members.iter().map(|&d| cands[d].id).collect())
        .collect()
}

impl Assignment<'_> {
    fn deviation_key(&self, d: usize) -> i64 {
        ((f64::from(self.counts[d]) - self.targets[d]) * SCALE).round() as i64
    }

    fn order_key(&self, d: usize) -> (i64, u64, usize) {
        let tie = mix([
            u64::from(self.pool.0),
            u64::from(self.cands[d].id.0),
            u64::from(self.counts[d]),
        ]);
        (self.deviation_key(d), tie, d)
    }

    /// Adds device `d` as the last member of `pg`, keeping counts, the held lists and the
    /// order index (once built) in step.
    fn join(&mut self, pg: usize, d: usize) {
        let had = self.order.remove(&self.order_key(d));
        self.pgs[pg].push(d);
        self.counts[d] += 1;
        self.held[d].push(pg as u32);
        if had {
            self.order.insert(self.order_key(d));
        }
    }

    /// Replaces `from` by `to` in `pg`, at the same position.
    fn swap_member(&mut self, pg: usize, from: usize, to: usize) {
        for d in [from, to] {
            self.order.remove(&self.order_key(d));
        }
        let pos = self.pgs[pg].iter().position(|&m| m == from);
        let pos = pos.expect("the moving device is a member of the PG");
        self.pgs[pg][pos] = to;
        self.counts[from] -= 1;
        self.counts[to] += 1;
        let held = &mut self.held[from];
        let at = held.iter().position(|&p| p as usize == pg);
        held.swap_remove(at.expect("held lists follow the PGs"));
        self.held[to].push(pg as u32);
        for d in [from, to] {
            self.order.insert(self.order_key(d));
        }
    }

    /// Whether device `d` may join PG `pg` in place of `leaving` (if any): it is not there yet,
    /// its failure domain stays within the cap, and the PG can still end up spread over as many
    /// domains as the pool has (up to its width).
    fn fits(&self, pg: usize, d: usize, leaving: Option<usize>) -> bool {
        let members = &self.pgs[pg];
        if members.contains(&d) {
            return false;
        }
        let domain = self.cands[d].domain;
        let staying = |m: &usize| Some(*m) != leaving;
        let (mut len, mut same, mut distinct) = (1, 1, 1);
        for (i, m) in members.iter().enumerate().filter(|(_, m)| staying(m)) {
            len += 1;
            let md = self.cands[*m].domain;
            if md == domain {
                same += 1;
            } else if !members[..i]
                .iter()
                .any(|x| staying(x) && self.cands[*x].domain == md)
            {
                distinct += 1;
            }
        }
        same <= self.cap && distinct + self.width.saturating_sub(len) >= self.spread
    }

    fn keep(&mut self, prev: Option<&[Vec<DeviceId>]>) {
        let Some(prev) = prev else { return };
        let index: HashMap<DeviceId, usize> = self
            .cands
            .iter()
            .enumerate()
            .map(|(i, c)| (c.id, i))
            .collect();
        for (pg, old) in prev.iter().enumerate().take(self.pgs.len()) {
            for dev in old {
                let Some(&d) = index.get(dev) else { continue };
                if self.pgs[pg].len() < self.width && self.fits(pg, d, None) {
                    self.join(pg, d);
                }
            }
        }
    }

    fn fill(&mut self) {
        for pg in 0..self.pgs.len() {
            while self.pgs[pg].len() < self.width {
                let best = self
                    .order
                    .iter()
                    .map(|&(_, _, d)| d)
                    .find(|&d| self.fits(pg, d, None));
                // The domain cap guarantees a candidate exists while len < width.
                let Some(d) = best else { break };
                self.join(pg, d);
            }
        }
    }

    /// Moves PGs from over- to under-loaded devices until no move lowers the imbalance.
    fn even_out(&mut self) {
        // Each move lowers the sum of squared deviations by more than 0; the bound only guards
        // against a surprise.
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
        let Some(&(lowest, _, _)) = self.order.first() else {
            return false;
        };
        let mut found = None;
        'outer: for &(kf, _, from) in self.order.iter().rev() {
            if kf - lowest <= SCALE as i64 + SLACK {
                break;
            }
            for &(kt, _, to) in &self.order {
                if kf - kt <= SCALE as i64 + SLACK {
                    break;
                }
                if let Some(pg) = self.movable_pg(from, to) {
                    found = Some((pg, from, to));
                    break 'outer;
                }
            }
        }
        let Some((pg, from, to)) = found else {
            return false;
        };
        self.swap_member(pg, from, to);
        true
    }

    /// A PG holding `from` that `to` may take over, chosen by hash so that moves between the
    /// same two devices are spread over the pool's PGs.
    fn movable_pg(&self, from: usize, to: usize) -> Option<usize> {
        self.held[from]
            .iter()
            .map(|&pg| pg as usize)
            .filter(|&pg| self.fits(pg, to, Some(from)))
            .min_by_key(|&pg| (self.tie(pg, to), pg))
    }

    fn tie(&self, pg: usize, d: usize) -> u64 {
        mix([
            u64::from(self.pool.0),
            pg as u64,
            u64::from(self.cands[d].id.0),
        ])
    }
}
