//! A server's (or member's) Prometheus metrics: request latency by operation, observed as
//! requests are served, and what `cluster status` reports — operation counts, messages,
//! store writes and fsyncs, Cx and 2PC state, huge directories, the data store,
//! connections and TLS, the replica group — brought into the registry at each scrape
//! (`endpoint.rs`).

use crate::metrics::NetCounters;
use plusfs_metrics::prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use plusfs_metrics::{set_total, Latencies};
use plusfs_proto::{DistState, GroupInfo, ServerStatus};
use std::collections::HashMap;

/// Totals (counters) taken from a server's status: (name, help, value).
type Total = (&'static str, &'static str, fn(&ServerStatus) -> u64);

const TOTALS: &[Total] = &[
    ("plusfs_messages_in_total", "Messages received.", |s| s.msgs_in),
    ("plusfs_messages_out_total", "Messages sent.", |s| s.msgs_out),
    ("plusfs_bytes_in_total", "Bytes received.", |s| s.bytes_in),
    ("plusfs_bytes_out_total", "Bytes sent.", |s| s.bytes_out),
    ("plusfs_store_batches_total", "Store batches submitted.", |s| s.store_batches),
    ("plusfs_store_writes_total", "Store writes (group commit merges batches).", |s| s.store_writes),
    ("plusfs_store_fsyncs_total", "Store WAL fsyncs.", |s| s.store_syncs),
    ("plusfs_twopc_started_total", "Two-phase commits started as coordinator.", |s| s.tx_started),
    ("plusfs_cx_executed_total", "Cx sub-operations executed.", |s| s.cx_executed),
    ("plusfs_cx_committed_total", "Cx operations committed as coordinator.", |s| s.cx_committed),
    ("plusfs_cx_aborted_total", "Cx operations aborted as coordinator.", |s| s.cx_aborted),
    ("plusfs_cx_rounds_total", "Cx commitment rounds.", |s| s.cx_rounds),
    ("plusfs_data_appends_total", "Data-store append calls.", |s| s.data_appends),
    ("plusfs_data_reads_total", "Data-store read calls.", |s| s.data_reads),
    ("plusfs_data_read_bytes_total", "Data-store bytes read.", |s| s.data_bytes_read),
    ("plusfs_data_written_bytes_total", "Data-store bytes written.", |s| s.data_bytes_written),
    ("plusfs_deleg_recalls_total", "Directory delegation recalls.", |s| s.deleg_recalls),
];

/// Levels (gauges) taken from a server's status.
const LEVELS: &[Total] = &[
    ("plusfs_dir_objects", "Directory objects held.", |s| s.dir_objects),
    ("plusfs_entries", "Directory entries held.", |s| s.entries),
    ("plusfs_twopc_in_doubt", "Two-phase commits not yet finished.", |s| s.tx_pending),
    ("plusfs_cx_pending", "Cx operations pending commitment.", |s| s.cx_pending),
    ("plusfs_cx_log_bytes", "Live bytes of the Cx log.", |s| s.cx_log_bytes),
    ("plusfs_data_records", "File-data records held.", |s| s.data_records),
    ("plusfs_data_segments", "Data segments.", |s| s.data_segments),
    ("plusfs_data_bytes", "Bytes in data segments (live and dead: compaction reclaims the dead).", |s| s.data_bytes),
    ("plusfs_hugedirs", "Distributed directories homed here.", |s| s.hugedirs.len() as u64),
    ("plusfs_hugedirs_distributing", "Directories being (re)distributed now.", |s| {
        s.hugedirs.iter().filter(|h| h.state == DistState::Distributing).count() as u64
    }),
    ("plusfs_hugedir_shards", "Shards of distributed directories held.", |s| s.shards.len() as u64),
    ("plusfs_delegations", "Directory delegations live.", |s| s.delegations),
    ("plusfs_map_epoch", "Epoch of the cluster map the server works with.", |s| s.epoch),
    ("plusfs_weight_milli", "The server's weight in the map, in thousandths.", |s| s.weight_milli),
    ("plusfs_data_live_bytes", "Bytes of the file-data records files use here.", |s| s.data_live_bytes),
    ("plusfs_migrating", "1 while objects move to the homes of a new epoch.", |s| s.migrating as u64),
    ("plusfs_migration_objects_moved", "Directory objects handed to new homes in the running migration.", |s| {
        s.migration.as_ref().map_or(0, |m| m.objects_moved)
    }),
    ("plusfs_migration_objects_left", "Directory objects still to hand over (last count).", |s| {
        s.migration.as_ref().map_or(0, |m| m.objects_left)
    }),
    ("plusfs_migration_bytes_moved", "File-data bytes moved in the running migration.", |s| {
        s.migration.as_ref().map_or(0, |m| m.bytes_moved)
    }),
    ("plusfs_migration_bytes_left", "File-data bytes still to move (last count).", |s| {
        s.migration.as_ref().map_or(0, |m| m.bytes_left)
    }),
    ("plusfs_forwarded_requests", "Requests forwarded to their directory's home under a newer epoch.", |s| s.forwarded),
];

