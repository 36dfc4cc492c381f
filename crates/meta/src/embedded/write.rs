//! The embedded store's write path: one redb write transaction per change, one revision per
//! transaction that changed something.

use super::record::Record;
use super::{Inner, KV, META, State};
use crate::error::MetaError;
use crate::store::{KeyValue, LeaseId, Revision, WatchEvent};
use redb::{ReadableTable, Table};

/// A change in progress: the open `kv` table, the revision the change will get, and what it
/// did so far.
pub(crate) struct WriteCtx<'a> {
    table: Table<'a, &'static str, &'static [u8]>,
    leases: &'a super::lease::Leases,
    rev: Revision,
    path: &'a std::path::Path,
    pub(super) events: Vec<WatchEvent>,
    /// `(key, old lease, new lease)` for keys whose lease changed, applied after the commit.
    pub(super) lease_moves: Vec<(String, Option<LeaseId>, Option<LeaseId>)>,
}

impl Inner {
    /// Runs `f` as one atomic change. If it wrote anything, the change is committed durably
    /// with the next revision and its events go to the watchers. Returns `f`'s result and the
    /// store revision afterwards.
    pub(crate) fn write<T>(
        &self,
        f: impl FnOnce(&mut WriteCtx<'_>) -> Result<T, MetaError>,
    ) -> Result<(T, Revision), MetaError> {
        let mut st = self.state.lock();
        self.write_locked(&mut st, f)
    }

    pub(crate) fn write_locked<T>(
        &self,
        st: &mut State,
        f: impl FnOnce(&mut WriteCtx<'_>) -> Result<T, MetaError>,
    ) -> Result<(T, Revision), MetaError> {
        let rev = st.revision + 1;
        let (out, changes) = self.with_db(|db| {
            let wtx = db.begin_write().map_err(|e| self.err(e))?;
            let (out, events, lease_moves) = {
                let table = wtx.open_table(KV).map_err(|e| self.err(e))?;
                let mut ctx = WriteCtx {
                    table,
                    leases: &st.leases,
                    rev,
                    path: &self.path,
                    events: Vec::new(),
                    lease_moves: Vec::new(),
                };
                // An error here drops `wtx` uncommitted: nothing of the change is kept.
                let out = f(&mut ctx)?;
                (out, ctx.events, ctx.lease_moves)
            };
            if events.is_empty() {
                wtx.abort().map_err(|e| self.err(e))?;
                return Ok((out, None));
            }
            {
                let mut meta = wtx.open_table(META).map_err(|e| self.err(e))?;
                meta.insert("revision", rev).map_err(|e| self.err(e))?;
            }
            // Durability: redb's default (immediate) durability fsyncs before commit returns,
            // so the change and its revision are on disk before anyone is told about them.
            wtx.commit().map_err(|e| self.err(e))?;
            Ok((out, Some((events, lease_moves))))
        })?;
        let Some((events, lease_moves)) = changes else {
            return Ok((out, st.revision));
        };
        st.revision = rev;
        st.leases.apply_moves(lease_moves);
        st.hub.publish(rev, events);
        Ok((out, rev))
    }
}

impl WriteCtx<'_> {
    fn err(&self, e: impl Into<redb::Error>) -> MetaError {
        super::embedded_err(self.path, e)
    }

    /// The current state of `key` inside this change (sees earlier ops of the same change).
    pub(crate) fn read(&self, key: &str) -> Result<Option<Record>, MetaError> {
        let found = self.table.get(key).map_err(|e| self.err(e))?;
        found.map(|v| Record::decode(key, v.value())).transpose()
    }

    pub(crate) fn put(
        &mut self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<(), MetaError> {
        if let Some(l) = lease
            && !self.leases.alive(l)
        {
            return Err(MetaError::LeaseNotFound(l));
        }
        let old = self.read(key)?;
        let record = Record {
            create_revision: old.as_ref().map_or(self.rev, |o| o.create_revision),
            mod_revision: self.rev,
            version: old.as_ref().map_or(1, |o| o.version + 1),
            lease,
            value,
        };
        let path = self.path;
        self.table
            .insert(key, record.encode().as_slice())
            .map_err(|e| super::embedded_err(path, e))?;
        let old_lease = old.and_then(|o| o.lease);
        if old_lease != lease {
            self.lease_moves.push((key.to_string(), old_lease, lease));
        }
        self.events.push(WatchEvent::Put(record.into_kv(key)));
        Ok(())
    }

    /// Deletes `key`; returns whether it existed. Deleting a missing key changes nothing.
    pub(crate) fn delete(&mut self, key: &str) -> Result<bool, MetaError> {
        let Some(old) = self.read(key)? else {
            return Ok(false);
        };
        let path = self.path;
        self.table
            .remove(key)
            .map_err(|e| super::embedded_err(path, e))?;
        if old.lease.is_some() {
            self.lease_moves.push((key.to_string(), old.lease, None));
        }
        self.events.push(WatchEvent::Delete(KeyValue {
            key: key.to_string(),
            value: Vec::new(),
            create_revision: 0,
            mod_revision: self.rev,
            version: 0,
            lease: None,
        }));
        Ok(true)
    }
}
