//! [`SimNet`]: the simulated network between node services (and clients).
//!
//! Each link is like a TCP connection: requests arrive in the order they were sent (a
//! primary's sub-operations rely on it), answers come back in the order they were ready, and
//! each message takes a delay drawn from the network's seed (a later message never overtakes
//! an earlier one on the same link). A partition between two hosts (one way or both) holds
//! the messages that would cross it until it heals, as TCP retransmits would; connecting
//! across one waits for the heal or fails after the caller's timeout. Breaking a link (the
//! simulator's "drop") fails every request still waiting on it, like a reset connection; a
//! request already delivered may still be applied. A killed host's links break at once and
//! connections to it are refused.

use super::Rng;
use basalt_link::{Connector, Link};
use basalt_proto::{ErrorCode, Request, Response, ResponseFuture, Service, WireError};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

/// A machine on the simulated network (a node, or a client).
pub type Host = u32;

/// What the network did (for the simulator's coverage counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    pub messages: u64,
    /// Messages that waited for a partition to heal.
    pub held: u64,
    pub breaks: u64,
    pub refused: u64,
}

/// The network. Cheap to clone.
#[derive(Clone)]
pub struct SimNet(Arc<Net>);

struct Net {
    state: Mutex<State>,
    /// Woken when a partition changes or a link breaks.
    changed: Notify,
}

struct State {
    rng: Rng,
    /// Per-message delay, microseconds.
    delay: (u64, u64),
    /// Node services by address.
    endpoints: BTreeMap<String, Endpoint>,
    /// The current incarnation of each live host (absent: dead).
    alive: BTreeMap<Host, u64>,
    next_incarnation: u64,
    /// `(from, to)`: messages from `from` to `to` are held.
    cut: BTreeSet<(Host, Host)>,
    links: Vec<Weak<LinkShared>>,
    stats: NetStats,
}

struct Endpoint {
    host: Host,
    incarnation: u64,
    service: Arc<dyn Service>,
}

impl SimNet {
    /// A network whose delays (uniform in `delay`) come from `seed`.
    pub fn new(seed: u64, delay: (Duration, Duration)) -> SimNet {
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        SimNet(Arc::new(Net {
            state: Mutex::new(State {
                rng: Rng::new(seed),
                delay: (us(delay.0), us(delay.1)),
                endpoints: BTreeMap::new(),
                alive: BTreeMap::new(),
                next_incarnation: 1,
                cut: BTreeSet::new(),
                links: Vec::new(),
                stats: NetStats::default(),
            }),
            changed: Notify::new(),
        }))
    }

    pub fn stats(&self) -> NetStats {
        self.0.state.lock().stats
    }

    /// A host (re)starts: returns its new incarnation. Links and connectors of earlier
    /// incarnations stay dead.
    pub fn boot(&self, host: Host) -> u64 {
        let mut st = self.0.state.lock();
        let inc = st.next_incarnation;
        st.next_incarnation += 1;
        st.alive.insert(host, inc);
        inc
    }

    /// Serves `service` at `addr` for incarnation `incarnation` of `host`.
    pub fn attach(&self, host: Host, incarnation: u64, addr: &str, service: Arc<dyn Service>) {
        self.0.state.lock().endpoints.insert(
            addr.to_string(),
            Endpoint {
                host,
                incarnation,
                service,
            },
        );
    }

    /// Kills `host`: its services go, every link from or to it breaks.
    pub fn kill(&self, host: Host) {
        {
            let mut st = self.0.state.lock();
            st.alive.remove(&host);
            st.endpoints.retain(|_, e| e.host != host);
        }
        self.break_links(|from, to| from == host || to == host);
    }

    /// How `host` (incarnation `incarnation`) connects to the others.
    pub fn connector(&self, host: Host, incarnation: u64) -> Arc<dyn Connector> {
        Arc::new(SimConnector {
            net: self.clone(),
            host,
            incarnation,
        })
    }

    /// A service for a client on `host` that reaches the node at `addr`, connecting (again)
    /// whenever its link broke.
    pub fn client_port(&self, host: Host, addr: &str) -> Arc<dyn Service> {
        Arc::new(ClientPort {
            net: self.clone(),
            host,
            addr: addr.to_string(),
            link: Arc::new(tokio::sync::Mutex::new(None)),
        })
    }

    /// Holds messages from `from` to `to` (one way) until [`SimNet::heal`].
    pub fn cut(&self, from: Host, to: Host) {
        self.0.state.lock().cut.insert((from, to));
        self.0.changed.notify_waiters();
    }

    pub fn heal(&self, from: Host, to: Host) {
        self.0.state.lock().cut.remove(&(from, to));
        self.0.changed.notify_waiters();
    }

