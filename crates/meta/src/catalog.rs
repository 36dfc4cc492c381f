//! [`Catalog`]: typed records on top of any [`MetaStore`], and the helpers every noun shares:
//! versioned JSON, id allocation, and compare-and-swap updates.
//!
//! The nouns live in their own files: [`crate::pool`], [`crate::volume`], [`crate::node`]
//! (nodes and devices), [`crate::map`] (the cluster map) and [`crate::leader`].

use crate::error::MetaError;
use crate::keys::{self, IdKind};
use crate::store::{Compare, KeyValue, MetaStore, Revision, Txn, TxnOp};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The format version written into every record as `"v"`.
pub const RECORD_VERSION: u32 = 1;

/// How often a compare-and-swap update is retried when other writers keep winning.
pub(crate) const MAX_ATTEMPTS: u32 = 100;

/// Typed access to the cluster's metadata. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Catalog {
    store: Arc<dyn MetaStore>,
}

#[derive(Serialize)]
struct VersionedRef<'a, T> {
    v: u32,
    #[serde(flatten)]
    record: &'a T,
}

#[derive(Deserialize)]
struct Versioned<T> {
    v: u32,
    #[serde(flatten)]
    record: T,
}

/// The value of an id counter: the last id handed out.
#[derive(Serialize, Deserialize)]
struct Counter {
    last: u64,
}

/// Encodes a record as JSON with `"v": 1` in front of its fields.
pub(crate) fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    // Serialising plain structs of strings and numbers to JSON cannot fail.
    serde_json::to_vec(&VersionedRef {
        v: RECORD_VERSION,
        record,
    })
    .unwrap_or_default()
}

/// Decodes a record written by [`encode`], checking its version.
pub(crate) fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, MetaError> {
    #[derive(Deserialize)]
    struct Probe {
        v: u32,
    }
    let probe: Probe = serde_json::from_slice(bytes).map_err(|e| MetaError::corrupt(key, e))?;
    if probe.v != RECORD_VERSION {
        return Err(MetaError::UnsupportedVersion {
            key: key.to_string(),
            found: probe.v,
            supported: RECORD_VERSION,
        });
    }
    let versioned: Versioned<T> =
        serde_json::from_slice(bytes).map_err(|e| MetaError::corrupt(key, e))?;
    debug_assert_eq!(versioned.v, RECORD_VERSION);
    Ok(versioned.record)
}

/// Seconds since the Unix epoch, for `created_at` fields.
pub(crate) fn now_secs() -> u64 {
    crate::clock::unix_secs()
}

impl Catalog {
    pub fn new(store: Arc<dyn MetaStore>) -> Catalog {
        Catalog { store }
    }

    /// The store underneath, for raw access (watches of other prefixes, tests).
    pub fn store(&self) -> &Arc<dyn MetaStore> {
        &self.store
    }

    /// Hands out the next id of `kind`: 1, 2, 3, ... Never the same id twice, even to
    /// concurrent callers in different processes, and never an id handed out before (a failed
    /// create burns its id).
    pub async fn next_id(&self, kind: IdKind) -> Result<u64, MetaError> {
        let key = keys::id_counter(kind);
        let (counter, _) = self
            .update(&key, |cur: Option<Counter>| {
                Ok(Counter {
                    last: cur.map_or(1, |c| c.last + 1),
                })
            })
            .await?;
        Ok(counter.last)
    }

    /// The last id of `kind` handed out (0: none yet). Every id of that kind ever allocated is
    /// at most this; an id above it has never been handed out.
    pub async fn last_id(&self, kind: IdKind) -> Result<u64, MetaError> {
        let key = keys::id_counter(kind);
        Ok(self
            .read::<Counter>(&key)
            .await?
            .map_or(0, |(counter, _)| counter.last))
    }

    /// Reads and decodes one record, with its key-value metadata.
    pub(crate) async fn read<T: DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<(T, KeyValue)>, MetaError> {
        match self.store.get(key).await? {
            Some(kv) => Ok(Some((decode(key, &kv.value)?, kv))),
            None => Ok(None),
        }
    }

    /// Reads and decodes every record under `prefix`, in key order.
    pub(crate) async fn read_all<T: DeserializeOwned>(
        &self,
        prefix: &str,
    ) -> Result<Vec<T>, MetaError> {
        let listing = self.store.list(prefix).await?;
        listing
            .kvs
            .iter()
            .map(|kv| decode(&kv.key, &kv.value))
            .collect()
    }

    /// Compare-and-swap loop: reads `key`, lets `f` compute the new record from the current one
    /// (or refuse with an error), and writes it only if the key has not changed since the read.
    /// Retries when another writer got there first. Returns the written record and revision.
    pub(crate) async fn update<T: Serialize + DeserializeOwned>(
        &self,
        key: &str,
        mut f: impl FnMut(Option<T>) -> Result<T, MetaError>,
    ) -> Result<(T, Revision), MetaError> {
        self.update_if(key, |cur| f(cur).map(|next| (next, true)))
            .await
    }

    /// Like [`Catalog::update`], but `f` also says whether to write: `(record, false)` leaves
    /// the key as it is and returns `record` with the revision that was read.
    pub(crate) async fn update_if<T: Serialize + DeserializeOwned>(
        &self,
        key: &str,
        mut f: impl FnMut(Option<T>) -> Result<(T, bool), MetaError>,
    ) -> Result<(T, Revision), MetaError> {
        for _ in 0..MAX_ATTEMPTS {
            if let Some(done) = self.update_once(key, &[], &mut f).await? {
                return Ok(done);
            }
        }
        Err(MetaError::Contention {
            key: key.to_string(),
            attempts: MAX_ATTEMPTS,
        })
    }

    /// One round of [`Catalog::update_if`] whose write also needs every compare of `guards` to
    /// hold: `None` when the key changed since it was read or a guard failed (read again).
    pub(crate) async fn update_once<T: Serialize + DeserializeOwned>(
        &self,
        key: &str,
        guards: &[Compare],
        f: &mut impl FnMut(Option<T>) -> Result<(T, bool), MetaError>,
    ) -> Result<Option<(T, Revision)>, MetaError> {
        let current = self.read::<T>(key).await?;
        let read_rev = current.as_ref().map_or(0, |(_, kv)| kv.mod_revision);
        let guard = match &current {
            Some((_, kv)) => Compare::mod_revision_is(key, kv.mod_revision),
            None => Compare::missing(key),
        };
        let (next, write) = f(current.map(|(rec, _)| rec))?;
        if !write {
            return Ok(Some((next, read_rev)));
        }
        let txn = Txn::new()
            .when(std::iter::once(guard).chain(guards.iter().cloned()))
            .and_then([TxnOp::put(key, encode(&next))]);
        let result = self.store.txn(txn).await?;
        Ok(result.succeeded.then_some((next, result.revision)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Rec {
        a: u32,
        b: String,
    }

    #[test]
    fn records_carry_their_version() {
        let bytes = encode(&Rec {
            a: 1,
            b: "x".into(),
        });
        assert_eq!(bytes, br#"{"v":1,"a":1,"b":"x"}"#);
        let back: Rec = decode("k", &bytes).expect("decode");
        assert_eq!(back.a, 1);
        let future = br#"{"v":2,"a":1,"b":"x"}"#;
        assert!(matches!(
            decode::<Rec>("k", future),
            Err(MetaError::UnsupportedVersion { found: 2, .. })
        ));
        assert!(matches!(
            decode::<Rec>("k", b"{"),
            Err(MetaError::Corrupt { .. })
        ));
    }
}
