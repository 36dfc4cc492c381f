//! The leader's rule for failure reports (`heartbeat.rs` writes them, `meta/src/report.rs`
//! stores them): which live nodes to mark down although they hold their lease, because their
//! peers cannot reach them. Pure logic with the leader's memory of when it first saw each
//! report and when it marked each node down; `leader.rs` feeds it and applies the verdict
//! (the devices of a node marked down are down in the map).
//!
//! The rule, evaluated on every change of the reports or nodes and when a delay ends:
//! 1. A report counts only while its reporter and the accused are both live (registered) and
//!    the reporter is not itself marked down (a node cut off from everyone reports everyone;
//!    its reports must not take down the healthy ones).
//! 2. **Enough reporters**: repeatedly, the node with the most counting reporters is marked
//!    down if it has at least `min_reporters` (ties: the higher id first); then reports by
//!    nodes marked down stop counting, and the counts are taken again. A node cut off from the
//!    others is reported by all of them; the others are reported only by it.
//! 3. **One broken link** (X and Y report each other, neither has enough reporters, both
//!    reports stood for `mutual_after`): the one of the two with more counting reporters, or
//!    on a tie the higher id, is marked down, so the PGs that need both make progress on the
//!    others. In a two-node cluster (where `min_reporters` = 2 can never be reached) this is
//!    the only way a reported node goes down.
//! 4. **Flap damping**: a node marked down stays down at least `min_down`, even if the reports
//!    are withdrawn earlier; then it is up again as soon as it no longer qualifies.
//!
//! The reports of a node marked down by rule 3 keep counting in rule 2 (it is one end of one
//! broken link, not cut off): when a third node's report of the other end comes late (a
//! longer grace there, a report held up in the metadata store), the late report and the
//! marked node's make enough reporters for the other end, rather than the broken-link rule
//! taking down the late reporter too and leaving the cut-off node the only one up.
//!
//! `min_reporters` = 0 turns the rule off (no node is marked down by reports).

use basalt_types::NodeId;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;
use tokio::time::Instant;

/// How the leader judges failure reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportRules {
    /// Distinct live reporters needed to mark a node down (0: never mark down by reports).
    pub min_reporters: usize,
    /// How long a node marked down by reports stays down at least.
    pub min_down: Duration,
    /// How long two nodes must have reported each other before one of them goes down.
    pub mutual_after: Duration,
}

impl Default for ReportRules {
    fn default() -> ReportRules {
        ReportRules {
            min_reporters: 2,
            min_down: Duration::from_secs(10),
            mutual_after: Duration::from_secs(3),
        }
    }
}

/// The verdict of one evaluation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Nodes to mark down, each with the number of live nodes that report it.
    pub down: BTreeMap<NodeId, usize>,
    /// When the verdict may change without a new report (a damping or a mutual delay ends).
    pub next_due: Option<Instant>,
}

/// The leader's memory between evaluations. Lost with the leadership: a new leader starts its
/// delays afresh, seeded with the nodes its predecessor had marked down ([`Reports::seed`]) so
/// that a marking outlives the change of leader instead of lifting until the delays run again.
#[derive(Debug, Default)]
pub(crate) struct Reports {
    first_seen: HashMap<(NodeId, NodeId), Instant>,
    down_since: HashMap<NodeId, Instant>,
    /// Nodes down by the broken-link rule (not for enough reporters): their own reports still
    /// count. Such a node is one end of one broken link, not cut off; the end it took down may
    /// have been the healthy one, when a third node's report of the other end came late.
    by_link: HashSet<NodeId>,
}

impl Reports {
    /// Takes `nodes` as marked down at `now` (a new leader: the nodes the published map has
    /// down while they are live and reported), so they stay down at least `min_down` and the
    /// rule judges them again from there.
    pub fn seed(&mut self, nodes: impl IntoIterator<Item = NodeId>, now: Instant) {
        for n in nodes {
            self.down_since.entry(n).or_insert(now);
        }
    }

    /// Evaluates `reports` (reporter, accused) with the `live` nodes at `now`.
    pub fn decide(
        &mut self,
        reports: &[(NodeId, NodeId)],
        live: &BTreeSet<NodeId>,
        rules: &ReportRules,
        now: Instant,
    ) -> Verdict {
        if rules.min_reporters == 0 {
            self.first_seen.clear();
            self.down_since.clear();
            return Verdict::default();
        }
        let valid: BTreeSet<(NodeId, NodeId)> = reports
            .iter()
            .copied()
            .filter(|(r, a)| r != a && live.contains(r) && live.contains(a))
            .collect();
        self.first_seen.retain(|k, _| valid.contains(k));
        for k in &valid {
            self.first_seen.entry(*k).or_insert(now);
        }
        self.down_since.retain(|n, _| live.contains(n));
        let mut next_due = None;
        let mut due = |at: Instant| {
            next_due = Some(next_due.map_or(at, |n: Instant| n.min(at)));
        };
        // Damped: marked down less than `min_down` ago.
        let mut down: BTreeSet<NodeId> = BTreeSet::new();
        for (n, since) in &self.down_since {
            let until = *since + rules.min_down;
            if now < until {
                down.insert(*n);
                due(until);
            }
        }
        let mut link: BTreeSet<NodeId> = down
            .iter()
            .filter(|n| self.by_link.contains(n))
            .copied()
            .collect();
        // Reports of nodes that are down count only from those down for a broken link.
        let counts = |down: &BTreeSet<NodeId>, link: &BTreeSet<NodeId>| {
            let mut c: BTreeMap<NodeId, usize> = BTreeMap::new();
            for (r, a) in &valid {
                if !down.contains(a) && (!down.contains(r) || link.contains(r)) {
                    *c.entry(*a).or_insert(0) += 1;
                }
            }
            c
        };
        // Enough reporters, most reported first.
        loop {
            let best = counts(&down, &link)
                .into_iter()
                .filter(|(_, c)| *c >= rules.min_reporters)
                .max_by_key(|(n, c)| (*c, *n));
            let Some((n, _)) = best else { break };
            down.insert(n);
            link.remove(&n);
        }
        // One broken link.
        loop {
            let c = counts(&down, &link);
            let mut pending = None;
            let pair = valid.iter().find(|(x, y)| {
                if x >= y || down.contains(x) || down.contains(y) || !valid.contains(&(*y, *x)) {
                    return false;
                }
                let settled =
                    self.first_seen[&(*x, *y)].max(self.first_seen[&(*y, *x)]) + rules.mutual_after;
                if now < settled {
                    pending = Some(pending.map_or(settled, |p: Instant| p.min(settled)));
                    return false;
                }
                true
            });
            let Some((x, y)) = pair.copied() else {
                if let Some(p) = pending {
                    due(p);
                }
                break;
            };
            let weight = |n: NodeId| (c.get(&n).copied().unwrap_or(0), n);
            let loser = if weight(x) > weight(y) { x } else { y };
            down.insert(loser);
            link.insert(loser);
        }
        self.by_link = link.into_iter().collect();
        self.down_since.retain(|n, _| down.contains(n));
        for n in &down {
            self.down_since.entry(*n).or_insert(now);
            due(self.down_since[n] + rules.min_down);
        }
        let next_due = next_due.filter(|t| *t > now);
        let down = down
            .into_iter()
            .map(|n| (n, valid.iter().filter(|(_, a)| *a == n).count()))
            .collect();
        Verdict { down, next_due }
    }
}

#[cfg(test)]
#[path = "reports_tests.rs"]
mod tests;