/// The registry of one server process and the metrics it keeps up to date.
pub struct Exporter {
    pub registry: Registry,
    /// Request latency by operation (`plusfs_request_duration_seconds{op}`).
    latencies: Latencies,
    ops: IntCounterVec,
    totals: HashMap<&'static str, IntCounter>,
    levels: HashMap<&'static str, IntGauge>,
    net: [IntCounter; 6],
    connections: IntGauge,
    replica: [IntGauge; 3],
    lag: IntGaugeVec,
    /// Entries per storing server of the directories being (re)distributed now.
    spreading: IntGaugeVec,
    /// Per quota: this server's share of its usage, and its hard limits.
    quota: [IntGaugeVec; 4],
    /// Whether an endpoint serves the registry (latencies are observed only then).
    enabled: std::sync::atomic::AtomicBool,
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid counter");
    registry.register(Box::new(c.clone())).expect("a new metric name");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid gauge");
    registry.register(Box::new(g.clone())).expect("a new metric name");
    g
}

impl Default for Exporter {
    fn default() -> Self {
        Exporter::new()
    }
}

impl Exporter {
    /// A new registry with every metric of a server.
    pub fn new() -> Exporter {
        let r = Registry::new();
        let latencies = Latencies::new(&r, "plusfs_request_duration_seconds", "Time to serve a request, by operation.");
        let ops = IntCounterVec::new(Opts::new("plusfs_ops_total", "Operations served, by operation."), &["op"])
            .expect("valid counter");
        r.register(Box::new(ops.clone())).expect("a new metric name");
        let lag = IntGaugeVec::new(
            Opts::new("plusfs_replica_lag_entries", "Log entries a member is behind the leader (on the leader)."),
            &["member"],
        )
        .expect("valid gauge");
        r.register(Box::new(lag.clone())).expect("a new metric name");
        let spreading = IntGaugeVec::new(
            Opts::new(
                "plusfs_hugedir_distributing_entries",
                "Entries on each storing server of the directories homed here that are being (re)distributed now \
                 (their progress).",
            ),
            &["server"],
        )
        .expect("valid gauge");
        r.register(Box::new(spreading.clone())).expect("a new metric name");
        let quota_gauge = |name: &str, help: &str| {
            let g = IntGaugeVec::new(Opts::new(name, help), &["owner"]).expect("valid gauge");
            r.register(Box::new(g.clone())).expect("a new metric name");
            g
        };
        let quota = [
            quota_gauge(
                "plusfs_quota_used_files",
                "Files of a quota's owner counted on this server (sum over servers).",
            ),
            quota_gauge(
                "plusfs_quota_used_bytes",
                "Bytes of a quota's owner counted on this server (sum over servers).",
            ),
            quota_gauge("plusfs_quota_limit_files", "A quota's hard limit of files (-1: none)."),
            quota_gauge("plusfs_quota_limit_bytes", "A quota's hard limit of bytes (-1: none)."),
        ];
        Exporter {
            quota,
            spreading,
            totals: TOTALS.iter().map(|(n, h, _)| (*n, counter(&r, n, h))).collect(),
            levels: LEVELS.iter().map(|(n, h, _)| (*n, gauge(&r, n, h))).collect(),
            net: [
                counter(&r, "plusfs_tls_handshakes_total", "TLS handshakes that admitted a peer."),
                counter(&r, "plusfs_tls_refusals_total", "Connections refused (handshake, certificate, revocation)."),
                counter(&r, "plusfs_refused_requests_total", "Requests the peer's identity does not allow."),
                counter(
                    &r,
                    "plusfs_connections_closed_idle_total",
                    "Connections closed idle, with a handshake not done in time, or with replies left unread.",
                ),
                counter(
                    &r,
                    "plusfs_space_refusals_total",
                    "Requests refused with ENOSPC: the server's disk is down to the free space kept for deletes.",
                ),
                counter(
                    &r,
                    "plusfs_budget_waits_total",
                    "Times a connection waited for room in its memory budget before its next request was read.",
                ),
            ],
            connections: gauge(&r, "plusfs_connections", "Client and peer connections open."),
            replica: [
                gauge(&r, "plusfs_replica_leader", "1 while this member leads its replica group."),
                gauge(&r, "plusfs_replica_term", "The member's Raft term."),
                gauge(&r, "plusfs_replica_applied_index", "Index of the last log entry the member applied."),
            ],
            lag,
            enabled: Default::default(),
            ops,
            latencies,
            registry: r,
        }
    }

