//! The simulated network: every request and reply between two nodes passes a fault layer
//! whose decisions come from a seeded random stream per link.
//!
//! A link is (sender node, receiving server). Its stream is seeded from the cluster seed and
//! the link's ends, and each message on it draws the same five numbers in the same order,
//! so the n-th message of a link meets the same fate in every run with that seed, whatever
//! the other links carry. Which message is the n-th depends on timing where several tasks
//! share a link (commit timers, background re-delivery, parallel requests), so a seed
//! replays the same workload and fault plan, and the same fates in the same order on each
//! link, but not always the same interleaving: a replay reproduces most failures, not all. Messages
//! travel encoded (the same frames as on TCP) and are decoded by the receiver, so the codec
//! is on the path too.

use futures::future::BoxFuture;
use plusfs_proto::{
    decode_request, decode_response, encode_request, encode_response, Cred, Frame, Request, Response, ServerId,
};
use plusfs_rpc::{CallError, Counters, Transport};
use plusfs_server::Osd;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// A node of the simulated network: a server's id, or a client's ([`client_node`]).
pub type NodeId = u32;

/// First node id of clients (servers use their cluster-map ids, which are smaller).
pub const CLIENT_BASE: NodeId = 1 << 20;

/// The node id of the `n`-th client.
pub fn client_node(n: u32) -> NodeId {
    CLIENT_BASE + n
}

/// Probabilities of the faults every message may meet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// The request is lost before the server sees it.
    pub drop_request: f64,
    /// The server serves the request but its reply is lost.
    pub drop_reply: f64,
    /// An idempotent request is delivered twice (a resend after a lost reply).
    pub duplicate: f64,
    /// The message is held up to `max_delay` (which reorders it against later ones).
    pub delay: f64,
    /// Longest delay.
    pub max_delay: Duration,
}

impl Faults {
    /// No faults: every message is delivered at once.
    pub fn none() -> Faults {
        Faults::default()
    }
}

/// How many messages met each fate.
#[derive(Debug, Default)]
struct FateCounters {
    delivered: AtomicU64,
    dropped_requests: AtomicU64,
    dropped_replies: AtomicU64,
    duplicated: AtomicU64,
    delayed: AtomicU64,
    partitioned: AtomicU64,
    refused_down: AtomicU64,
}

/// A copy of the fate counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FateCounts {
    pub delivered: u64,
    pub dropped_requests: u64,
    pub dropped_replies: u64,
    pub duplicated: u64,
    pub delayed: u64,
    pub partitioned: u64,
    pub refused_down: u64,
}

impl std::ops::AddAssign for FateCounts {
    fn add_assign(&mut self, o: FateCounts) {
        self.delivered += o.delivered;
        self.dropped_requests += o.dropped_requests;
        self.dropped_replies += o.dropped_replies;
        self.duplicated += o.duplicated;
        self.delayed += o.delayed;
        self.partitioned += o.partitioned;
        self.refused_down += o.refused_down;
    }
}

/// What the fault layer decided for one message.
struct Fate {
    drop_request: bool,
    delay: Option<Duration>,
    duplicate: bool,
    drop_reply: bool,
}

/// A running server as the network reaches it: its state and the runtime it runs on.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub osd: Arc<Osd>,
    pub rt: tokio::runtime::Handle,
}

/// The network between the nodes of one test cluster.
pub struct SimNet {
    seed: u64,
    faults: RwLock<Faults>,
    cut: RwLock<HashSet<(NodeId, NodeId)>>,
    links: Mutex<HashMap<(NodeId, ServerId), StdRng>>,
    fates: FateCounters,
    endpoints: RwLock<HashMap<ServerId, Endpoint>>,
}

fn pair(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    (a.min(b), a.max(b))
}

