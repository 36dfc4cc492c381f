//! Which version of each object is authoritative after a failure: the pure decision at the
//! heart of peering (`peering.rs` gathers its inputs and carries it out).
//!
//! Inputs: the PG's history (intervals since it was last clean, each with the devices that
//! served it), what each reachable device told the primary (its last activation `les`, how far
//! it is known complete `last_complete`), and every reachable device's current version of each
//! object that may differ.
//!
//! A write is acknowledged only once every serving member of its interval has it durable. So a
//! version `v` a device holds is **trusted** (it may have been acknowledged, or a later peering
//! already adopted it) when:
//! 1. `v <= last_complete` of that device (it was current there at a point everything up to it
//!    was reconciled), or
//! 2. `v` was written in an interval older than the device's last activation `les`: that
//!    activation's peering reconciled the device (every version it kept was adopted), or
//! 3. `v` was written in the device's last activated interval and that interval is the PG's
//!    last one: every reachable device that served it holds `v` or newer (a device of the
//!    interval that lacks it proves it was never acknowledged), or
//! 4. `v` was written in the device's last activated interval, and of the later intervals
//!    the first that may have gone active (none of its reachable members was left out of its
//!    activation) decides: a reachable member of it holds exactly `v` (that peering adopted
//!    it: trusted); a reachable member of it that was complete in it (`last_complete` at or
//!    past the interval's start, no backfill) lacks `v` (that peering decided against it: not
//!    trusted). When every reachable member of it was still to be recovered (a member that
//!    was behind may lack `v` only because recovery had not copied it yet), `v` is kept unless
//!    something else proves it was never acknowledged: a reachable member of its own interval
//!    with an older copy, or a member complete in any later interval with an older copy (an
//!    acknowledged `v` is on all of those, or something newer is). An acknowledged write is
//!    never dropped on doubt; a write that was never acknowledged may stay then. When no
//!    later interval may have gone active, rule 3 applies to the device's own interval.
//!
//! A member is a proof of absence (its lacking `v`, or its activation older than an interval)
//! only while it is not **suspect**: when its store last opened it dropped journal records of
//! the PG as a torn tail, which media damage to the newest records looks like, so it may lack
//! writes it acknowledged (`info.rs`; cleared once it holds every authoritative version).
//!
//! The authoritative state of an object is the newest trusted version among the devices that
//! hold complete data (not backfill targets), or "absent" when none is trusted. A serving member
//! whose version is newer than the authority is **divergent** (it holds a write that was never
//! acknowledged): it is reset to the authority before the interval goes active, so the rules
//! above stay true (rule 2 would trust it afterwards). A serving member with an older version
//! (or none) is **behind**: the object is recovered onto it after activation, and writes to the
//! object wait until then. (An older untrusted version can never win: the authority is newer,
//! and the history keeps a member of every interval needed to find it.)
//!
//! A trusted version that a witness of its own interval lacks was adopted by a peering that
//! could not reach the witness, and was never acknowledged: the verdict carries the witness's
//! version as the `floor` of a `Fallback`, to which (or to a copy between it and the
//! authority held by a member of that interval) peering may fall back when no copy of the
//! authority verifies (`fallback.rs`).

use super::messages::{Held, Holding};
use basalt_meta::{PgHistory, PgInterval};
use basalt_types::{DeviceId, ObjectId, Version};
use std::collections::BTreeMap;

/// Every reachable device's current state of one object (absent from the map: the device
/// answered and knows nothing of it).
pub(crate) type Copies = BTreeMap<DeviceId, Held>;

/// The authoritative state of one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Auth {
    Absent,
    /// This version (a tombstone when `deleted`), held by `source`.
    Present {
        version: Version,
        deleted: bool,
        source: DeviceId,
    },
}

impl Auth {
    pub fn version(&self) -> Version {
        match self {
            Auth::Absent => Version::NONE,
            Auth::Present { version, .. } => *version,
        }
    }

    fn matches(&self, copy: Option<&Held>) -> bool {
        match (self, copy) {
            (Auth::Absent, None) => true,
            (
                Auth::Present {
                    version, deleted, ..
                },
                Some(h),
            ) => h.version == *version && h.deleted == *deleted,
            _ => false,
        }
    }
}

/// What peering must do about one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub auth: Auth,
    /// Serving members holding a write that was never acknowledged: reset before activation.
    pub divergent: Vec<DeviceId>,
    /// Serving members lacking the authoritative version: recovered after activation.
    pub behind: Vec<DeviceId>,
    /// Set when the authority was provably never acknowledged although a peering adopted it:
    /// what peering may fall back to when every copy of it fails its checksum (`fallback.rs`).
    pub fallback: Option<Fallback>,
}

