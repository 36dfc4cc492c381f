//! Choosing the primary (first member) of each PG so that primaries, which serve all reads and
//! order all writes, are spread like the data.
//!
//! A device's primary target is its share of the pool's members: `count * pg_count / slots`.
//! Each PG starts with its current first member (kept from the previous map when it is still
//! there, so primaries stay put). Then, while a PG's primary is more than one above another
//! member relative to their targets, that member becomes the primary (the old primary takes its
//! place in the order). Each swap lowers the sum of squared deviations, so the loop ends.

use crate::assign::Assignment;

const EPS: f64 = 1e-9;

pub(crate) fn balance_primaries(a: &mut Assignment<'_>) {
    let slots: u32 = a.counts.iter().sum();
    if slots == 0 {
        return;
    }
    let filled_pgs = a.pgs.iter().filter(|m| !m.is_empty()).count() as f64;
    let targets: Vec<f64> = a
        .counts
        .iter()
        .map(|&c| f64::from(c) * filled_pgs / f64::from(slots))
        .collect();
    let mut primaries = vec![0u32; a.cands.len()];
    for members in &a.pgs {
        if let Some(&p) = members.first() {
            primaries[p] += 1;
        }
    }
    let dev = |primaries: &[u32], d: usize| f64::from(primaries[d]) - targets[d];
    // Each pass either swaps or ends; each swap lowers the squared deviation sum, so the number
    // of passes is bounded; the cap only guards against a float surprise.
    for _ in 0..a.pgs.len() * 4 + 16 {
        let mut swapped = false;
        for members in a.pgs.iter_mut() {
            let Some(&p) = members.first() else { continue };
            let best = (1..members.len()).min_by(|&x, &y| {
                dev(&primaries, members[x])
                    .total_cmp(&dev(&primaries, members[y]))
                    .then(x.cmp(&y))
            });
            let Some(pos) = best else { continue };
            let q = members[pos];
            if dev(&primaries, p) - dev(&primaries, q) > 1.0 + EPS {
                members.swap(0, pos);
                primaries[p] -= 1;
                primaries[q] += 1;
                swapped = true;
            }
        }
        if !swapped {
            return;
        }
    }
}
