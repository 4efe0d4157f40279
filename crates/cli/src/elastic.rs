//! `plusfs cluster add | drain | reweight | remove`: changing the server set of a running
//! cluster through its map service (the map's keeper), and following the migration that
//! moves objects to their new homes.

use anyhow::{bail, Context, Result};
use plusfs_client::{Client, ClientOptions};
use plusfs_placement::{ClusterMap, MapChange};
use plusfs_proto::{Reply, Request, ServerStatus};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The cluster map file: `DIR/cluster.toml` of a local cluster, else `--cluster`.
pub fn map_file(data: Option<&Path>, cluster: Option<&PathBuf>) -> Result<PathBuf> {
    match data {
        Some(d) => Ok(plusfs_localcluster::map_path(d)),
        None => cluster.cloned().context("pass --data DIR (a local cluster) or --cluster FILE"),
    }
}

/// An admin connection to the cluster whose map file is `file`.
pub struct Admin {
    rt: tokio::runtime::Runtime,
    client: Client,
    file: PathBuf,
    local_tls: plusfs_placement::TlsSettings,
}

impl Admin {
    /// Connects with the map in `file`.
    pub fn open(file: &Path) -> Result<Admin> {
        let map = ClusterMap::load(file)?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let client = {
            let _g = rt.enter();
            Client::new(map.clone(), ClientOptions { retries: 2, ..Default::default() })
        };
        Ok(Admin { rt, client, file: file.to_path_buf(), local_tls: map.tls })
    }

    /// The map the map service holds now; the file is brought up to date with it. The
    /// keeper the file names is asked (then, if the service moved, the one its answer
    /// names), or any server if it does not answer.
    pub fn current(&self) -> Result<ClusterMap> {
        let file = ClusterMap::load(&self.file)?;
        let mut asked = Vec::new();
        let mut next = Some(file.keeper);
        let mut newest: Option<ClusterMap> = None;
        let mut failure = None;
        while let Some(id) = next.take() {
            asked.push(id);
            match self.rt.block_on(self.client.call_server(id, &Request::MapGet)) {
                Ok(reply) => {
                    let map = self.adopt(reply)?;
                    if map.keeper == id {
                        return Ok(map);
                    }
                    next = (!asked.contains(&map.keeper)).then_some(map.keeper);
                    if newest.as_ref().is_none_or(|n| n.epoch < map.epoch) {
                        newest = Some(map);
                    }
                }
                Err(e) => {
                    failure = Some(e);
                    next = file.servers.iter().map(|s| s.id).find(|id| !asked.contains(id));
                }
            }
        }
        match (newest, failure) {
            (Some(map), _) => Ok(map),
            (None, Some(e)) => Err(e.into()),
            (None, None) => bail!("no server of the map answered"),
        }
    }

    /// Asks the map service for `change`; answers (and writes to the file) the new map.
    pub fn change(&self, change: &MapChange) -> Result<ClusterMap> {
        let keeper = self.current()?.keeper;
        let req = Request::MapChange { change: change.to_text() };
        let reply = self.rt.block_on(self.client.call_server(keeper, &req))?;
        self.adopt(reply)
    }

    fn adopt(&self, reply: Reply) -> Result<ClusterMap> {
        let Reply::Map(text) = reply else { bail!("the map service answered {reply:?}") };
        let mut map = ClusterMap::from_toml(&text)?;
        map.tls = self.local_tls.clone();
        let on_file = ClusterMap::load(&self.file).map(|m| m.epoch).unwrap_or(0);
        if map.epoch > on_file {
            plusfs_netns::write_durably(&self.file, map.to_toml().as_bytes())?;
        }
        Ok(map)
    }