fn link_seed(seed: u64, from: NodeId, to: ServerId) -> u64 {
    // splitmix64 of the three, so neighbouring links get unrelated streams.
    let mut z = seed ^ ((from as u64) << 32 | to as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SimNet {
    /// A network with no faults whose decisions derive from `seed`.
    pub fn new(seed: u64) -> SimNet {
        SimNet {
            seed,
            faults: RwLock::default(),
            cut: RwLock::default(),
            links: Mutex::default(),
            fates: FateCounters::default(),
            endpoints: RwLock::default(),
        }
    }

    /// Sets the fault probabilities of every link.
    pub fn set_faults(&self, faults: Faults) {
        *self.faults.write().expect("faults lock") = faults;
    }

    /// Cuts every link between a node of `a` and a node of `b` (both directions).
    pub fn partition(&self, a: &[NodeId], b: &[NodeId]) {
        let mut cut = self.cut.write().expect("cut lock");
        for &x in a {
            for &y in b {
                cut.insert(pair(x, y));
            }
        }
    }

    /// Restores every cut link.
    pub fn heal(&self) {
        self.cut.write().expect("cut lock").clear();
    }

    /// How many messages met each fate so far.
    pub fn fates(&self) -> FateCounts {
        let f = &self.fates;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FateCounts {
            delivered: get(&f.delivered),
            dropped_requests: get(&f.dropped_requests),
            dropped_replies: get(&f.dropped_replies),
            duplicated: get(&f.duplicated),
            delayed: get(&f.delayed),
            partitioned: get(&f.partitioned),
            refused_down: get(&f.refused_down),
        }
    }

    pub(crate) fn attach(&self, id: ServerId, ep: Endpoint) {
        self.endpoints.write().expect("endpoints lock").insert(id, ep);
    }

    pub(crate) fn detach(&self, id: ServerId) -> Option<Endpoint> {
        self.endpoints.write().expect("endpoints lock").remove(&id)
    }

    fn endpoint(&self, id: ServerId) -> Option<Endpoint> {
        self.endpoints.read().expect("endpoints lock").get(&id).cloned()
    }

    fn fate(&self, from: NodeId, to: ServerId) -> Fate {
        let faults = self.faults.read().expect("faults lock").clone();
        let mut links = self.links.lock().expect("links lock");
        let rng = links.entry((from, to)).or_insert_with(|| StdRng::seed_from_u64(link_seed(self.seed, from, to)));
        // Always draw all five, so one message's fate never shifts the next one's.
        let (r_drop, r_delay, r_dup, r_lost) = (rng.gen::<f64>(), rng.gen::<f64>(), rng.gen::<f64>(), rng.gen::<f64>());
        let amount = rng.gen_range(0..=faults.max_delay.as_micros().max(1) as u64);
        Fate {
            drop_request: r_drop < faults.drop_request,
            delay: (r_delay < faults.delay).then(|| Duration::from_micros(amount)),
            duplicate: r_dup < faults.duplicate,
            drop_reply: r_lost < faults.drop_reply,
        }
    }

    fn is_cut(&self, from: NodeId, to: ServerId) -> bool {
        self.cut.read().expect("cut lock").contains(&pair(from, to))
    }

    /// Carries `req` from `from` to server `to` and its reply back, through the faults.
    async fn carry(
        &self,
        from: NodeId,
        to: ServerId,
        cred: &Cred,
        req: &Request,
        counters: &Counters,
    ) -> Result<Response, CallError> {
        let addr = format!("sim server {to}");
        let lost = |reason: &str| CallError::Broken { addr: addr.clone(), reason: reason.to_string() };
        let frame = encode_request(1, cred, req)
            .map_err(|e| CallError::Protocol {
                addr: addr.clone(),
                reason: e.to_string(),
                errno: plusfs_proto::Errno::EMSGSIZE,
            })?
            .to_bytes()
            .freeze();
        counters.msgs_out.fetch_add(1, Ordering::Relaxed);
        counters.bytes_out.fetch_add(frame.len() as u64, Ordering::Relaxed);
        let fate = self.fate(from, to);
        if self.is_cut(from, to) {
            self.fates.partitioned.fetch_add(1, Ordering::Relaxed);
            return Err(CallError::Connect { addr, reason: "network partitioned".into() });
        }
        if let Some(d) = fate.delay {
            self.fates.delayed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(d).await;
        }
        if fate.drop_request {
            self.fates.dropped_requests.fetch_add(1, Ordering::Relaxed);
            return Err(lost("request lost"));
        }
        let Some(ep) = self.endpoint(to) else {
            self.fates.refused_down.fetch_add(1, Ordering::Relaxed);
            return Err(CallError::Connect { addr, reason: "server down".into() });
        };
        let reply = deliver(&ep, frame.clone()).await.ok_or_else(|| lost("server crashed"))?;
        if fate.duplicate && req.is_idempotent() {
            self.fates.duplicated.fetch_add(1, Ordering::Relaxed);
            let _ = deliver(&ep, frame).await;
        }
        if fate.drop_reply {
            self.fates.dropped_replies.fetch_add(1, Ordering::Relaxed);
            return Err(lost("reply lost"));
        }
        self.fates.delivered.fetch_add(1, Ordering::Relaxed);
        counters.msgs_in.fetch_add(1, Ordering::Relaxed);
        counters.bytes_in.fetch_add(reply.len() as u64, Ordering::Relaxed);
        let frame = Frame::parse(reply).map_err(|e| lost(&e.to_string()))?;
        decode_response(&frame).map_err(|e| CallError::Protocol { addr, reason: e.to_string(), errno: e.errno() })
    }
}

/// Serves one encoded request on the server's own runtime; `None` if the server crashed
/// before it replied.
async fn deliver(ep: &Endpoint, frame: bytes::Bytes) -> Option<bytes::Bytes> {
    let osd = ep.osd.clone();
    let task = ep.rt.spawn(async move {
        let frame = Frame::parse(frame).expect("the sender encoded a whole frame");
        let resp = match decode_request(&frame) {
            Ok(call) => osd.handle(call.cred, call.request).await,
            Err(e) => Err(plusfs_proto::WireError::new(e.errno(), e.to_string())),
        };
        let (id, opcode) = (frame.header.request_id, frame.header.opcode);
        let out = encode_response(id, opcode, &resp).unwrap_or_else(|e| {
            let too_big =
                Err(plusfs_proto::WireError::new(plusfs_proto::Errno::EMSGSIZE, format!("reply too large: {e}")));
            encode_response(id, opcode, &too_big).expect("an error reply fits a frame")
        });
        out.to_bytes().freeze()
    });
    task.await.ok()
}

/// The transport of one node: its calls to servers go through the simulated network.
pub struct SimTransport {
    pub(crate) net: Arc<SimNet>,
    pub(crate) from: NodeId,
    pub(crate) counters: Arc<Counters>,
}

impl Transport for SimTransport {
    fn send<'a>(
        &'a self,
        server: ServerId,
        cred: &'a Cred,
        req: &'a Request,
    ) -> BoxFuture<'a, Result<Response, CallError>> {
        Box::pin(self.net.carry(self.from, server, cred, req, &self.counters))
    }
}
