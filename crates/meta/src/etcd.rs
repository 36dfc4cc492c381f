//! [`EtcdStore`]: the metadata store on a real etcd cluster (v3 API, `etcd-client`).
//!
//! Every key is stored under a configurable prefix (`""` in production, a unique prefix per test
//! so tests can share one etcd); keys coming back are stripped of it. Unary calls time out after
//! [`REQUEST_TIMEOUT`] and report [`MetaError::Unavailable`]. Watches run on their own gRPC stream
//! in a task that forwards events through the same bounded channel as the embedded store (see
//! [`crate::watch`]), so both backends report a slow watcher the same way.

use crate::error::MetaError;
use crate::store::{
    Compare, CompareOp, CompareTarget, KeyValue, LeaseId, Listing, MetaStore, Revision, Txn, TxnOp,
    TxnOpResult, TxnResult, WatchEvent, WatchReceiver, ttl_secs,
};
use crate::watch::{self, Delivery, WatchSender};
use async_trait::async_trait;
use etcd_client as etcd;
use std::future::Future;
use std::time::Duration;

/// The largest response accepted from etcd (big listings, big cluster maps).
const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// How long one unary request may take before the store counts as unavailable.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The etcd backend. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct EtcdStore {
    client: etcd::Client,
    prefix: String,
    endpoints: String,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl EtcdStore {
    /// Connects to etcd at `endpoints` (e.g. `http://127.0.0.1:2379`) and checks that it
    /// answers. Every key is stored under `prefix` (may be empty).
    pub async fn connect<S: AsRef<str>>(
        endpoints: &[S],
        prefix: &str,
    ) -> Result<EtcdStore, MetaError> {
        let eps: Vec<String> = endpoints.iter().map(|e| e.as_ref().to_string()).collect();
        let joined = eps.join(",");
        // `require_leader`: a member that lost its cluster's leader (cut off from its peers,
        // still reachable) cancels our watches and refuses requests instead of leaving a watch
        // open and silent (it hears of no change any more): the watcher sees `Lost`, re-lists
        // and watches again, through another member once the client balances away
        // (`tests/etcd_quorum.rs`).
        let options = etcd::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_require_leader(true);
        let unavailable = |detail: String| MetaError::Unavailable {
            endpoint: joined.clone(),
            detail,
        };
        let client =
            tokio::time::timeout(REQUEST_TIMEOUT, etcd::Client::connect(&eps, Some(options)))
                .await
                .map_err(|_| unavailable("connecting timed out".into()))?
                .map_err(|e| unavailable(e.to_string()))?;
        let store = EtcdStore {
            client,
            prefix: prefix.to_string(),
            endpoints: joined,
        };
        store.revision().await?;
        Ok(store)
    }

    /// The prefix under which this store keeps its keys.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn kv(&self) -> etcd::KvClient {
        self.client
            .kv_client()
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn convert_kv(&self, kv: &etcd::KeyValue) -> Result<KeyValue, MetaError> {
        let key = String::from_utf8_lossy(kv.key());
        let key = key.strip_prefix(&self.prefix).unwrap_or(&key).to_string();
        Ok(KeyValue {
            key,
            value: kv.value().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            version: kv.version(),
            lease: (kv.lease() != 0).then_some(LeaseId(kv.lease())),
        })
    }

    /// Runs one unary call with the request timeout and error mapping. `lease` names the lease
    /// the call uses, so that etcd's "lease not found" becomes [`MetaError::LeaseNotFound`].
    async fn call<T>(
        &self,
        lease: Option<LeaseId>,
        fut: impl Future<Output = Result<T, etcd::Error>>,
    ) -> Result<T, MetaError> {
        match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.map_err(e, lease)),
            Err(_) => Err(MetaError::Unavailable {
                endpoint: self.endpoints.clone(),
                detail: format!("no answer within {REQUEST_TIMEOUT:?}"),
            }),
        }
    }

    fn map_err(&self, e: etcd::Error, lease: Option<LeaseId>) -> MetaError {
        let unavailable = |detail: String| MetaError::Unavailable {
            endpoint: self.endpoints.clone(),
            detail,
        };
        match e {
            etcd::Error::GRpcStatus(s) if s.message().contains("lease not found") => {
                MetaError::LeaseNotFound(lease.unwrap_or(LeaseId(0)))
            }
            etcd::Error::LeaseKeepAliveError(m) if m.contains("lease not found") => {
                MetaError::LeaseNotFound(lease.unwrap_or(LeaseId(0)))
            }
            etcd::Error::GRpcStatus(s) if connection_lost(&s) => {
                unavailable(format!("{} ({:?})", s.message(), s.code()))
            }
            etcd::Error::GRpcStatus(s) if s.code() == tonic::Code::ResourceExhausted => {
                MetaError::Backend(format!(
                    "{}; the request is larger than etcd accepts: run etcd with a larger \
                     --max-request-bytes (basalt's own etcd uses {} MiB)",
                    s.message(),
                    crate::etcd_process::MAX_REQUEST_BYTES >> 20
                ))
            }
            etcd::Error::GRpcStatus(s) if s.code() == tonic::Code::InvalidArgument => {
                MetaError::InvalidTxn(s.message().to_string())
            }
            etcd::Error::TransportError(t) => unavailable(t.to_string()),
            etcd::Error::IoError(io) => unavailable(io.to_string()),
            other => MetaError::Backend(other.to_string()),
        }
    }

    fn convert_compare(&self, c: &Compare) -> etcd::Compare {
        let key = self.full(&c.key);
        let op = |op: CompareOp| match op {
            CompareOp::Equal => etcd::CompareOp::Equal,
            CompareOp::NotEqual => etcd::CompareOp::NotEqual,
            CompareOp::Greater => etcd::CompareOp::Greater,
            CompareOp::Less => etcd::CompareOp::Less,
        };
        match &c.target {
            CompareTarget::Value(o, v) => etcd::Compare::value(key, op(*o), v.clone()),
            CompareTarget::ModRevision(o, r) => etcd::Compare::mod_revision(key, op(*o), *r),
            CompareTarget::CreateRevision(o, r) => etcd::Compare::create_revision(key, op(*o), *r),
            CompareTarget::Version(o, v) => etcd::Compare::version(key, op(*o), *v),
        }
    }

    fn convert_op(&self, op: &TxnOp) -> etcd::TxnOp {
        match op {
            TxnOp::Put { key, value, lease } => etcd::TxnOp::put(
                self.full(key),
                value.clone(),
                lease.map(|l| etcd::PutOptions::new().with_lease(l.0)),
            ),
            TxnOp::Delete { key } => etcd::TxnOp::delete(self.full(key), None),
            TxnOp::Get { key } => etcd::TxnOp::get(self.full(key), None),
        }
    }

    fn convert_event(&self, ev: &etcd::Event) -> Option<WatchEvent> {
        let kv = self.convert_kv(ev.kv()?).ok()?;
        Some(match ev.event_type() {
            etcd::EventType::Put => WatchEvent::Put(kv),
            etcd::EventType::Delete => WatchEvent::Delete(KeyValue {
                value: Vec::new(),
                create_revision: 0,
                version: 0,
                lease: None,
                ..kv
            }),
        })
    }
}