/// An authority that a witness of its own interval lacks: a peering adopted it while the
/// witness was unreachable, and it was never acknowledged (an acknowledged write is on every
/// member of its interval). The witness holds every write that was: the interval's primary
/// wrote the object only once it was current on every member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fallback {
    /// The newest version such a witness holds (`Version::NONE`: nothing).
    pub floor: Version,
    /// The copies at or past the floor and older than the authority that members of its
    /// interval hold (each a step of the same run of writes the interval's members applied in
    /// order), newest first: version, tombstone, device.
    pub candidates: Vec<(Version, bool, DeviceId)>,
}

/// Decides one object. `sources` are the reachable devices with complete data, `serving` the
/// interval's members.
pub(crate) fn decide(
    history: &PgHistory,
    holdings: &BTreeMap<DeviceId, Holding>,
    sources: &[DeviceId],
    serving: &[DeviceId],
    copies: &Copies,
) -> Verdict {
    let mut auth = Auth::Absent;
    for dev in sources {
        let Some(copy) = copies.get(dev) else {
            continue;
        };
        let Some(holding) = holdings.get(dev) else {
            continue;
        };
        if !trusted(copy.version, holding, history, holdings, copies)
            || (!copy.deleted && forgotten_delete(copy.version, sources, holdings, copies))
        {
            continue;
        }
        if copy.version > auth.version() {
            auth = Auth::Present {
                version: copy.version,
                deleted: copy.deleted,
                source: *dev,
            };
        }
    }
    // Prefer a serving member as the source (it is reachable for the whole interval).
    if let Auth::Present {
        version, deleted, ..
    } = auth
        && let Some(dev) = serving
            .iter()
            .find(|d| copies.get(d).is_some_and(|h| h.version == version))
    {
        auth = Auth::Present {
            version,
            deleted,
            source: *dev,
        };
    }
    let mut verdict = Verdict {
        auth,
        divergent: Vec::new(),
        behind: Vec::new(),
        fallback: fallback(history, holdings, sources, copies, auth),
    };
    verdict.place_all(serving, copies);
    verdict
}

/// The fallback of an authority a witness (a source, not suspect) of the interval it was
/// written in lacks. `None` when the authority is absent or a tombstone, no witness lacks it,
/// or a device named by that interval or a later one did not answer as a source (it may hold
/// a good copy of the authority, and would bring it back later).
fn fallback(
    history: &PgHistory,
    holdings: &BTreeMap<DeviceId, Holding>,
    sources: &[DeviceId],
    copies: &Copies,
    auth: Auth,
) -> Option<Fallback> {
    let Auth::Present {
        version,
        deleted: false,
        ..
    } = auth
    else {
        return None;
    };
    let own = history
        .intervals
        .iter()
        .find(|i| i.epoch.0 == version.epoch)?;
    let since = history.intervals.iter().filter(|i| i.epoch >= own.epoch);
    if !since
        .flat_map(PgInterval::devices)
        .all(|d| sources.contains(&d))
    {
        return None;
    }
    let floor = own
        .members
        .iter()
        .filter(|m| witness(holdings, m) && older(copies.get(m), version))
        .map(|m| copies.get(m).map_or(Version::NONE, |c| c.version))
        .max()?;
    let mut candidates: Vec<(Version, bool, DeviceId)> = own
        .members
        .iter()
        .filter_map(|m| copies.get(m).map(|c| (c.version, c.deleted, *m)))
        .filter(|(v, _, _)| *v >= floor && *v < version)
        .collect();
    candidates.sort_unstable_by(|a, b| b.cmp(a));
    Some(Fallback { floor, candidates })
}

impl Verdict {
    /// Files every serving member by its copy (after the authority changed, say).
    pub(crate) fn place_all(&mut self, serving: &[DeviceId], copies: &Copies) {
        self.divergent.clear();
        self.behind.clear();
        for dev in serving {
            self.place(*dev, copies.get(dev));
        }
    }

    /// Files serving member `dev`, whose copy is `copy`, as current, divergent or behind.
    fn place(&mut self, dev: DeviceId, copy: Option<&Held>) {
        if self.auth.matches(copy) {
            return;
        }
        // Newer than the authority: a write that was never acknowledged (or the object should
        // not exist at all). Anything else is older and simply needs the authority.
        if copy.is_some_and(|c| c.version > self.auth.version() || self.auth == Auth::Absent) {
            self.divergent.push(dev);
        } else {
            self.behind.push(dev);
        }
    }