    pub fn heal_all(&self) {
        self.0.state.lock().cut.clear();
        self.0.changed.notify_waiters();
    }

    pub fn is_cut(&self, from: Host, to: Host) -> bool {
        self.0.state.lock().cut.contains(&(from, to))
    }

    /// Breaks every open link from `from` to `to` for which `pick(from, to)` holds.
    pub fn break_links(&self, pick: impl Fn(Host, Host) -> bool) {
        let links: Vec<Arc<LinkShared>> = {
            let mut st = self.0.state.lock();
            st.links
                .retain(|l| l.upgrade().is_some_and(|l| !l.is_closed()));
            st.links
                .iter()
                .filter_map(Weak::upgrade)
                .filter(|l| pick(l.from, l.to))
                .collect()
        };
        self.0.state.lock().stats.breaks += links.len() as u64;
        for l in links {
            l.close("connection reset (simulated)");
        }
        self.0.changed.notify_waiters();
    }

    fn delay(&self) -> Duration {
        let mut st = self.0.state.lock();
        st.stats.messages += 1;
        let (lo, hi) = st.delay;
        Duration::from_micros(st.rng.between(lo, hi))
    }

    fn is_alive(&self, host: Host, incarnation: u64) -> bool {
        self.0.state.lock().alive.get(&host) == Some(&incarnation)
    }

    fn service_of(&self, host: Host, incarnation: u64) -> Option<Arc<dyn Service>> {
        let st = self.0.state.lock();
        st.endpoints
            .values()
            .find(|e| e.host == host && e.incarnation == incarnation)
            .map(|e| e.service.clone())
    }

    /// Waits until messages from `from` to `to` may pass; false if `link` broke meanwhile.
    async fn passable(&self, link: &LinkShared, from: Host, to: Host) -> bool {
        let mut held = false;
        loop {
            let notified = self.0.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if link.is_closed() {
                return false;
            }
            if !self.is_cut(from, to) {
                return true;
            }
            if !held {
                held = true;
                self.0.state.lock().stats.held += 1;
            }
            notified.await;
        }
    }

    /// Waits until neither direction between the hosts is cut, for at most `timeout`.
    async fn reachable(&self, from: Host, to: Host, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.0.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.is_cut(from, to) && !self.is_cut(to, from) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// Opens a link from `host` to the node at `addr`.
    async fn connect(
        &self,
        host: Host,
        incarnation: u64,
        addr: &str,
        timeout: Duration,
    ) -> Result<Arc<SimLink>, String> {
        let refused = |net: &SimNet, why: &str| {
            net.0.state.lock().stats.refused += 1;
            Err(format!("connecting to {addr}: {why} (simulated)"))
        };
        if !self.is_alive(host, incarnation) {
            return refused(self, "the connecting host is dead");
        }
        let target = |net: &SimNet| {
            let st = net.0.state.lock();
            st.endpoints.get(addr).map(|e| (e.host, e.incarnation))
        };
        let Some((to, _)) = target(self) else {
            return refused(self, "connection refused");
        };
        tokio::time::sleep(self.delay()).await;
        if !self.reachable(host, to, timeout).await {
            return refused(self, "connect timed out");
        }
        let Some((to, to_inc)) = target(self) else {
            return refused(self, "connection refused");
        };
        if !self.is_alive(host, incarnation) {
            return refused(self, "the connecting host is dead");
        }
        Ok(SimLink::open(self, host, to, to_inc))
    }
}

/// One direction's shared state of a link.
struct LinkShared {
    from: Host,
    to: Host,
    closed: AtomicBool,
    next_id: AtomicU64,
    pending: Mutex<BTreeMap<u64, oneshot::Sender<Result<Response, WireError>>>>,
}

impl LinkShared {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn close(&self, why: &str) {
        self.closed.store(true, Ordering::SeqCst);
        let pending = std::mem::take(&mut *self.pending.lock());
        for (_, reply) in pending {
            let _ = reply.send(Err(lost(self.to, why)));
        }
    }

