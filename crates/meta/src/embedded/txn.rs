//! Compare-and-swap transactions on the embedded store, evaluated as etcd evaluates them.

use super::record::Record;
use super::write::WriteCtx;
use crate::error::MetaError;
use crate::store::{Compare, CompareOp, CompareTarget, Txn, TxnOp, TxnOpResult};
use std::cmp::Ordering;

impl WriteCtx<'_> {
    /// Evaluates the comparisons, then runs the chosen branch. Returns whether the comparisons
    /// held and one result per op.
    pub(crate) fn run_txn(&mut self, txn: &Txn) -> Result<(bool, Vec<TxnOpResult>), MetaError> {
        let mut succeeded = true;
        for c in &txn.compares {
            if !compare(self.read(&c.key)?.as_ref(), c) {
                succeeded = false;
                break;
            }
        }
        let branch = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        let mut results = Vec::with_capacity(branch.len());
        for op in branch {
            results.push(match op {
                TxnOp::Put { key, value, lease } => {
                    self.put(key, value.clone(), *lease)?;
                    TxnOpResult::Put
                }
                TxnOp::Delete { key } => TxnOpResult::Delete {
                    deleted: self.delete(key)?,
                },
                TxnOp::Get { key } => TxnOpResult::Get(self.read(key)?.map(|r| r.into_kv(key))),
            });
        }
        Ok((succeeded, results))
    }
}

/// etcd's rule: a missing key compares as zeros, except that a value comparison on a missing
/// key is always false.
fn compare(found: Option<&Record>, c: &Compare) -> bool {
    let (ordering, op) = match (&c.target, found) {
        (CompareTarget::Value(..), None) => return false,
        (CompareTarget::Value(op, v), Some(r)) => (r.value.as_slice().cmp(v.as_slice()), *op),
        (CompareTarget::ModRevision(op, v), r) => (r.map_or(0, |r| r.mod_revision).cmp(v), *op),
        (CompareTarget::CreateRevision(op, v), r) => {
            (r.map_or(0, |r| r.create_revision).cmp(v), *op)
        }
        (CompareTarget::Version(op, v), r) => (r.map_or(0, |r| r.version).cmp(v), *op),
    };
    match op {
        CompareOp::Equal => ordering == Ordering::Equal,
        CompareOp::NotEqual => ordering != Ordering::Equal,
        CompareOp::Greater => ordering == Ordering::Greater,
        CompareOp::Less => ordering == Ordering::Less,
    }
}