    /// Files again, by their own copies (`copies`), serving members whose copies took no part
    /// in deciding the authority: suspect members that look activated last before the PG's
    /// history began (`peering.rs`). What they hold proves nothing and is trusted for nothing;
    /// they are only made current: a copy the authority lacks, or newer than it, is reset, an
    /// older one or none is recovered.
    pub(crate) fn place_stale(&mut self, stale: &[DeviceId], copies: &Copies) {
        for dev in stale {
            self.divergent.retain(|d| d != dev);
            self.behind.retain(|d| d != dev);
            self.place(*dev, copies.get(dev));
        }
    }
}

/// Whether version `v` held by a device that reported `holding` is trusted (module docs).
/// `holdings` names every device that answered (one missing from `copies` has nothing).
fn trusted(
    v: Version,
    holding: &Holding,
    history: &PgHistory,
    holdings: &BTreeMap<DeviceId, Holding>,
    copies: &Copies,
) -> bool {
    if history.intervals.is_empty() {
        // Never activated: whatever the devices hold predates replication of this PG.
        return true;
    }
    let les = holding.info.les;
    if v <= holding.info.last_complete || v.epoch < les.0 {
        return true;
    }
    if v.epoch > les.0 {
        // Written in an interval the device was never activated in: impossible for a write
        // that went through a primary; never trusted.
        return false;
    }
    // A later interval one of whose reachable members was not activated in it never went
    // active (a primary activates every serving member before it serves): it decided nothing.
    // (A suspect member, whose store dropped a journal tail, may have lost its activation
    // record too: its `les` proves nothing either.)
    let may_have_served = |i: &&PgInterval| {
        !i.members
            .iter()
            .filter_map(|m| holdings.get(m))
            .any(|h| !h.info.suspect && h.info.les < i.epoch)
    };
    let later: Vec<&PgInterval> = history
        .intervals
        .iter()
        .filter(|i| i.epoch > les)
        .filter(may_have_served)
        .collect();
    let own = history.intervals.iter().find(|i| i.epoch == les);
    // A reachable member (no backfill under way) of its own interval with an older copy
    // proves `v` was never acknowledged there (rule 3).
    let own_lacks = own.is_some_and(|i| {
        i.members
            .iter()
            .any(|m| witness(holdings, m) && older(copies.get(m), v))
    });
    let Some(next) = later.first() else {
        return own.is_some() && !own_lacks;
    };
    if next
        .members
        .iter()
        .any(|m| holdings.contains_key(m) && copies.get(m).is_some_and(|c| c.version == v))
    {
        return true;
    }
    // Rolled back if a member complete in that interval lacks it; else kept, unless its own
    // interval or a member complete in any later interval proves it was never acknowledged.
    let complete = |i: &PgInterval, m: &DeviceId| {
        witness(holdings, m) && holdings[m].info.last_complete >= Version::new(i.epoch.0, 0)
    };
    if next.members.iter().any(|m| complete(next, m)) {
        return false;
    }
    let later_lacks = later.iter().any(|i| {
        i.members
            .iter()
            .any(|m| complete(i, m) && older(copies.get(m), v))
    });
    !own_lacks && !later_lacks
}

/// Whether a source proves the object (live at `v`) deleted after `v` and the delete
/// forgotten: it holds nothing of the object, yet was complete at or past `v` (it held `v`, or
/// what replaced it), and its log is trimmed at or past `v` (a tombstone the full tombstone
/// table forgot raises it: `reserve_tomb` in the store). A member that missed the delete (down meanwhile) still
/// holds `v` at or below its `last_complete`, which rule 1 trusts: without this, peering
/// would keep the deleted data there, or bring it back everywhere (found by a helper's
/// review). Not a suspect source: its store may have lost the object. Not for a tombstone: one
/// a member still holds is the only record left of its delete (a second review found that
/// resetting it to nothing let a member that missed the delete keep the data at a later
/// peering); the trusted tombstone wins and is recovered onto the others.
fn forgotten_delete(
    v: Version,
    sources: &[DeviceId],
    holdings: &BTreeMap<DeviceId, Holding>,
    copies: &Copies,
) -> bool {
    sources.iter().any(|d| {
        !copies.contains_key(d)
            && witness(holdings, d)
            && holdings[d].info.last_complete >= v
            && holdings[d].log_tail >= v
    })
}