    fn answer(&self, id: u64, answer: Result<Response, WireError>) {
        if let Some(reply) = self.pending.lock().remove(&id) {
            let _ = reply.send(answer);
        }
    }
}

fn lost(to: Host, why: &str) -> WireError {
    WireError::new(
        ErrorCode::ShuttingDown,
        format!("connection to host {to} lost: {why}"),
    )
}

/// A link from one host to a node service.
struct SimLink {
    shared: Arc<LinkShared>,
    tx: mpsc::UnboundedSender<(u64, Request)>,
}

impl SimLink {
    fn open(net: &SimNet, from: Host, to: Host, to_inc: u64) -> Arc<SimLink> {
        let shared = Arc::new(LinkShared {
            from,
            to,
            closed: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            pending: Mutex::new(BTreeMap::new()),
        });
        net.0.state.lock().links.push(Arc::downgrade(&shared));
        let (tx, rx) = mpsc::unbounded_channel();
        let (answers_tx, answers_rx) = mpsc::unbounded_channel();
        tokio::spawn(deliver(net.clone(), shared.clone(), to_inc, rx, answers_tx));
        tokio::spawn(answer(net.clone(), shared.clone(), answers_rx));
        Arc::new(SimLink { shared, tx })
    }
}

impl Service for SimLink {
    fn call(&self, req: Request) -> ResponseFuture {
        let shared = &self.shared;
        if shared.is_closed() {
            let e = lost(shared.to, "the link is closed");
            return Box::pin(async move { Err(e) });
        }
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        let (reply, rx) = oneshot::channel();
        shared.pending.lock().insert(id, reply);
        let _ = self.tx.send((id, req));
        let to = shared.to;
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(lost(to, "the link is closed")))
        })
    }
}

impl Link for SimLink {
    fn is_open(&self) -> bool {
        !self.shared.is_closed()
    }
}

/// The request side of a link: in order, each after its delay (never before the previous
/// one), held while the way is cut, handed to the service as soon as it arrives (before the
/// next one, as the node's TCP server does).
async fn deliver(
    net: SimNet,
    link: Arc<LinkShared>,
    to_inc: u64,
    mut rx: mpsc::UnboundedReceiver<(u64, Request)>,
    answers: mpsc::UnboundedSender<(u64, ResponseFuture)>,
) {
    let mut last = Instant::now();
    while let Some((id, req)) = rx.recv().await {
        let at = last.max(Instant::now() + net.delay());
        tokio::time::sleep_until(at).await;
        last = at;
        if !net.passable(&link, link.from, link.to).await {
            continue;
        }
        let Some(svc) = net.service_of(link.to, to_inc) else {
            link.close("the node is gone");
            continue;
        };
        let _ = answers.send((id, svc.call(req)));
    }
}

/// The answer side: each answer once ready, then its delay, in the order they were ready.
async fn answer(
    net: SimNet,
    link: Arc<LinkShared>,
    mut rx: mpsc::UnboundedReceiver<(u64, ResponseFuture)>,
) {
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
    // Dropped once the request side is done, so that the loop ends after the last answer.
    let mut ready_tx = Some(ready_tx);
    let mut last = Instant::now();
    loop {
        tokio::select! {
            biased;
            ready = ready_rx.recv() => {
                let Some((id, result)) = ready else { return };
                let at = last.max(Instant::now() + net.delay());
                tokio::time::sleep_until(at).await;
                last = at;
                if net.passable(&link, link.to, link.from).await {
                    link.answer(id, result);
                }
            }
            call = rx.recv(), if ready_tx.is_some() => match (call, &ready_tx) {
                (Some((id, fut)), Some(tx)) => {
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        let _ = tx.send((id, fut.await));
                    });
                }
                _ => ready_tx = None,
            },
        }
    }
}

/// A node's connector on the simulated network.
struct SimConnector {
    net: SimNet,
    host: Host,
    incarnation: u64,
}

impl Connector for SimConnector {
    fn connect(
        &self,
        addr: &str,
        _name: &str,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Arc<dyn Link>, String>> {
        let (net, host, inc, addr) = (
            self.net.clone(),
            self.host,
            self.incarnation,
            addr.to_string(),
        );
        Box::pin(async move {
            let link = net.connect(host, inc, &addr, timeout).await?;
            Ok(link as Arc<dyn Link>)
        })
    }
}

/// How long a client's connection attempt waits across a partition.
const CLIENT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A client's way to one node: a link, replaced when it breaks.
struct ClientPort {
    net: SimNet,
    host: Host,
    addr: String,
    link: Arc<tokio::sync::Mutex<Option<Arc<SimLink>>>>,
}

impl Service for ClientPort {
    fn call(&self, req: Request) -> ResponseFuture {
        let (net, host, addr, slot) = (
            self.net.clone(),
            self.host,
            self.addr.clone(),
            self.link.clone(),
        );
        Box::pin(async move {
            let link = {
                let mut guard = slot.lock().await;
                match guard.as_ref() {
                    Some(l) if l.is_open() => l.clone(),
                    _ => {
                        let inc = net.0.state.lock().alive.get(&host).copied().unwrap_or(0);
                        let l = net
                            .connect(host, inc, &addr, CLIENT_CONNECT_TIMEOUT)
                            .await
                            .map_err(|e| WireError::new(ErrorCode::ShuttingDown, e))?;
                        *guard = Some(l.clone());
                        l
                    }
                }
            };
            link.call(req).await
        })
    }
}
