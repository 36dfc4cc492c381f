//! Failure reports under [`keys::FAILURE_REPORTS`]: node `reporter` cannot reach node
//! `accused` (its heartbeats went unanswered for the grace). One key per (reporter, accused),
//! attached to the reporter's lease, so the reports of a node that died (or lost its lease)
//! vanish with it. The reporter deletes its report when it reaches the accused again. The
//! leader reads them and marks down a node that enough live peers report
//! (`node/src/reports.rs`).

use crate::catalog::{Catalog, encode, now_secs};
use crate::error::MetaError;
use crate::keys;
use crate::store::LeaseId;
use basalt_types::NodeId;
use serde::{Deserialize, Serialize};

/// `reporter` has not reached `accused` since `silent_since`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureReport {
    pub reporter: NodeId,
    pub accused: NodeId,
    /// Unix milliseconds (the reporter's clock) of the last answer it got from the accused,
    /// or when it started trying.
    pub silent_since_ms: u64,
    /// Unix seconds when the report was written.
    pub at: u64,
}

impl Catalog {
    /// Writes `reporter`'s report of `accused` under `lease` (the reporter's registration
    /// lease: the report vanishes with it).
    pub async fn put_failure_report(
        &self,
        reporter: NodeId,
        accused: NodeId,
        silent_since_ms: u64,
        lease: LeaseId,
    ) -> Result<(), MetaError> {
        let record = FailureReport {
            reporter,
            accused,
            silent_since_ms,
            at: now_secs(),
        };
        self.store()
            .put(
                &keys::failure_report(reporter, accused),
                encode(&record),
                Some(lease),
            )
            .await?;
        Ok(())
    }

    /// Withdraws `reporter`'s report of `accused` (it reaches it again). Returns whether there
    /// was one.
    pub async fn remove_failure_report(
        &self,
        reporter: NodeId,
        accused: NodeId,
    ) -> Result<bool, MetaError> {
        self.store()
            .delete(&keys::failure_report(reporter, accused))
            .await
    }

    /// Every standing report. A report whose key and record disagree, or that cannot be read,
    /// is skipped with a warning (and never counts).
    pub async fn list_failure_reports(&self) -> Result<Vec<FailureReport>, MetaError> {
        let listing = self.store().list(keys::FAILURE_REPORTS).await?;
        let mut out = Vec::new();
        for kv in listing.kvs {
            match crate::catalog::decode::<FailureReport>(&kv.key, &kv.value) {
                Ok(r) if keys::parse_failure_report(&kv.key) == Some((r.reporter, r.accused)) => {
                    out.push(r)
                }
                Ok(_) => tracing::warn!("ignoring {}: its record names other nodes", kv.key),
                Err(e) => tracing::warn!("ignoring an unreadable failure report: {e}"),
            }
        }
        Ok(out)
    }
}