/// Whether what device `m` lacks can prove a version was never acknowledged: it answered, has
/// complete data (no backfill under way), and is not suspect (its store dropped no journal tail
/// of the PG since a peering last brought it up to date: it still holds every write it
/// acknowledged).
fn witness(holdings: &BTreeMap<DeviceId, Holding>, m: &DeviceId) -> bool {
    holdings
        .get(m)
        .is_some_and(|h| h.info.backfill.is_none() && !h.info.suspect)
}

/// Whether a device's copy is older than `v` (or absent).
fn older(copy: Option<&Held>, v: Version) -> bool {
    copy.is_none_or(|c| c.version < v)
}

/// The objects a plan touches, for logs.
pub(crate) fn summary(verdicts: &BTreeMap<ObjectId, Verdict>) -> (usize, usize) {
    let divergent = verdicts
        .values()
        .filter(|v| !v.divergent.is_empty())
        .count();
    let behind = verdicts.values().filter(|v| !v.behind.is_empty()).count();
    (divergent, behind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::info::MemberInfo;
    use basalt_types::{Epoch, PoolId, VolumeId};

    const A: DeviceId = DeviceId(1);
    const B: DeviceId = DeviceId(2);
    const C: DeviceId = DeviceId(3);
    const D: DeviceId = DeviceId(4);
    const X: ObjectId = ObjectId {
        pool: PoolId(1),
        volume: VolumeId(1),
        index: 0,
    };

    fn v(e: u64, s: u64) -> Version {
        Version::new(e, s)
    }

    fn history(intervals: &[(u64, &[DeviceId])]) -> PgHistory {
        PgHistory {
            intervals: intervals
                .iter()
                .map(|(e, m)| PgInterval::new(Epoch(*e), m.to_vec(), 0))
                .collect(),
            clean: Epoch(0),
            strays: Vec::new(),
        }
    }

    /// Devices that answered, each activated last in `les` and complete up to `lc`.
    fn holdings(devs: &[(DeviceId, u64, Version)]) -> BTreeMap<DeviceId, Holding> {
        devs.iter()
            .map(|(d, les, lc)| {
                let h = Holding {
                    info: MemberInfo {
                        les: Epoch(*les),
                        last_complete: *lc,
                        backfill: None,
                        activated: Epoch(*les),
                        suspect: false,
                    },
                    last_update: Version::NONE,
                    log_tail: Version::NONE,
                    objects: 0,
                };
                (*d, h)
            })
            .collect()
    }

    fn copies(cs: &[(DeviceId, Version, bool)]) -> Copies {
        cs.iter()
            .map(|(d, version, deleted)| {
                let h = Held {
                    oid: X,
                    version: *version,
                    deleted: *deleted,
                };
                (*d, h)
            })
            .collect()
    }

    fn run(
        h: &PgHistory,
        hold: &BTreeMap<DeviceId, Holding>,
        serving: &[DeviceId],
        c: &Copies,
    ) -> Verdict {
        let sources: Vec<DeviceId> = hold.keys().copied().collect();
        decide(h, hold, &sources, serving, c)
    }

    /// A member down while an object was deleted and the delete's tombstone forgotten (the
    /// tombstone table was full: the others' logs are trimmed past it) still holds the object
    /// at a version at or below its `last_complete`: the delete wins, its copy is reset.
    #[test]
    fn a_delete_whose_tombstone_was_forgotten_beats_a_member_that_missed_it() {
        let h = history(&[(10, &[A, B, C]), (20, &[A, C])]);
        let mut hold = holdings(&[(A, 20, v(20, 9)), (B, 10, v(10, 5)), (C, 20, v(20, 9))]);
        let c = copies(&[(B, v(10, 3), false)]);
        // The others' logs still hold the change: not this case (a copy is missing there).
        let kept = run(&h, &hold, &[A, B, C], &c);
        assert_eq!(kept.auth, present(v(10, 3), B));
        for d in [A, C] {
            hold.get_mut(&d).unwrap().log_tail = v(20, 7);
        }
        let verdict = run(&h, &hold, &[A, B, C], &c);
        assert_eq!(verdict.auth, Auth::Absent);
        assert_eq!(verdict.divergent, vec![B]);
        assert!(verdict.behind.is_empty(), "{verdict:?}");
        // A suspect source proves nothing by lacking it; another one does.
        hold.get_mut(&A).unwrap().info.suspect = true;
        assert_eq!(run(&h, &hold, &[A, B, C], &c).auth, Auth::Absent);
        hold.get_mut(&C).unwrap().info.suspect = true;
        assert_eq!(run(&h, &hold, &[A, B, C], &c).auth, present(v(10, 3), B));
        // A tombstone one source still holds is not distrusted by another forgetting it: it
        // is the only record of the delete left.
        hold.get_mut(&A).unwrap().info.suspect = false;
        let tomb = copies(&[(C, v(20, 5), true)]);
        let verdict = run(&h, &hold, &[A, B, C], &tomb);
        assert_eq!(
            verdict.auth,
            Auth::Present {
                version: v(20, 5),
                deleted: true,
                source: C
            }
        );
        assert!(verdict.divergent.is_empty(), "{verdict:?}");
    }

    /// A stale member (suspect, activated last before the history began) is filed by its own
    /// copy, whatever `decide` made of it without one: current, reset, or recovered.
    #[test]
    fn a_stale_member_is_filed_by_its_own_copy() {
        let h = history(&[(14, &[A, B, C])]);
        let hold = holdings(&[(A, 14, v(14, 5)), (B, 14, v(14, 5))]);
        let c = copies(&[(A, v(14, 3), false), (B, v(14, 3), false)]);
        // Decided from the sources alone, C (no copy there) is behind.
        let mut verdict = decide(&h, &hold, &[A, B], &[A, B, C], &c);
        assert_eq!(verdict.auth, present(v(14, 3), A));
        assert_eq!(verdict.behind, vec![C]);
        // C holds the authority already: nothing to do.
        let mut same = verdict.clone();
        same.place_stale(&[C], &copies(&[(C, v(14, 3), false)]));
        assert!(
            same.behind.is_empty() && same.divergent.is_empty(),
            "{same:?}"
        );
        // An older copy: recovered.
        let mut old = verdict.clone();
        old.place_stale(&[C], &copies(&[(C, v(10, 2), false)]));
        assert_eq!((old.behind, old.divergent), (vec![C], vec![]));
        // A newer copy than the authority: reset.
        verdict.place_stale(&[C], &copies(&[(C, v(14, 4), false)]));
        assert_eq!((verdict.behind, verdict.divergent), (vec![], vec![C]));
        // An object no source holds, which C holds: reset (deleted), not kept.
        let none = copies(&[]);
        let mut absent = decide(&h, &hold, &[A, B], &[A, B, C], &none);
        assert_eq!(absent.auth, Auth::Absent);
        assert!(absent.divergent.is_empty() && absent.behind.is_empty());
        absent.place_stale(&[C], &copies(&[(C, v(10, 2), false)]));
        assert_eq!(absent.divergent, vec![C]);
    }

    fn present(version: Version, source: DeviceId) -> Auth {
        Auth::Present {
            version,
            deleted: false,
            source,
        }
    }

    #[test]
    fn agreeing_members_need_nothing() {
        let h = history(&[(5, &[A, B, C])]);
        let hold = holdings(&[(A, 5, v(5, 0)), (B, 5, v(5, 0)), (C, 5, v(5, 0))]);
        let c = copies(&[
            (A, v(5, 3), false),
            (B, v(5, 3), false),
            (C, v(5, 3), false),
        ]);
        let out = run(&h, &hold, &[A, B, C], &c);
        assert_eq!(out.auth, present(v(5, 3), A));
        assert!(out.divergent.is_empty() && out.behind.is_empty());
    }

    #[test]
    fn a_write_only_the_old_primary_has_is_rolled_back() {
        // A (primary of interval 5) wrote 5.4 and died before B and C had it: never acked.
        let h = history(&[(5, &[A, B, C])]);
        let hold = holdings(&[(A, 5, v(5, 0)), (B, 5, v(5, 0)), (C, 5, v(5, 0))]);
        let c = copies(&[
            (A, v(5, 4), false),
            (B, v(5, 3), false),
            (C, v(5, 3), false),
        ]);
        let out = run(&h, &hold, &[B, C, A], &c);
        assert_eq!(out.auth, present(v(5, 3), B));
        assert_eq!(out.divergent, [A]);
        assert!(out.behind.is_empty());
    }

    #[test]
    fn a_suspect_member_proves_nothing() {
        // As above, but B's and C's stores dropped a journal tail when they restarted: they
        // may have lost 5.4 although they acknowledged it. Kept, and they are behind.
        let h = history(&[(5, &[A, B, C])]);
        let mut hold = holdings(&[(A, 5, v(5, 0)), (B, 5, v(5, 0)), (C, 5, v(5, 0))]);
        for d in [B, C] {
            hold.get_mut(&d).unwrap().info.suspect = true;
        }
        let c = copies(&[
            (A, v(5, 4), false),
            (B, v(5, 3), false),
            (C, v(5, 3), false),
        ]);
        let out = run(&h, &hold, &[B, C, A], &c);
        assert_eq!(out.auth, present(v(5, 4), A));
        assert!(out.divergent.is_empty());
        assert_eq!(out.behind, [B, C]);
        // One witness that is not suspect is enough to roll it back.
        hold.get_mut(&C).unwrap().info.suspect = false;
        let out = run(&h, &hold, &[B, C, A], &c);
        assert_eq!(out.auth, present(v(5, 3), B));
        assert_eq!(out.divergent, [A]);
    }

    #[test]
    fn a_write_every_reachable_member_has_is_kept() {
        // C is unreachable; A and B both have 5.4: it may have been acknowledged.
        let h = history(&[(5, &[A, B, C])]);
        let hold = holdings(&[(A, 5, v(5, 0)), (B, 5, v(5, 0))]);
        let c = copies(&[(A, v(5, 4), false), (B, v(5, 4), false)]);
        let out = run(&h, &hold, &[A, B], &c);
        assert_eq!(out.auth, present(v(5, 4), A));
        assert!(out.divergent.is_empty() && out.behind.is_empty());
    }

    #[test]
    fn a_member_back_from_an_outage_is_behind() {
        // Interval 7 ran without A and rewrote X; A comes back with its older copy.
        let h = history(&[(5, &[A, B, C]), (7, &[B, C])]);
        let hold = holdings(&[(A, 5, v(5, 0)), (B, 7, v(5, 3)), (C, 7, v(5, 3))]);
        let c = copies(&[
            (A, v(5, 3), false),
            (B, v(7, 2), false),
            (C, v(7, 2), false),
        ]);
        let out = run(&h, &hold, &[A, B, C], &c);
        assert_eq!(out.auth, present(v(7, 2), B));
        assert_eq!(out.behind, [A]);
        assert!(out.divergent.is_empty());
    }

    #[test]
    fn a_rolled_back_write_never_comes_back_with_its_member() {
        // A wrote 5.4 alone and went away; interval 7 (B, C) went active with 5.3 and did not
        // touch X (B and C were complete: activated with last_complete 7.0). A returns:
        // newest-wins would resurrect 5.4 after reads returned 5.3.
        let h = history(&[(5, &[A, B, C]), (7, &[B, C])]);
        let hold = holdings(&[(A, 5, v(5, 0)), (B, 7, v(7, 0)), (C, 7, v(7, 0))]);
        let c = copies(&[
            (A, v(5, 4), false),
            (B, v(5, 3), false),
            (C, v(5, 3), false),
        ]);
        let out = run(&h, &hold, &[B, C, A], &c);
        assert_eq!(out.auth, present(v(5, 3), B));
        assert_eq!(out.divergent, [A]);
    }

    #[test]
    fn a_write_the_next_interval_adopted_is_kept() {
        // A and B had 5.4 (C did not); interval 7 went active with A, B and adopted it. C was
        // away; now only B (from 7) and C answer: 5.4 on B is trusted.
        let h = history(&[(5, &[A, B, C]), (7, &[A, B])]);
        let hold = holdings(&[(B, 7, v(5, 4)), (C, 5, v(5, 0))]);
        let c = copies(&[(B, v(5, 4), false), (C, v(5, 3), false)]);
        let out = run(&h, &hold, &[B, C], &c);
        assert_eq!(out.auth, present(v(5, 4), B));
        assert_eq!(out.behind, [C]);
    }

    #[test]
    fn a_write_the_next_interval_had_not_recovered_yet_is_kept() {
        // A and B acknowledged 5.4 in interval 5. Interval 7 went active on C (behind: it was
        // to recover X from B) and B; B and the 7's primary died before C had X. Only A (5.4)
        // and C (activated in 7, not complete: last_complete from before) answer: C's lack of
        // 5.4 proves nothing, 5.4 stays (seed 139 of the cluster simulator lost it).
        let h = history(&[(5, &[A, B]), (7, &[C, B])]);
        let hold = holdings(&[(A, 5, v(5, 0)), (C, 7, v(3, 0))]);
        let c = copies(&[(A, v(5, 4), false), (C, v(3, 2), false)]);
        let out = run(&h, &hold, &[A, C], &c);
        assert_eq!(out.auth, present(v(5, 4), A));
        assert_eq!(out.behind, [C]);
        assert!(out.divergent.is_empty());
        // C complete in 7 (last_complete 7.0) and without 5.4: 7's peering rolled it back.
        let hold = holdings(&[(A, 5, v(5, 0)), (C, 7, v(7, 0))]);
        let out = run(&h, &hold, &[A, C], &c);
        assert_eq!(out.auth, present(v(3, 2), C));
        assert_eq!(out.divergent, [A]);
    }

    #[test]
    fn a_rolled_back_write_stays_rolled_back_when_a_later_complete_member_proves_it() {
        // 5.4 reached only A in interval 5 (A, B). Interval 7 (B, C) went active with 5.3,
        // C behind; interval 9 (B, M) went active with M complete, holding 5.3. B is gone;
        // A, C and M answer: 7 cannot tell (C was behind), but M, complete in 9, proves it.
        const M: DeviceId = DeviceId(4);
        let h = history(&[(5, &[A, B]), (7, &[B, C]), (9, &[B, M])]);
        let hold = holdings(&[(A, 5, v(5, 0)), (C, 7, v(3, 0)), (M, 9, v(9, 0))]);
        let c = copies(&[
            (A, v(5, 4), false),
            (C, v(3, 2), false),
            (M, v(5, 3), false),
        ]);
        let out = run(&h, &hold, &[M, C, A], &c);
        assert_eq!(out.auth, present(v(5, 3), M));
        assert_eq!(out.divergent, [A]);
        assert_eq!(out.behind, [C]);
    }

    #[test]
    fn a_member_of_its_own_interval_without_it_proves_it_never_acknowledged() {
        // 5.4 reached A but not C in interval 5 (A, B, C). Interval 7 (B, C, M) went active
        // with C and M behind; B is gone. C, of interval 5, lacks 5.4: never acknowledged.
        const M: DeviceId = DeviceId(4);
        let h = history(&[(5, &[A, B, C]), (7, &[B, C, M])]);
        let hold = holdings(&[(A, 5, v(5, 0)), (C, 7, v(3, 0)), (M, 7, v(3, 0))]);
        let c = copies(&[(A, v(5, 4), false), (C, v(5, 3), false)]);
        let out = run(&h, &hold, &[C, M, A], &c);
        assert_eq!(out.auth, present(v(5, 3), C));
        assert_eq!(out.divergent, [A]);
        assert_eq!(out.behind, [M]);
    }

    #[test]
    fn an_interval_that_never_went_active_decides_nothing() {
        // Interval 7 (B, C) was recorded, but C was never activated in it (its last activation
        // is 5): it never went active. A's 5.4 is judged as if 5 were the last interval: every
        // reachable member of 5 (A, C) must hold it.
        let h = history(&[(5, &[A, C]), (7, &[B, C])]);
        let hold = holdings(&[(A, 5, v(5, 0)), (C, 5, v(5, 0))]);
        let c = copies(&[(A, v(5, 4), false), (C, v(5, 4), false)]);
        let out = run(&h, &hold, &[A, C], &c);
        assert_eq!(out.auth, present(v(5, 4), A));
        // C lacks it: never acknowledged in 5.
        let c = copies(&[(A, v(5, 4), false), (C, v(5, 3), false)]);
        let out = run(&h, &hold, &[C, A], &c);
        assert_eq!(out.auth, present(v(5, 3), C));
        assert_eq!(out.divergent, [A]);
    }

    #[test]
    fn a_tombstone_beats_an_older_copy_and_absence_purges() {
        let h = history(&[(5, &[A, B])]);
        let hold = holdings(&[(A, 5, v(5, 0)), (B, 5, v(5, 0))]);
        let c = copies(&[(A, v(5, 6), true), (B, v(5, 6), true)]);
        let out = run(&h, &hold, &[A, B], &c);
        assert!(matches!(out.auth, Auth::Present { deleted: true, .. }));
        assert!(out.behind.is_empty() && out.divergent.is_empty());
        // Only A created X (never acked): no trusted copy at all, A must forget it.
        let c = copies(&[(A, v(5, 7), false)]);
        let out = run(&h, &hold, &[B, A], &c);
        assert_eq!(out.auth, Auth::Absent);
        assert_eq!(out.divergent, [A]);
    }

    #[test]
    fn complete_copies_are_trusted_whatever_their_interval() {
        // B's 5.3 is at or below its last_complete: trusted even though A lacks it in 5.
        let h = history(&[(5, &[A, B])]);
        let hold = holdings(&[(A, 5, v(5, 0)), (B, 5, v(5, 3))]);
        let c = copies(&[(B, v(5, 3), false)]);
        let out = run(&h, &hold, &[A, B], &c);
        assert_eq!(out.auth, present(v(5, 3), B));
        assert_eq!(out.behind, [A]);
    }

    #[test]
    fn a_pg_never_activated_trusts_what_it_holds() {
        let h = PgHistory::default();
        let hold = holdings(&[(A, 0, Version::NONE)]);
        let c = copies(&[(A, v(0, 9), false)]);
        let out = run(&h, &hold, &[A], &c);
        assert_eq!(out.auth, present(v(0, 9), A));
    }

    /// A version a peering adopted while a member of its interval was unreachable, which that
    /// member lacks once back: still the authority (rule 2), but known never acknowledged, and
    /// the member's copy holds every write that was (seed 633391).
    #[test]
    fn an_adopted_version_a_witness_of_its_interval_lacks_has_a_fallback() {
        let floor = |out: Verdict| out.fallback.map(|f| f.floor);
        // 4.11 reached B alone in interval 4 (A, B); interval 5 (B, C) adopted it without A.
        let h = history(&[(4, &[A, B]), (5, &[B, C])]);
        let hold = holdings(&[(A, 4, v(4, 0)), (B, 5, v(5, 0)), (C, 5, v(3, 2))]);
        let c = copies(&[
            (A, v(4, 10), false),
            (B, v(4, 11), false),
            (C, v(3, 2), false),
        ]);
        let out = run(&h, &hold, &[A, B, C], &c);
        assert_eq!(out.auth, present(v(4, 11), B));
        assert_eq!(out.behind, [A, C]);
        let fallback = out.fallback.expect("A proves 4.11 unacknowledged");
        assert_eq!(fallback.floor, v(4, 10));
        // C's 3.2 is older than the floor (and C no member of interval 4): no candidate.
        assert_eq!(fallback.candidates, [(v(4, 10), false, A)]);
        // A witness that holds nothing: no write to the object was ever acknowledged.
        let c = copies(&[(B, v(4, 11), false)]);
        assert_eq!(floor(run(&h, &hold, &[A, B, C], &c)), Some(Version::NONE));
        // A suspect member proves nothing.
        let mut suspect = hold.clone();
        suspect.get_mut(&A).expect("answered").info.suspect = true;
        let c = copies(&[(A, v(4, 10), false), (B, v(4, 11), false)]);
        assert_eq!(floor(run(&h, &suspect, &[A, B, C], &c)), None);
        // A member of its interval that holds it: none.
        let c = copies(&[(A, v(4, 11), false), (B, v(4, 11), false)]);
        assert_eq!(floor(run(&h, &hold, &[A, B, C], &c)), None);
        // A tombstone holds no data to fail a checksum: none.
        let c = copies(&[(A, v(4, 10), false), (B, v(4, 11), true)]);
        assert_eq!(floor(run(&h, &hold, &[A, B, C], &c)), None);
        // A device of its interval or a later one that did not answer (C, which may hold a
        // good copy of 4.11 that clients read, and would bring it back): none.
        let without_c = holdings(&[(A, 4, v(4, 0)), (B, 5, v(5, 0))]);
        let c = copies(&[(A, v(4, 10), false), (B, v(4, 11), false)]);
        assert_eq!(floor(run(&h, &without_c, &[A, B, C], &c)), None);
    }

    /// Only copies of members of the authority's own interval are candidates: a copy a device
    /// of an older interval holds may be a write a peering decided against.
    #[test]
    fn a_fallback_takes_no_copy_from_outside_the_authoritys_interval() {
        // D wrote 3.1 in interval 3 (D, A) and crashed before A had it; interval 4 (A, B)
        // decided against it; 4.1 reached B alone and interval 5 (B, C) adopted it.
        let h = history(&[(3, &[D, A]), (4, &[A, B]), (5, &[B, C])]);
        let hold = holdings(&[
            (A, 4, v(4, 0)),
            (B, 5, v(5, 0)),
            (C, 5, v(5, 0)),
            (D, 3, v(3, 0)),
        ]);
        let c = copies(&[
            (A, v(2, 4), false),
            (B, v(4, 1), false),
            (C, v(4, 1), false),
            (D, v(3, 1), false),
        ]);
        let out = run(&h, &hold, &[B, C], &c);
        assert_eq!(out.auth, present(v(4, 1), B));
        let fallback = out.fallback.expect("A proves 4.1 unacknowledged");
        assert_eq!(fallback.floor, v(2, 4));
        assert_eq!(fallback.candidates, [(v(2, 4), false, A)]);
    }
}
