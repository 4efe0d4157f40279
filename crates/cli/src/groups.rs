//! Replica groups seen from the command line: every member of every replicated server
//! slot asked directly (not through the leader), for `cluster status` and
//! `fsck --replicas`.

use plusfs_placement::{ClusterMap, ServerEntry};
use plusfs_proto::{GroupInfo, Reply, Request, StoreDigest};
use plusfs_rpc::{Connection, Counters};
use std::sync::Arc;
use std::time::Duration;

/// How long a member has to answer before it counts as down.
const MEMBER_WAIT: Duration = Duration::from_secs(3);

/// Sends `req` to the member at `addr` and returns its reply (an error names the member).
pub async fn ask(addr: &str, req: &Request) -> Result<Reply, String> {
    let call = async {
        let c = Connection::connect(addr, Arc::new(Counters::default())).await.map_err(|e| e.to_string())?;
        match c.call(&plusfs_proto::Cred::server(), req).await.map_err(|e| e.to_string())? {
            Ok(r) => Ok(r),
            Err(e) => Err(e.to_string()),
        }
    };
    tokio::time::timeout(MEMBER_WAIT, call).await.unwrap_or_else(|_| Err(format!("no answer from {addr}")))
}

/// Every member's view of slot `s`'s group, by member id (an error: the member is down).
pub async fn infos(s: &ServerEntry) -> Vec<(u64, Result<GroupInfo, String>)> {
    let mut out = Vec::new();
    for m in &s.members {
        let r = match ask(&m.address, &Request::GroupStatus).await {
            Ok(Reply::Group(g)) => Ok(g),
            Ok(other) => Err(format!("unexpected answer {other:?}")),
            Err(e) => Err(e),
        };
        out.push((m.id, r));
    }
    out
}

/// Every member's store digest of slot `s`, by member id.
pub async fn digests(s: &ServerEntry) -> Vec<(u64, Result<StoreDigest, String>)> {
    let mut out = Vec::new();
    for m in &s.members {
        let r = match ask(&m.address, &Request::GroupDigest).await {
            Ok(Reply::Digest(d)) => Ok(d),
            Ok(other) => Err(format!("unexpected answer {other:?}")),
            Err(e) => Err(e),
        };
        out.push((m.id, r));
    }
    out
}

/// Lines of `cluster status` for the replicated slots of `map` (none if there are none),
/// and whether every member answered.
pub async fn status_lines(map: &ClusterMap) -> (Vec<String>, bool) {
    let mut lines = Vec::new();
    let mut all_up = true;
    for s in map.servers.iter().filter(|s| !s.members.is_empty()) {
        for (id, info) in infos(s).await {
            let addr = s.member(id).map(|m| m.address.as_str()).unwrap_or("?");
            match info {
                Ok(g) => lines.push(format!(
                    "server {} member {id} {addr}: {}{} term={} leader={} last_log={} applied={}{}",
                    s.id,
                    g.state,
                    if g.serving { " (serving)" } else { "" },
                    g.term,
                    g.leader.map_or("-".into(), |l| l.to_string()),
                    g.last_log.map_or("-".into(), |l| l.to_string()),
                    g.applied.map_or("-".into(), |l| l.to_string()),
                    lag_text(&g.lag),
                )),
                Err(e) => {
                    all_up = false;
                    lines.push(format!("server {} member {id} {addr}: DOWN ({e})", s.id));
                }
            }
        }
    }
    (lines, all_up)
}

fn lag_text(lag: &[(u64, u64)]) -> String {
    if lag.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = lag.iter().map(|(m, n)| format!("{m}:{n}")).collect();
    format!(" lag={}", parts.join(","))
}
