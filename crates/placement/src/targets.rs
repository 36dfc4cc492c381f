//! How many PG slots each device should hold: its weight share, capped where the failure-domain
//! rule makes the share impossible.

use crate::compute::Candidate;
use std::collections::BTreeMap;

/// The most copies of one PG that any single failure domain may hold: the smallest `c` with
/// `sum over domains of min(c, devices in domain) >= width`, so copies are spread over as many
/// domains as exist (1 when there are at least `width` domains).
pub(crate) fn domain_cap(cands: &[Candidate], width: usize) -> usize {
    let sizes = domain_sizes(cands);
    (1..=width.max(1))
        .find(|&c| sizes.values().map(|&n| n.min(c)).sum::<usize>() >= width)
        .unwrap_or(width.max(1))
}

/// The target number of PG slots of each candidate (same order as `cands`), summing to
/// `pg_count * width`.
///
/// First the slots are shared among failure domains by weight, a domain holding at most
/// `pg_count * min(cap, its devices)`; then each domain's share is split among its devices by
/// weight, a device holding at most `pg_count` (one copy per PG). Whatever a cap cuts off goes to
/// the others in proportion to their weights ("water filling").
pub(crate) fn slot_targets(cands: &[Candidate], pg_count: u32, width: usize) -> Vec<f64> {
    let cap = domain_cap(cands, width);
    let pgs = f64::from(pg_count);
    let mut domains: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, c) in cands.iter().enumerate() {
        domains.entry(c.domain).or_default().push(i);
    }
    let domain_items: Vec<(f64, f64)> = domains
        .values()
        .map(|members| {
            let weight: f64 = members.iter().map(|&i| f64::from(cands[i].weight)).sum();
            (weight, pgs * members.len().min(cap) as f64)
        })
        .collect();
    let domain_targets = water_fill(pgs * width as f64, &domain_items);
    let mut targets = vec![0.0; cands.len()];
    for (members, total) in domains.values().zip(domain_targets) {
        let items: Vec<(f64, f64)> = members
            .iter()
            .map(|&i| (f64::from(cands[i].weight), pgs))
            .collect();
        for (&i, t) in members.iter().zip(water_fill(total, &items)) {
            targets[i] = t;
        }
    }
    targets
}

/// Shares `total` among items `(weight, cap)` in proportion to weight, never giving an item more
/// than its cap; what capped items cannot take is shared among the others.
fn water_fill(total: f64, items: &[(f64, f64)]) -> Vec<f64> {
    let mut out = vec![0.0; items.len()];
    let mut fixed = vec![false; items.len()];
    loop {
        let taken: f64 = (0..items.len()).filter(|&i| fixed[i]).map(|i| out[i]).sum();
        let remaining = (total - taken).max(0.0);
        let free_weight: f64 = (0..items.len())
            .filter(|&i| !fixed[i])
            .map(|i| items[i].0)
            .sum();
        if free_weight <= 0.0 {
            return out;
        }
        let mut capped_any = false;
        for i in 0..items.len() {
            if fixed[i] {
                continue;
            }
            let share = remaining * items[i].0 / free_weight;
            if share > items[i].1 {
                out[i] = items[i].1;
                fixed[i] = true;
                capped_any = true;
            } else {
                out[i] = share;
            }
        }
        if !capped_any {
            return out;
        }
    }
}

fn domain_sizes(cands: &[Candidate]) -> BTreeMap<u64, usize> {
    let mut sizes = BTreeMap::new();
    for c in cands {
        *sizes.entry(c.domain).or_insert(0) += 1;
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_types::DeviceId;

    fn cand(id: u32, domain: u64, weight: u32) -> Candidate {
        Candidate {
            id: DeviceId(id),
            domain,
            weight,
        }
    }

    #[test]
    fn equal_weights_share_equally() {
        let cands: Vec<_> = (0..6).map(|i| cand(i, u64::from(i / 2), 10)).collect();
        let t = slot_targets(&cands, 100, 3);
        assert!(t.iter().all(|&x| (x - 50.0).abs() < 1e-9), "{t:?}");
    }

    #[test]
    fn a_heavy_host_is_capped_at_one_copy_per_pg() {
        // Host 0 has 10x the weight but may hold only one copy of each of the 100 PGs.
        let cands = vec![
            cand(0, 0, 100),
            cand(1, 1, 10),
            cand(2, 2, 10),
            cand(3, 3, 10),
        ];
        let t = slot_targets(&cands, 100, 3);
        assert!((t[0] - 100.0).abs() < 1e-9, "{t:?}");
        for x in &t[1..] {
            assert!((x - 200.0 / 3.0).abs() < 1e-9, "{t:?}");
        }
        assert!((t.iter().sum::<f64>() - 300.0).abs() < 1e-9);
    }

    #[test]
    fn domain_cap_spreads_as_widely_as_possible() {
        let two_hosts = vec![cand(0, 0, 1), cand(1, 1, 1), cand(2, 1, 1), cand(3, 1, 1)];
        assert_eq!(domain_cap(&two_hosts, 3), 2);
        let lopsided = vec![cand(0, 0, 1), cand(1, 1, 1), cand(2, 1, 1), cand(3, 1, 1)];
        assert_eq!(domain_cap(&lopsided, 4), 3);
        let many: Vec<_> = (0..5).map(|i| cand(i, u64::from(i), 1)).collect();
        assert_eq!(domain_cap(&many, 3), 1);
    }
}
