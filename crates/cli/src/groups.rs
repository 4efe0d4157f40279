//! Replica groups seen from the command line: every member of every replicated server
//! slot asked directly (not through the leader), for `cluster status` and
//! `fsck --replicas`.

use anyhow::{bail, Context, Result};
use plusfs_placement::{ClusterMap, MapChange, MemberEntry, ServerEntry, TlsSettings};
use plusfs_proto::{GroupInfo, Reply, Request, StoreDigest};
use plusfs_rpc::{Connection, Counters};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// How long a member has to answer before it counts as down.
const MEMBER_WAIT: Duration = Duration::from_secs(3);

/// Sends `req` to the member at `addr` and returns its reply (an error names the member).
pub async fn ask(tls: &TlsSettings, addr: &str, req: &Request) -> Result<Reply, String> {
    let call = async {
        let c = Connection::connect_to(addr, Arc::new(Counters::default()), tls).await.map_err(|e| e.to_string())?;
        match c.call(&plusfs_proto::Cred::server(), req).await.map_err(|e| e.to_string())? {
            Ok(r) => Ok(r),
            Err(e) => Err(e.to_string()),
        }
    };
    tokio::time::timeout(MEMBER_WAIT, call).await.unwrap_or_else(|_| Err(format!("no answer from {addr}")))
}

/// Every member of slot `s` asked `req`, its reply taken apart by `want` (`None`: an
/// unexpected reply), by member id (an error: the member is down or answered otherwise).
async fn ask_all<T>(
    (tls, s): (&TlsSettings, &ServerEntry),
    req: &Request,
    want: fn(Reply) -> Option<T>,
) -> Vec<(u64, Result<T, String>)> {
    let mut out = Vec::new();
    for m in &s.members {
        let r = ask(tls, &m.address, req).await.and_then(|reply| {
            let text = format!("unexpected answer {reply:?}");
            want(reply).ok_or(text)
        });
        out.push((m.id, r));
    }
    out
}

/// Every member's view of slot `s`'s group, by member id (an error: the member is down).
pub async fn infos(tls: &TlsSettings, s: &ServerEntry) -> Vec<(u64, Result<GroupInfo, String>)> {
    ask_all((tls, s), &Request::GroupStatus, |r| match r {
        Reply::Group(g) => Some(g),
        _ => None,
    })
    .await
}

/// Every member's store digest of slot `s`, by member id.
pub async fn digests(tls: &TlsSettings, s: &ServerEntry) -> Vec<(u64, Result<StoreDigest, String>)> {
    ask_all((tls, s), &Request::GroupDigest, |r| match r {
        Reply::Digest(d) => Some(d),
        _ => None,
    })
    .await
}