    /// Starts observing request latencies (an endpoint serves them now).
    pub fn enable(&self) {
        self.enabled.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// True while an endpoint serves the registry: requests are to be timed.
    pub fn timing(&self) -> bool {
        self.enabled.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records that a request for `op` took `took`.
    pub fn observe(&self, op: &'static str, took: std::time::Duration) {
        self.latencies.observe(op, took);
    }

    /// Registers a store's latency histograms (once: the store a server opens).
    pub fn take_store(&self, histograms: Vec<Histogram>) {
        for h in histograms {
            if let Err(e) = self.registry.register(Box::new(h)) {
                tracing::debug!(cause = %e, "store histogram not registered");
            }
        }
    }

    /// Takes the totals and levels of a server's status.
    pub fn take_status(&self, s: &ServerStatus) {
        for (name, _, value) in TOTALS {
            set_total(&self.totals[name], value(s));
        }
        for (name, _, value) in LEVELS {
            self.levels[name].set(value(s) as i64);
        }
        for (op, n) in &s.ops {
            set_total(&self.ops.with_label_values(&[op.as_str()]), *n);
        }
        let mut spreading: HashMap<u32, u64> = HashMap::new();
        for h in s.hugedirs.iter().filter(|h| h.state == DistState::Distributing) {
            for (server, n) in &h.entries {
                *spreading.entry(*server).or_default() += n;
            }
        }
        self.spreading.reset();
        for (server, n) in spreading {
            self.spreading.with_label_values(&[server.to_string().as_str()]).set(n as i64);
        }
        for g in &self.quota {
            g.reset();
        }
        for (def, used) in &s.quotas {
            let owner = match (&def.path, def.owner) {
                (Some(p), plusfs_proto::quota::Owner::Tree(_)) => format!("tree {p}"),
                (_, o) => o.to_string(),
            };
            let limit = |l: Option<u64>| l.map_or(-1, |l| l as i64);
            let values = [used.files, used.bytes, limit(def.limits.files.hard), limit(def.limits.bytes.hard)];
            for (g, v) in self.quota.iter().zip(values) {
                g.with_label_values(&[owner.as_str()]).set(v);
            }
        }
    }

    /// Takes the connection and TLS counters.
    pub fn take_net(&self, n: &NetCounters) {
        set_total(&self.net[0], NetCounters::get(&n.tls_handshakes));
        set_total(&self.net[1], NetCounters::get(&n.tls_refusals));
        set_total(&self.net[2], NetCounters::get(&n.refused_requests));
        set_total(&self.net[3], NetCounters::get(&n.closed_idle));
        set_total(&self.net[4], NetCounters::get(&n.space_refusals));
        set_total(&self.net[5], NetCounters::get(&n.budget_waits));
        self.connections.set(NetCounters::get(&n.connections) as i64);
    }

    /// Takes a replica-group member's view of its group.
    pub fn take_group(&self, g: &GroupInfo) {
        self.replica[0].set(i64::from(g.state == "leader"));
        self.replica[1].set(g.term as i64);
        self.replica[2].set(g.applied.unwrap_or(0) as i64);
        self.lag.reset();
        for (member, behind) in &g.lag {
            self.lag.with_label_values(&[member.to_string().as_str()]).set(*behind as i64);
        }
    }
}