    /// The id of the server answering at `address` (a ping through a map naming it).
    pub fn probe(&self, address: &str) -> Result<u32> {
        const PROBE: u32 = u16::MAX as u32 - 1;
        let mut map = ClusterMap::load(&self.file)?;
        map.servers.push(plusfs_placement::ServerEntry::new(PROBE, address.to_string(), 0.0));
        let client = {
            let _g = self.rt.enter();
            Client::new(map, ClientOptions { retries: 0, ..Default::default() })
        };
        match self.rt.block_on(client.call_server(PROBE, &Request::Ping))? {
            Reply::Pong { server, .. } => Ok(server),
            other => bail!("{address} answered a ping with {other:?}"),
        }
    }

    /// Waits until server `id` of the map answers a ping (a replica group: once it has a
    /// leader), telling every 30 s that it still waits.
    pub fn wait_server(&self, id: u32, limit: Duration) -> Result<()> {
        let started = Instant::now();
        let mut told = Instant::now();
        loop {
            let ping = async {
                tokio::time::timeout(Duration::from_secs(2), self.client.call_server(id, &Request::Ping)).await
            };
            match self.rt.block_on(ping) {
                Ok(Ok(Reply::Pong { .. })) => return Ok(()),
                Ok(Ok(other)) => bail!("server {id} answered a ping with {other:?}"),
                Ok(Err(e)) if started.elapsed() > limit => {
                    bail!("server {id} did not answer within {limit:?} ({e}); it stays in the map at weight 0")
                }
                _ if started.elapsed() > limit => {
                    bail!("server {id} did not answer within {limit:?}; it stays in the map at weight 0")
                }
                _ => {}
            }
            if told.elapsed() > Duration::from_secs(30) {
                println!("waiting for server {id} to answer ({:.0} s) ...", started.elapsed().as_secs_f64());
                told = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until a server answers at `address`.
    pub fn wait_answering(&self, address: &str, limit: Duration) -> Result<u32> {
        let started = Instant::now();
        loop {
            match self.probe(address) {
                Ok(id) => return Ok(id),
                Err(e) if started.elapsed() > limit => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// The status of every server of `map` (and of the servers a migration moves objects
    /// away from), in id order; errors for servers that do not answer.
    pub fn statuses(&self, map: &ClusterMap) -> Vec<(u32, Result<ServerStatus, String>)> {
        let mut ids: Vec<u32> = map.servers.iter().map(|s| s.id).collect();
        if let Some(m) = &map.migration {
            ids.extend(m.before.iter().map(|s| s.id));
        }
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .map(|id| (id, self.rt.block_on(self.client.server_status(id)).map_err(|e| e.to_string())))
            .collect()
    }
}

/// Where a new server comes from (`cluster add`'s options).
pub struct Joining {
    /// An unreplicated server already started with `--join` there.
    pub address: Option<String>,
    /// A replica group's members elsewhere: `CLIENT/RAFT` addresses.
    pub members: Vec<String>,
    /// Members of a new local replica group.
    pub replicas: Option<usize>,
}

/// `cluster add`: a new server. With --data (a local cluster) it is started here on a free
/// loopback port with the next free id; with --address it must already run there,
/// started with `plusfs server --join`. Either way it answers before the map names it,
/// so no request meets a server that is not there yet. A replicated cluster gets a new
/// replica group (see [`add_group`]).
pub fn add(how: Joining, weight: f64, data: Option<&Path>, cluster: Option<&PathBuf>, wait: bool) -> Result<ExitCode> {
    if !(weight > 0.0 && weight.is_finite()) {
        bail!("--weight must be a finite number above 0 (a server of weight 0 would hold nothing)");
    }
    let file = map_file(data, cluster)?;
    let admin = Admin::open(&file)?;
    let before = admin.current()?;
    if before.servers.iter().any(|s| !s.members.is_empty()) || !how.members.is_empty() {
        return add_group(admin, &before, how, weight, data, wait);
    }
    let (id, address) = match (how.address, data) {
        (Some(a), _) => (
            admin
                .probe(&a)
                .with_context(|| format!("no server answers at {a}: start it with `plusfs server --join`"))?,
            a,
        ),
        (None, Some(d)) => {
            refuse_private_network(d)?;
            let id = before.next_server_id();
            let address = format!("127.0.0.1:{}", plusfs_localcluster::free_ports(1)?[0]);
            plusfs_localcluster::spawn_joining(&std::env::current_exe()?, d, id, &address)?;
            admin.wait_answering(&address, Duration::from_secs(30)).with_context(|| {
                format!(
                    "the new server did not start; see {}",
                    d.join(format!("{}.log", plusfs_localcluster::proc_name(id, None))).display()
                )
            })?;
            (id, address)
        }
        (None, None) => bail!("pass --address HOST:PORT (a server started with `plusfs server --join`), or --data DIR"),
    };
    let change = MapChange::Add { id, address: address.clone(), weight, metrics: None, members: Vec::new() };
    let map = admin.change(&change)?;
    println!("server {id} added at {address} with weight {weight} (epoch {})", map.epoch);
    finish(&admin, wait)
}

fn refuse_private_network(d: &Path) -> Result<()> {
    if plusfs_netns::Net::load(d)?.is_some() {
        bail!("{} holds a cluster on a private network: adding servers to it is not supported", d.display());
    }
    Ok(())
}

/// How long a new replica group may take to elect a leader: members started here, or by
/// an operator on other machines.
const LOCAL_GROUP_WAIT: Duration = Duration::from_secs(60);
const REMOTE_GROUP_WAIT: Duration = Duration::from_secs(1800);

/// `cluster add` of a replica group: it joins the map at weight 0 (nothing moves to it),
/// its members start from that map (here, for a local cluster; else the operator starts
/// them), and once its group has a leader that answers it gets `weight` and objects move.
fn add_group(
    admin: Admin,
    before: &ClusterMap,
    how: Joining,
    weight: f64,
    data: Option<&Path>,
    wait: bool,
) -> Result<ExitCode> {
    if how.address.is_some() {
        bail!(
            "the cluster's servers are replica groups: give the new group's --members CLIENT/RAFT,... (or --data DIR \
             for a local cluster)"
        );
    }
    let id = before.next_server_id();
    let exe = std::env::current_exe()?;
    let local = match (how.members.is_empty(), data) {
        (true, Some(d)) => {
            refuse_private_network(d)?;
            Some(plusfs_localcluster::LocalCluster::prepare(&exe, d, None, &Default::default())?)
        }
        (true, None) => bail!("pass --members CLIENT/RAFT,... (the new group's members), or --data DIR"),
        (false, _) => None,
    };
    let members = match &local {
        Some(l) => {
            let usual = before.servers.iter().map(|s| s.members.len()).max().unwrap_or(1).max(1);
            let replicas = how.replicas.unwrap_or(usual);
            if !(1..=7).contains(&replicas) {
                bail!("--replicas must be between 1 and 7");
            }
            l.new_group_members(replicas)?
        }
        None => parse_members(&how.members)?,
    };
    let address = members[0].address.clone();
    let change = MapChange::Add { id, address, weight: 0.0, metrics: None, members: members.clone() };
    let joined = admin.change(&change)?;
    println!("server {id} joins as a replica group of {} members at weight 0 (epoch {})", members.len(), joined.epoch);
    let limit = match local {
        Some(mut l) => {
            l.reload_map()?;
            l.start_new_group(id)?;
            l.detach();
            LOCAL_GROUP_WAIT
        }
        None => {
            println!("start each member on its machine with this map ({}):", admin.file.display());
            for m in &members {
                let bootstrap = if m.id == 0 { " --bootstrap" } else { "" };
                println!(
                    "  plusfs server --cluster MAP --id {id} --member {} --data DIR{bootstrap}   # at {}",
                    m.id, m.address
                );
            }
            REMOTE_GROUP_WAIT
        }
    };
    // A client of the map that names the group.
    let admin = Admin::open(&admin.file)?;
    admin.wait_server(id, limit)?;
    println!("server {id} answers: its group has a leader");
    let map = admin.change(&MapChange::Reweight { id, weight })?;
    println!("server {id} has weight {weight} (epoch {}): objects move to it", map.epoch);
    finish(&admin, wait)
}

/// `CLIENT/RAFT` address pairs as members 0, 1, ….
fn parse_members(specs: &[String]) -> Result<Vec<plusfs_placement::MemberEntry>> {
    if !(1..=7).contains(&specs.len()) {
        bail!("a replica group has 1 to 7 members, not {}", specs.len());
    }
    specs
        .iter()
        .zip(0u64..)
        .map(|(spec, id)| {
            let (address, raft) = spec.split_once('/').with_context(|| {
                format!("member '{spec}': give CLIENT_ADDR/RAFT_ADDR, e.g. 10.0.0.4:7003/10.0.0.4:7103")
            })?;
            for a in [address, raft] {
                if a.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).is_none() {
                    bail!("member '{spec}': '{a}' is not HOST:PORT");
                }
            }
            Ok(plusfs_placement::MemberEntry { id, address: address.into(), raft: raft.into(), metrics: None })
        })
        .collect()
}

/// `cluster reweight` (and `drain`: weight 0).
pub fn reweight(
    server: u32,
    weight: f64,
    data: Option<&Path>,
    cluster: Option<&PathBuf>,
    wait: bool,
) -> Result<ExitCode> {
    let admin = Admin::open(&map_file(data, cluster)?)?;
    let map = admin.change(&MapChange::Reweight { id: server, weight })?;
    match weight {
        0.0 => println!("server {server} is draining (epoch {}): its objects move to other servers", map.epoch),
        w => println!("server {server} has weight {w} (epoch {})", map.epoch),
    }
    finish(&admin, wait)
}

/// `cluster remove`: a drained server leaves the map (a local one's processes, every
/// member of a replica group, are stopped).
pub fn remove(server: u32, data: Option<&Path>, cluster: Option<&PathBuf>) -> Result<ExitCode> {
    let admin = Admin::open(&map_file(data, cluster)?)?;
    let slot = admin.current()?.server(server).cloned();
    let map = admin.change(&MapChange::Remove { id: server })?;
    println!("server {server} removed (epoch {})", map.epoch);
    if let (Some(d), Some(slot)) = (data, slot) {
        match plusfs_localcluster::stop_slot(d, &slot, Duration::from_secs(10))? {
            0 => {}
            1 => println!("server {server} stopped"),
            n => println!("server {server} stopped ({n} members)"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn finish(admin: &Admin, wait: bool) -> Result<ExitCode> {
    if !wait {
        println!("objects move in the background: `plusfs cluster status` shows the progress");
        return Ok(ExitCode::SUCCESS);
    }
    follow(admin, Duration::from_secs(3600))
}

/// Totals of a migration over every server's report.
#[derive(Default)]
struct Totals {
    moved: u64,
    left: u64,
    bytes: u64,
    down: usize,
}

fn totals(statuses: &[(u32, Result<ServerStatus, String>)]) -> Totals {
    let mut t = Totals::default();
    for (_, st) in statuses {
        match st {
            Ok(s) => {
                if let Some(m) = &s.migration {
                    t.moved += m.objects_moved;
                    t.left += m.objects_left;
                    t.bytes += m.bytes_moved;
                }
            }
            Err(_) => t.down += 1,
        }
    }
    t
}

/// Waits until the migration ends, drawing a progress bar (objects moved and left, rate,
/// ETA); gives up after `limit`.
pub fn follow(admin: &Admin, limit: Duration) -> Result<ExitCode> {
    let started = Instant::now();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut last_line = Instant::now() - Duration::from_secs(10);
    let mut last = Totals::default();
    loop {
        let map = admin.current()?;
        if !map.migrating() {
            let secs = started.elapsed().as_secs_f64();
            if tty {
                println!();
            }
            println!(
                "balanced at epoch {} after {secs:.1} s ({} directory objects and {:.1} MiB of file data moved while \
                 watched)",
                map.epoch,
                last.moved,
                last.bytes as f64 / (1 << 20) as f64
            );
            return Ok(ExitCode::SUCCESS);
        }
        let t = totals(&admin.statuses(&map));
        let line = progress_line(&t, started.elapsed());
        if tty {
            print!("\r{line}");
            std::io::stdout().flush().ok();
        } else if last_line.elapsed() >= Duration::from_secs(2) {
            println!("{line}");
            last_line = Instant::now();
        }
        last = t;
        if started.elapsed() > limit {
            println!();
            bail!("the migration did not end within {limit:?}; it goes on in the background");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn progress_line(t: &Totals, elapsed: Duration) -> String {
    let total = (t.moved + t.left).max(1);
    let frac = t.moved as f64 / total as f64;
    let width = 30;
    let filled = ((frac * width as f64) as usize).min(width);
    let rate = t.moved as f64 / elapsed.as_secs_f64().max(0.001);
    let eta = if rate > 0.0 { format!("{:.0} s", t.left as f64 / rate) } else { "?".into() };
    let down = if t.down > 0 { format!(", {} servers not answering", t.down) } else { String::new() };
    format!(
        "[{}{}] {:>3.0}% {} moved, {} left, {:.1} MiB data, {:.0} objects/s, ETA {eta}{down}   ",
        "#".repeat(filled),
        ".".repeat(width - filled),
        frac * 100.0,
        t.moved,
        t.left,
        t.bytes as f64 / (1 << 20) as f64,
        rate
    )
}

/// `cluster status`'s first line: the epoch, and the migration under way if any.
pub fn epoch_line(map: &ClusterMap) -> String {
    match &map.migration {
        None => format!("epoch {}: every object is at its home (next server id {})", map.epoch, map.next_server_id()),
        Some(m) => {
            let waiting: Vec<String> = map
                .servers
                .iter()
                .chain(&m.before)
                .map(|s| s.id)
                .filter(|id| !m.done.contains(id))
                .map(|id| id.to_string())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            format!(
                "epoch {}: objects are moving from the placement of epoch {} (servers still moving: {})",
                map.epoch,
                m.from_epoch,
                waiting.join(" ")
            )
        }
    }
}

/// One server's weight, fill and migration progress for `cluster status`.
pub fn placement_line(s: &plusfs_placement::ServerEntry, st: &ServerStatus) -> String {
    let mut line = format!(
        "server {} placement: weight {} epoch {} dir objects {} data {:.1} MiB forwarded {}",
        s.id,
        s.weight,
        st.epoch,
        st.dir_objects,
        st.data_bytes as f64 / (1 << 20) as f64,
        st.forwarded
    );
    if let Some(m) = &st.migration {
        let secs = m.millis as f64 / 1000.0;
        let rate = if secs > 0.0 { m.objects_moved as f64 / secs } else { 0.0 };
        let eta = if rate > 0.0 { format!("{:.0} s", m.objects_left as f64 / rate) } else { "-".into() };
        line += &format!(
            "; migrating: moved {} objects ({:.1} MiB data), took {} objects ({} entries), left {} objects \
             ({:.1} MiB), {rate:.0} objects/s, ETA {eta}",
            m.objects_moved,
            m.bytes_moved as f64 / (1 << 20) as f64,
            m.objects_taken,
            m.entries_taken,
            m.objects_left,
            m.bytes_left as f64 / (1 << 20) as f64
        );
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_line_shows_fraction_and_eta() {
        let t = Totals { moved: 50, left: 50, bytes: 1 << 20, down: 0 };
        let l = progress_line(&t, Duration::from_secs(5));
        assert!(l.contains(" 50%"), "{l}");
        assert!(l.contains("10 objects/s"), "{l}");
        assert!(l.contains("ETA 5 s"), "{l}");
        assert!(l.contains("1.0 MiB"), "{l}");
    }
}