/// Whether a gRPC status means "could not reach etcd" rather than "etcd refused". A connection
/// that broke in the middle of a request surfaces as `Unknown` "transport error".
fn connection_lost(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
    ) || (s.code() == tonic::Code::Unknown && s.message().contains("transport error"))
}

fn header_revision(h: Option<&etcd::ResponseHeader>) -> Revision {
    h.map_or(0, |h| h.revision())
}

#[async_trait]
impl MetaStore for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, MetaError> {
        let mut kv = self.kv();
        let resp = self.call(None, kv.get(self.full(key), None)).await?;
        resp.kvs().first().map(|kv| self.convert_kv(kv)).transpose()
    }

    async fn list(&self, prefix: &str) -> Result<Listing, MetaError> {
        let mut kv = self.kv();
        let opts = etcd::GetOptions::new().with_prefix();
        let resp = self
            .call(None, kv.get(self.full(prefix), Some(opts)))
            .await?;
        let kvs = resp
            .kvs()
            .iter()
            .map(|kv| self.convert_kv(kv))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Listing {
            kvs,
            revision: header_revision(resp.header()),
        })
    }

    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, MetaError> {
        let mut kv = self.kv();
        let opts = lease.map(|l| etcd::PutOptions::new().with_lease(l.0));
        let resp = self
            .call(lease, kv.put(self.full(key), value, opts))
            .await?;
        Ok(header_revision(resp.header()))
    }

    async fn delete(&self, key: &str) -> Result<bool, MetaError> {
        let mut kv = self.kv();
        let resp = self.call(None, kv.delete(self.full(key), None)).await?;
        Ok(resp.deleted() > 0)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult, MetaError> {
        txn.validate()?;
        let lease = txn
            .success
            .iter()
            .chain(&txn.failure)
            .find_map(|op| match op {
                TxnOp::Put { lease, .. } => *lease,
                _ => None,
            });
        let request = etcd::Txn::new()
            .when(
                txn.compares
                    .iter()
                    .map(|c| self.convert_compare(c))
                    .collect::<Vec<_>>(),
            )
            .and_then(
                txn.success
                    .iter()
                    .map(|o| self.convert_op(o))
                    .collect::<Vec<_>>(),
            )
            .or_else(
                txn.failure
                    .iter()
                    .map(|o| self.convert_op(o))
                    .collect::<Vec<_>>(),
            );
        let mut kv = self.kv();
        let resp = self.call(lease, kv.txn(request)).await?;
        let mut results = Vec::new();
        for r in resp.op_responses() {
            results.push(match r {
                etcd::TxnOpResponse::Put(_) => TxnOpResult::Put,
                etcd::TxnOpResponse::Delete(d) => TxnOpResult::Delete {
                    deleted: d.deleted() > 0,
                },
                etcd::TxnOpResponse::Get(g) => {
                    TxnOpResult::Get(g.kvs().first().map(|kv| self.convert_kv(kv)).transpose()?)
                }
                etcd::TxnOpResponse::Txn(_) => {
                    return Err(MetaError::Backend("unexpected nested txn response".into()));
                }
            });
        }
        Ok(TxnResult {
            succeeded: resp.succeeded(),
            revision: header_revision(resp.header()),
            results,
        })
    }

    async fn watch_prefix(&self, prefix: &str, from: Revision) -> Result<WatchReceiver, MetaError> {
        let mut opts = etcd::WatchOptions::new().with_prefix();
        if from > 0 {
            opts = opts.with_start_revision(from);
        }
        let mut client = self
            .client
            .watch_client()
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let stream = self
            .call(None, client.watch(self.full(prefix), Some(opts)))
            .await?;
        let (tx, rx) = watch::channel();
        tokio::spawn(forward_watch(self.clone(), stream, tx));
        Ok(rx)
    }

    async fn revision(&self) -> Result<Revision, MetaError> {
        let mut kv = self.kv();
        // Any key will do: only the response header's revision is used (etcd refuses "").
        let opts = etcd::GetOptions::new().with_count_only();
        let resp = self.call(None, kv.get(self.full("/"), Some(opts))).await?;
        Ok(header_revision(resp.header()))
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, MetaError> {
        let mut lease = self.client.lease_client();
        let resp = self.call(None, lease.grant(ttl_secs(ttl), None)).await?;
        Ok(LeaseId(resp.id()))
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<(), MetaError> {
        // Opening the keep-alive stream sends one renewal and waits for its answer; etcd-client
        // reports a TTL of 0 (lease gone) as an error, mapped to LeaseNotFound.
        let mut client = self.client.lease_client();
        self.call(Some(lease), client.keep_alive(lease.0)).await?;
        Ok(())
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), MetaError> {
        let mut client = self.client.lease_client();
        match self.call(Some(lease), client.revoke(lease.0)).await {
            Ok(_) | Err(MetaError::LeaseNotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Forwards one etcd watch stream into a watch channel until the receiver goes away or the
/// stream ends; an end other than the receiver's is reported as [`WatchEvent::Lost`].
async fn forward_watch(store: EtcdStore, mut stream: etcd::WatchStream, mut tx: WatchSender) {
    loop {
        let msg = tokio::select! {
            biased;
            _ = tx.closed() => return,
            msg = stream.message() => msg,
        };
        match msg {
            Ok(Some(resp)) if resp.canceled() => {
                let reason = if resp.compact_revision() > 0 {
                    format!(
                        "the start revision was compacted (oldest available {}); re-list and \
                         watch again from the listing's revision + 1",
                        resp.compact_revision()
                    )
                } else {
                    format!("etcd cancelled the watch: {}", resp.cancel_reason())
                };
                tx.close(reason);
                return;
            }
            Ok(Some(resp)) => {
                for ev in resp.events() {
                    let Some(ev) = store.convert_event(ev) else {
                        continue;
                    };
                    if tx.offer(ev) == Delivery::Closed {
                        return;
                    }
                }
            }
            Ok(None) => {
                tx.close("etcd ended the watch stream; re-list and watch again".into());
                return;
            }
            Err(e) => {
                tx.close(format!(
                    "the watch connection to etcd broke ({e}); re-list and watch again"
                ));
                return;
            }
        }
    }
}