/// Lines of `cluster status` for the replicated slots of `map` (none if there are none),
/// and whether every member answered.
pub async fn status_lines(map: &ClusterMap) -> (Vec<String>, bool) {
    let mut lines = Vec::new();
    let mut all_up = true;
    for s in map.servers.iter().filter(|s| !s.members.is_empty()) {
        for (id, info) in infos(&map.tls, s).await {
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

/// What a comparison of one group's members found.
enum Agreement {
    /// Every member at the same position with the same store and file data.
    Same(StoreDigest),
    /// Members at the same position that differ.
    Diverged(String),
    /// Members at different positions (still applying), or a member that did not answer.
    Unsettled(String),
}

fn compare(digests: &[(u64, Result<StoreDigest, String>)]) -> Agreement {
    let mut ok = Vec::new();
    for (id, d) in digests {
        match d {
            Ok(d) => ok.push(*d),
            Err(e) => return Agreement::Unsettled(format!("member {id} did not answer: {e}")),
        }
    }
    let describe = |d: &StoreDigest| {
        format!(
            "member {} at {}: store {:016x} ({} keys), data {:016x} ({} records, {} bytes)",
            d.member, d.applied, d.digest, d.keys, d.data_digest, d.data_records, d.data_bytes
        )
    };
    for a in &ok {
        for b in ok.iter().filter(|b| b.applied == a.applied) {
            if (a.digest, a.data_digest) != (b.digest, b.data_digest) {
                return Agreement::Diverged(format!("{}; {}", describe(a), describe(b)));
            }
        }
    }
    if ok.iter().any(|d| d.applied != ok[0].applied) {
        let all: Vec<String> = ok.iter().map(describe).collect();
        return Agreement::Unsettled(format!("members at different positions: {}", all.join("; ")));
    }
    Agreement::Same(ok[0])
}

/// `fsck --replicas`: compares the members of every replicated slot of `map`, printing one
/// line per slot. Returns whether all agree.
pub async fn check_replicas(map: &ClusterMap) -> bool {
    let mut all_same = true;
    let groups: Vec<&ServerEntry> = map.servers.iter().filter(|s| !s.members.is_empty()).collect();
    if groups.is_empty() {
        println!("fsck --replicas: the cluster has no replica groups");
        return true;
    }
    for s in groups {
        let mut verdict = compare(&digests(&map.tls, s).await);
        for _ in 0..20 {
            if !matches!(verdict, Agreement::Unsettled(_)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            verdict = compare(&digests(&map.tls, s).await);
        }
        match verdict {
            Agreement::Same(d) => println!(
                "fsck --replicas: server {}: {} members agree at log index {} ({} keys, {} data records, {} bytes)",
                s.id,
                s.members.len(),
                d.applied,
                d.keys,
                d.data_records,
                d.data_bytes
            ),
            Agreement::Diverged(why) => {
                all_same = false;
                println!("fsck --replicas: server {}: DIVERGED: {why}", s.id);
            }
            Agreement::Unsettled(why) => {
                all_same = false;
                println!("fsck --replicas: server {}: not comparable: {why}", s.id);
            }
        }
    }
    all_same
}

/// `cluster replace`: member `old` of replicated server `group` replaced by a new member
/// at `addrs` (client, Raft); with `data`, in the local cluster there. Each step of the
/// group's member list is a change of the map service's map (the new member joins the
/// list, then the old one leaves it), so servers and clients learn it by the epoch, and a
/// migration under way goes on.
pub fn replace(
    group: u32,
    old: u64,
    addrs: (Option<String>, Option<String>),
    data: Option<PathBuf>,
    cluster: Option<PathBuf>,
) -> Result<ExitCode> {
    let file = crate::elastic::map_file(data.as_deref(), cluster.as_ref())?;
    let admin = crate::elastic::Admin::open(&file)?;
    let map = admin.current()?;
    let exe = std::env::current_exe()?;
    let mut local = match &data {
        Some(d) => Some(plusfs_localcluster::LocalCluster::prepare(&exe, d, None, &Default::default())?),
        None => None,
    };
    let (address, raft) = match (&local, addrs) {
        (_, (Some(a), Some(r))) => (a, r),
        (Some(l), (a, r)) => {
            let fresh = l.new_member(group)?;
            (a.unwrap_or(fresh.address), r.unwrap_or(fresh.raft))
        }
        (None, _) => bail!("give the new member's --address and --raft (or --data DIR for a local cluster)"),
    };
    let new = next_member(&map, group, old, address, raft)?;
    let mut members = map.server(group).expect("checked").members.clone();
    members.push(new.clone());
    let map = admin.change(&MapChange::Members { id: group, members: members.clone() })?;
    match &mut local {
        Some(l) => {
            l.reload_map()?;
            l.start_member(group, new.id)?;
            println!("started member {} of server {group} at {} (Raft {})", new.id, new.address, new.raft);
        }
        None => println!(
            "map updated (epoch {}); start the new member now: plusfs server --cluster {} --id {group} --member {} \
             --data DIR",
            map.epoch,
            file.display(),
            new.id
        ),
    }
    if let Err(e) = swap_in(&map, group, old, &new) {
        if let Some(l) = local {
            l.detach();
        }
        return Err(e);
    }
    members.retain(|m| m.id != old);
    let map = admin.change(&MapChange::Members { id: group, members })?;
    if let Some(mut l) = local {
        l.reload_map()?;
        if l.stop_member_by_pid(group, old, Duration::from_secs(10))? {
            println!("stopped member {old}");
        }
        println!(
            "member {old} of server {group} replaced by member {} (epoch {}); its data in {} is no longer used",
            new.id,
            map.epoch,
            l.data().join(plusfs_localcluster::proc_name(group, Some(old))).display()
        );
        l.detach();
    } else {
        println!("member {old} of server {group} replaced by member {} (epoch {})", new.id, map.epoch);
    }
    Ok(ExitCode::SUCCESS)
}

/// The new member's entry (the next id of the group), after checking `old` is a member.
fn next_member(map: &ClusterMap, group: u32, old: u64, address: String, raft: String) -> Result<MemberEntry> {
    let s = map.server(group).with_context(|| format!("no server {group} in the map"))?;
    if s.members.is_empty() {
        bail!("server {group} is not replicated: it has no members to replace");
    }
    s.member(old).with_context(|| format!("server {group} has no member {old}"))?;
    let id = s.members.iter().map(|m| m.id).max().unwrap_or(0) + 1;
    Ok(MemberEntry { id, address, raft, metrics: None })
}

/// Asks `group`'s leader to replace `old` by `new` (waiting while `new` catches up).
fn swap_in(map: &ClusterMap, group: u32, old: u64, new: &MemberEntry) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let client = {
        let _g = rt.enter();
        plusfs_client::Client::new(map.clone(), plusfs_client::ClientOptions::default())
    };
    println!("member {} catching up and joining the voters ...", new.id);
    let req = Request::GroupReplace { remove: old, add: new.id, raft: new.raft.clone(), client: new.address.clone() };
    rt.block_on(client.call_server(group, &req)).map_err(|e| anyhow::anyhow!("replacing member {old}: {e}"))?;
    Ok(())
}
