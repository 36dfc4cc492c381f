//! [`View`]: what the node knows of the volume records, built from listings and watch events,
//! newest revision wins. Pure (no I/O): the rules are unit-tested here.

use basalt_meta::{Revision, VolumeListing, VolumeRecord, VolumeState};
use basalt_types::{PoolId, VolumeId};
use std::collections::{HashMap, HashSet};

/// One volume with a record, as of `revision`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    name: String,
    pool: PoolId,
    size: u64,
    deleting: bool,
    /// The revision this state was read at (a listing's, or the change's).
    revision: Revision,
}

/// What the view says about a volume id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Active {
        pool: PoolId,
        size: u64,
    },
    /// Marked deleting: its data is being removed; it never becomes active again.
    Deleting,
    /// Its record was removed (or its deletion was concluded otherwise): gone for good, since
    /// ids are never reused.
    Gone,
    /// No record known: not created yet, or deleted before this node's first listing.
    Unknown,
}

/// Whether the collector may remove a volume's objects from this node's stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Collect {
    Purge,
    /// The volume exists (active or deleting).
    Exists,
    /// The view cannot tell: no listing yet, or records it cannot read (one may be this one).
    Undecided,
    /// The id is above the volume id counter: never handed out. Objects of such an id mean the
    /// metadata store went back in time (restored from a backup); they are left for an
    /// operator rather than destroyed.
    NeverAllocated,
    /// No record in the view, but the listing the view holds may predate the object: a volume
    /// created as that listing was made, written through another primary whose view had it,
    /// reaches this node as a member's writes (which no view checks) and looks so while this
    /// node's watch lags. Only a listing made after the object was seen proves the record gone
    /// (every writer read the record before writing): list again, then ask again.
    Relist,
}

/// The node's view of the volume records.
#[derive(Debug, Default)]
pub(crate) struct View {
    /// Whether a complete listing has been applied.
    complete: bool,
    /// Revision of the newest listing applied.
    listed: Revision,
    /// Names of the records that listing could not read.
    unreadable: HashSet<String>,
    live: HashMap<VolumeId, Entry>,
    names: HashMap<String, VolumeId>,
    /// Ids seen deleted. Never forgotten while the node runs: a gone id never comes back.
    gone: HashSet<VolumeId>,
}

impl View {
    pub(crate) fn status(&self, id: VolumeId) -> Status {
        match self.live.get(&id) {
            Some(e) if e.deleting => Status::Deleting,
            Some(e) => Status::Active {
                pool: e.pool,
                size: e.size,
            },
            None if self.gone.contains(&id) => Status::Gone,
            None => Status::Unknown,
        }
    }

    /// The revision of the newest listing applied (0: none).
    pub(crate) fn listed(&self) -> Revision {
        self.listed
    }

    /// Applies a complete listing. An older one than already applied changes nothing. A volume
    /// the view knows from before the listing and that is missing from it is gone (unless its
    /// record is one the listing could not read).
    pub(crate) fn apply_listing(&mut self, listing: &VolumeListing) {
        let at = listing.revision;
        if self.complete && at < self.listed {
            return;
        }
        for record in &listing.volumes {
            self.upsert(record, at);
        }
        let unreadable: HashSet<String> = listing.unreadable.iter().cloned().collect();
        let present: HashSet<VolumeId> = listing.volumes.iter().map(|v| v.id).collect();
        let removed: Vec<VolumeId> = self
            .live
            .iter()
            .filter(|(id, e)| {
                !present.contains(id) && e.revision <= at && !unreadable.contains(&e.name)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in removed {
            self.remove(id);
        }
        self.complete = true;
        self.listed = at;
        self.unreadable = unreadable;
    }

    /// Applies a record created or changed at `revision` (from the watch).
    pub(crate) fn apply_changed(&mut self, record: &VolumeRecord, revision: Revision) {
        if self.complete
            && revision <= self.listed
            && !self.live.contains_key(&record.id)
            && !self.gone.contains(&record.id)
        {
            // A listing at least as new did not have it: removed since (or unreadable now).
            if !self.unreadable.contains(&record.name) {
                self.gone.insert(record.id);
            }
            return;
        }
        self.upsert(record, revision);
    }

    /// Applies the removal of the record named `name` at `revision` (from the watch).
    pub(crate) fn apply_removed(&mut self, name: &str, revision: Revision) {
        let Some(&id) = self.names.get(name) else {
            return;
        };
        if self.live.get(&id).is_some_and(|e| e.revision < revision) {
            self.remove(id);
        }
    }

    /// Whether the collector may remove the objects of volume `id`, given the volume id
    /// counter `last_id` read after the newest listing, and whether that listing was made
    /// after the objects were seen (`listed_after_seen`). An unknown id whose objects a listing
    /// made after them lacks is dead: whoever wrote them (this node or a primary before it)
    /// read the volume's record first, so the record existed before the objects did, and a
    /// later listing lacks it only if it was removed since. A volume whose record exists is
    /// never collected, whatever the pool of its objects.
    pub(crate) fn collect(&self, id: VolumeId, last_id: u64, listed_after_seen: bool) -> Collect {
        match self.status(id) {
            Status::Active { .. } | Status::Deleting => Collect::Exists,
            Status::Gone => Collect::Purge,
            Status::Unknown if !self.complete || !self.unreadable.is_empty() => Collect::Undecided,
            Status::Unknown if id.0 > last_id => Collect::NeverAllocated,
            Status::Unknown if !listed_after_seen => Collect::Relist,
            Status::Unknown => Collect::Purge,
        }
    }

    /// Records that volume `id` is dead (the collector concluded it): writes to it are refused
    /// from now on. Only an unknown or already gone id can be marked.
    pub(crate) fn mark_gone(&mut self, id: VolumeId) {
        assert!(
            !self.live.contains_key(&id),
            "volume {id} has a record and cannot be marked gone"
        );
        self.gone.insert(id);
    }

    fn upsert(&mut self, record: &VolumeRecord, revision: Revision) {
        if self.gone.contains(&record.id) {
            return;
        }
        let deleting = record.state != VolumeState::Active;
        match self.live.get_mut(&record.id) {
            Some(e) if e.revision >= revision => return,
            Some(e) => {
                e.size = record.size;
                e.pool = record.pool;
                // Deleting is final.
                e.deleting |= deleting;
                e.revision = revision;
            }
            None => {
                self.live.insert(
                    record.id,
                    Entry {
                        name: record.name.clone(),
                        pool: record.pool,
                        size: record.size,
                        deleting,
                        revision,
                    },
                );
            }
        }
        self.names.insert(record.name.clone(), record.id);
    }

    fn remove(&mut self, id: VolumeId) {
        if let Some(e) = self.live.remove(&id) {
            if self.names.get(&e.name) == Some(&id) {
                self.names.remove(&e.name);
            }
            self.gone.insert(id);
        }
    }
}
