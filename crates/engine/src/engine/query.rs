//! Questions about what the store holds (objects, PG listings in order, the PG log), and the
//! PG-level operations (PG records, log trimming). Listings are paged with a cursor: each call
//! costs O(page × log n) on the I/O thread, never a scan of the whole index.

use super::write::pg_entry;
use super::{Engine, Reply, WKind, Waiter, WriteOp};
use crate::error::EngineError;
use crate::layout::{NO_SLOT, PG_BLOB};
use crate::{LogEntry, ObjectInfo, PgInfo, WriteOptions};
use basalt_types::{ObjectId, PgId, PoolId, Version, VolumeId};
use std::ops::Bound;
use tokio::sync::oneshot;

impl Engine {
    pub fn object_info(&self, oid: &ObjectId) -> Option<ObjectInfo> {
        let o = self.st.objs.get(oid)?;
        Some(ObjectInfo {
            oid: *oid,
            pg: o.pg,
            version: o.version,
            deleted: o.is_tombstone(),
            allocated_bytes: self.st.allocated_bytes(oid, o),
        })
    }

    /// Objects and tombstones of `pg` in object order, strictly after `after`.
    pub fn list(&self, pg: PgId, after: Option<ObjectId>, limit: usize) -> Vec<ObjectInfo> {
        let Some(p) = self.st.pgs.get(&pg) else {
            return Vec::new();
        };
        let from = match after {
            Some(a) => Bound::Excluded((a.volume, a.index)),
            None => Bound::Unbounded,
        };
        p.objects
            .range((from, Bound::Unbounded))
            .take(limit)
            .filter_map(|(v, i)| self.object_info(&ObjectId::new(pg.pool, *v, *i)))
            .collect()
    }

    /// Objects and tombstones of `volume` in `pool` with index `from` or more, in (PG, index)
    /// order.
    pub fn list_volume(
        &self,
        pool: PoolId,
        volume: VolumeId,
        from: u64,
        limit: usize,
    ) -> Vec<ObjectInfo> {
        let pgs = PgId { pool, pg: 0 }..=PgId { pool, pg: u32::MAX };
        let mut out = Vec::new();
        for (_, p) in self.st.pgs.range(pgs) {
            for (v, i) in p.objects.range((volume, from)..=(volume, u64::MAX)) {
                let oid = ObjectId::new(pool, *v, *i);
                if let Some(info) = self.object_info(&oid) {
                    out.push(info);
                    if out.len() >= limit {
                        return out;
                    }
                }
            }
        }
        out
    }

    /// The PG's log (the newest change of each object and tombstone) after `since`, oldest
    /// first. Refused when tombstones after `since` may have been trimmed.
    pub fn list_since(
        &self,
        pg: PgId,
        since: Version,
        limit: usize,
    ) -> Result<Vec<LogEntry>, EngineError> {
        let Some(p) = self.st.pgs.get(&pg) else {
            return Ok(Vec::new());
        };
        if since < p.log_tail {
            return Err(EngineError::LogTrimmed {
                pg,
                since,
                tail: p.log_tail,
            });
        }
        let from = Bound::Excluded((since, VolumeId(u64::MAX), u64::MAX));
        Ok(p.log
            .range((from, Bound::Unbounded))
            .take(limit)
            .map(|(version, v, i)| {
                let oid = ObjectId::new(pg.pool, *v, *i);
                LogEntry {
                    version: *version,
                    oid,
                    deleted: self.st.objs.get(&oid).is_some_and(|o| o.is_tombstone()),
                }
            })
            .collect())
    }

    pub fn pg_infos(&self) -> Vec<PgInfo> {
        self.st
            .pgs
            .iter()
            .map(|(pg, p)| PgInfo {
                pg: *pg,
                objects: (p.objects.len() - p.tombs.len()) as u64,
                tombstones: p.tombs.len() as u64,
                last_version: p.last_version(),
                log_tail: p.log_tail,
                blob: p.blob,
                has_record: p.record != NO_SLOT,
            })
            .collect()
    }

    /// Sets or removes a PG's record, in journal order with the writes before it.
    pub fn set_pg(
        &mut self,
        pg: PgId,
        blob: Option<Box<[u8; PG_BLOB]>>,
        durable: bool,
        reply: oneshot::Sender<Result<(), EngineError>>,
    ) {
        if let Some(p) = &self.poisoned {
            let _ = reply.send(Err(EngineError::Poisoned(p.clone())));
            return;
        }
        let (record, tail) = self
            .st
            .pgs
            .get(&pg)
            .map_or((NO_SLOT, Version::NONE), |p| (p.record, p.log_tail));
        let entry = match blob {
            None if record == NO_SLOT => None,
            None => Some(pg_entry(pg, record, true, Version::NONE, [0; PG_BLOB])),
            Some(blob) => match self.pg_record(record) {
                Ok(r) => Some(pg_entry(pg, r, false, tail, *blob)),
                Err(e) => {
                    let _ = reply.send(Err(e));
                    return;
                }
            },
        };
        let waiter = Waiter {
            durable,
            reply: Reply::Unit(reply),
            version: Version::NONE,
        };
        match entry {
            Some(e) => self.add_entry(e, Vec::new(), None, Some(waiter)),
            None => self.add_barrier(waiter),
        }
    }

    /// Raises the log tail of `pg` to `upto` (first, so a crash never leaves a trimmed log
    /// with a lower tail) and forgets its tombstones up to `upto`. Answers with how many.
    pub fn trim_log(
        &mut self,
        pg: PgId,
        upto: Version,
        reply: oneshot::Sender<Result<u64, EngineError>>,
    ) {
        if let Some(p) = &self.poisoned {
            let _ = reply.send(Err(EngineError::Poisoned(p.clone())));
            return;
        }
        let Some(p) = self.st.pgs.get(&pg) else {
            let _ = reply.send(Ok(0));
            return;
        };
        let victims: Vec<ObjectId> = p
            .tombs
            .range(..=(upto, VolumeId(u64::MAX), u64::MAX))
            .map(|(_, v, i)| ObjectId::new(pg.pool, *v, *i))
            .collect();
        if let Err(e) = self.raise_log_tail(pg, upto) {
            let _ = reply.send(Err(e));
            return;
        }
        let count = victims.len() as u64;
        let opts = WriteOptions::buffered().in_pg(pg.pg);
        for oid in victims {
            let (tx, _) = oneshot::channel();
            let kind = WKind::Purge {
                only_tombstone_upto: Some(upto),
            };
            self.handle_write(WriteOp::new(oid, 0, kind, opts, Reply::Version(tx)));
        }
        // Answered once everything queued before it is written.
        self.add_barrier(Waiter {
            durable: false,
            reply: Reply::Count(reply, count),
            version: Version::NONE,
        });
    }
}
