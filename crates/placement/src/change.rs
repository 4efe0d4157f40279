//! Changes of the server set: each makes a new epoch, and the objects whose home it
//! changes move while [`Migration`] lasts (an elastic cluster, CRUSH's promise that only
//! what must move moves).

use crate::{ClusterMap, MapError, MemberEntry, ServerEntry};
use serde::{Deserialize, Serialize};

/// The move of objects from the placement of epoch `from_epoch` to the current one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Migration {
    /// The epoch whose placement objects move away from.
    pub from_epoch: u64,
    /// The servers (with their weights) of that placement.
    pub before: Vec<ServerEntry>,
    /// Servers that have handed every directory object they held to its new home (the
    /// first stage; file-data chunks move once every server is past it).
    #[serde(default)]
    pub dirs_done: Vec<u32>,
    /// Servers that have also moved every file-data chunk of their files.
    #[serde(default)]
    pub done: Vec<u32>,
}

impl Migration {
    /// Every server taking part: the current ones and those objects move away from.
    pub fn servers<'a>(&'a self, map: &'a ClusterMap) -> impl Iterator<Item = u32> + 'a {
        let mut ids: Vec<u32> = map.servers.iter().chain(&self.before).map(|s| s.id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
    }

    /// Whether every server has handed over its directory objects.
    pub fn dirs_settled(&self, map: &ClusterMap) -> bool {
        self.servers(map).all(|id| self.dirs_done.contains(&id))
    }
}

/// One change an administrator asks of the map service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MapChange {
    /// A new server `id` at `address`: an unreplicated one (already running, started with
    /// `--join`), or with `members` a replica group, whose members start from the map that
    /// names them. With weight 0 nothing moves (a group joins at weight 0, then is
    /// reweighted once its members answer).
    Add {
        id: u32,
        address: String,
        weight: f64,
        metrics: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        members: Vec<MemberEntry>,
    },
    /// Replicated server `id`'s members become `members` (one joins before a replacement,
    /// the replaced one leaves after it). Placement does not change: allowed while a
    /// migration runs.
    Members { id: u32, members: Vec<MemberEntry> },
    /// Server `id` gets `weight` (0: drain it).
    Reweight { id: u32, weight: f64 },
    /// Server `id` leaves; allowed only once it is drained and holds nothing.
    Remove { id: u32 },
    /// Server `id` has handed over its directory objects for the running migration.
    DirsDone { id: u32, from_epoch: u64 },
    /// Server `id` has handed over everything it held for the running migration.
    Done { id: u32, from_epoch: u64 },
}

impl MapChange {
    /// The change as TOML text (how it crosses the wire).
    pub fn to_text(&self) -> String {
        toml::to_string(self).expect("a map change serialises")
    }

    /// A change from its TOML text.
    pub fn from_text(text: &str) -> Result<MapChange, MapError> {
        toml::from_str(text).map_err(|e| MapError::Invalid(format!("bad map change: {e}")))
    }
}

impl ClusterMap {
    /// The lowest server id never used in this cluster.
    pub fn next_server_id(&self) -> u32 {
        self.servers.iter().map(|s| s.id).chain(self.retired.iter().copied()).map(|id| id + 1).max().unwrap_or(0)
    }

    /// Whether objects are still moving to the homes of this epoch.
    pub fn migrating(&self) -> bool {
        self.migration.is_some()
    }

    /// The map after `change`, at the next epoch (or this map again for a `Done` that
    /// changes nothing). Placement changes are refused while a migration runs: an object
    /// is then always at its home of this epoch or of the one before.
    pub fn apply_change(&self, change: &MapChange) -> Result<ClusterMap, MapError> {
        let invalid = |m: String| Err(MapError::Invalid(m));
        let mut next = self.clone();
        match change {
            MapChange::DirsDone { id, from_epoch } | MapChange::Done { id, from_epoch } => {
                let final_stage = matches!(change, MapChange::Done { .. });
                let Some(m) = next.migration.as_mut() else { return Ok(next) };
                let list = if final_stage { &mut m.done } else { &mut m.dirs_done };
                if m.from_epoch != *from_epoch || list.contains(id) {
                    return Ok(next);
                }
                list.push(*id);
                list.sort_unstable();
                if final_stage && !m.dirs_done.contains(id) {
                    return Err(MapError::Invalid(format!("server {id} reports done before its directories")));
                }
                let m = next.migration.as_ref().expect("migrating");
                if m.servers(self).all(|s| m.done.contains(&s)) {
                    next.migration = None;
                }
                next.epoch += 1;
                return Ok(next);
            }
            MapChange::Members { id, members } => {
                let Some(s) = next.servers.iter_mut().find(|s| s.id == *id) else {
                    return invalid(format!("no server {id} in the cluster map"));
                };
                if s.members.is_empty() || members.is_empty() {
                    return invalid(format!(
                        "server {id}: a replicated server keeps at least one member, an unreplicated one gets none"
                    ));
                }
                s.members = members.clone();
                if !s.members.iter().any(|m| m.address == s.address) {
                    s.address = s.members[0].address.clone();
                }
                next.epoch += 1;
                next.validate()?;
                return Ok(next);
            }
            _ if self.migrating() => {
                let m = self.migration.as_ref().expect("migrating");
                return invalid(format!(
                    "objects are still moving to the homes of epoch {} (from epoch {}); wait until the migration \
                     ends (`plusfs cluster status`)",
                    self.epoch, m.from_epoch
                ));
            }
            MapChange::Add { id, address, weight, metrics, members } => {
                let id = *id;
                if self.server(id).is_some() || self.retired.contains(&id) {
                    return invalid(format!(
                        "server id {id} is or was in use (ids are never reused: inode numbers carry them); the next \
                         free one is {}",
                        self.next_server_id()
                    ));
                }
                let mut s = ServerEntry::new(id, address.clone(), *weight);
                s.metrics = metrics.clone();
                s.members = members.clone();
                if !s.members.is_empty() && !s.members.iter().any(|m| m.address == s.address) {
                    s.address = s.members[0].address.clone();
                }
                next.servers.push(s);
                if *weight == 0.0 {
                    next.epoch += 1;
                    next.validate()?;
                    // Nothing moves: a server of weight 0 is home to nothing.
                    return Ok(next);
                }
            }
            MapChange::Reweight { id, weight } => {
                let Some(s) = next.servers.iter_mut().find(|s| s.id == *id) else {
                    return invalid(format!("no server {id} in the cluster map"));
                };
                // Draining a drained server again moves what reached it since (a write of
                // a client that still had an older map).
                if s.weight == *weight && *weight != 0.0 {
                    return invalid(format!("server {id} already has weight {weight}"));
                }
                s.weight = *weight;
                if *id == next.keeper && *weight == 0.0 {
                    // The map service leaves a drained server: to the lowest that stays.
                    next.keeper = next.servers.iter().filter(|s| s.weight > 0.0).map(|s| s.id).min().unwrap_or(*id);
                }
            }
            MapChange::Remove { id } => {
                let Some(s) = self.server(*id) else { return invalid(format!("no server {id} in the cluster map")) };
                if *id == self.keeper {
                    return invalid(format!(
                        "server {id} keeps the cluster map: drain it first, which moves the map service"
                    ));
                }
                if s.weight != 0.0 {
                    return invalid(format!(
                        "server {id} has weight {}: drain it first (`plusfs cluster drain --server {id}`)",
                        s.weight
                    ));
                }
                next.servers.retain(|s| s.id != *id);
                next.retired.push(*id);
                next.epoch += 1;
                next.validate()?;
                // Nothing moves: a drained server's objects have all left it.
                return Ok(next);
            }
        }
        next.epoch += 1;
        next.validate()?;
        next.migration = Some(Migration {
            from_epoch: self.epoch,
            before: self.servers.clone(),
            dirs_done: Vec::new(),
            done: Vec::new(),
        });
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(n: u32) -> ClusterMap {
        ClusterMap::with_servers((0..n).map(|i| ServerEntry::new(i, format!("127.0.0.1:{}", 7000 + i), 1.0)).collect())
    }

    #[test]
    fn add_starts_a_migration_that_ends_when_every_server_is_done() {
        let m = map(2);
        let add =
            MapChange::Add { id: 2, address: "127.0.0.1:7002".into(), weight: 1.0, metrics: None, members: vec![] };
        let m2 = m.apply_change(&add).unwrap();
        assert_eq!(m2.epoch, 2);
        assert_eq!(m2.servers[2].id, 2);
        assert!(m2.migrating());
        // No second change while objects move.
        assert!(m2.apply_change(&MapChange::Reweight { id: 0, weight: 2.0 }).is_err());
        let mut cur = m2;
        assert!(cur.apply_change(&MapChange::Done { id: 0, from_epoch: 1 }).is_err(), "directories come first");
        for id in 0..3 {
            cur = cur.apply_change(&MapChange::DirsDone { id, from_epoch: 1 }).unwrap();
            assert_eq!(cur.migration.as_ref().unwrap().dirs_settled(&cur), id == 2);
        }
        for id in 0..3 {
            cur = cur.apply_change(&MapChange::Done { id, from_epoch: 1 }).unwrap();
        }
        assert!(!cur.migrating());
        assert_eq!(cur.epoch, 8);
        // A late or repeated report changes nothing.
        assert_eq!(cur.apply_change(&MapChange::Done { id: 1, from_epoch: 1 }).unwrap(), cur);
        // Paths that moved moved to the new server, and their previous home is known.
        let moved: Vec<String> =
            (0..1000).map(|i| format!("/d{i}")).filter(|p| m.home_of_dir(p) != cur.home_of_dir(p)).collect();
        assert!(moved.iter().all(|p| cur.home_of_dir(p) == 2));
    }

    /// Three members on loopback ports derived from `base`.
    fn members(base: u16) -> Vec<MemberEntry> {
        (0..3u16)
            .map(|m| MemberEntry {
                id: m as u64,
                address: format!("127.0.0.1:{}", 8000 + base * 10 + m),
                raft: format!("127.0.0.1:{}", 9000 + base * 10 + m),
                metrics: None,
            })
            .collect()
    }

    #[test]
    fn a_group_joins_at_weight_zero_and_its_members_change_during_a_migration() {
        let m = map(2);
        let join = MapChange::Add { id: 2, address: String::new(), weight: 0.0, metrics: None, members: members(2) };
        let joined = m.apply_change(&join).unwrap();
        assert!(!joined.migrating(), "nothing moves to a server of weight 0");
        assert_eq!(joined.epoch, m.epoch + 1);
        let g = joined.server(2).unwrap();
        assert_eq!((g.members.len(), g.address.as_str()), (3, "127.0.0.1:8020"));
        assert!((0..500).all(|i| joined.home_of_dir(&format!("/d{i}")) != 2));
        let moving = joined.apply_change(&MapChange::Reweight { id: 2, weight: 1.0 }).unwrap();
        assert!(moving.migrating());
        // A member is replaced while objects move: the map changes, placement does not.
        let mut next = members(2);
        next[0] = MemberEntry { id: 3, ..members(7)[0].clone() };
        let replaced = moving.apply_change(&MapChange::Members { id: 2, members: next }).unwrap();
        assert_eq!(replaced.migration, moving.migration);
        assert_eq!(replaced.server(2).unwrap().address, "127.0.0.1:8070", "the slot's address is a member's");
        assert!(moving.apply_change(&MapChange::Members { id: 0, members: members(3) }).is_err(), "not replicated");
        assert!(moving.apply_change(&MapChange::Members { id: 2, members: vec![] }).is_err());
    }

    #[test]
    fn draining_the_map_service_s_server_moves_the_service() {
        let m = map(3);
        assert_eq!(m.keeper, 0);
        assert!(m.apply_change(&MapChange::Remove { id: 0 }).is_err());
        let drained = m.apply_change(&MapChange::Reweight { id: 0, weight: 0.0 }).unwrap();
        assert_eq!(drained.keeper, 1, "the lowest server that keeps a weight");
        let again = ClusterMap::from_toml(&drained.to_toml()).unwrap();
        assert_eq!(again.keeper, 1);
        let mut done = drained;
        for stage in [false, true] {
            for id in 0..3 {
                let c = match stage {
                    false => MapChange::DirsDone { id, from_epoch: 1 },
                    true => MapChange::Done { id, from_epoch: 1 },
                };
                done = done.apply_change(&c).unwrap();
            }
        }
        let removed = done.apply_change(&MapChange::Remove { id: 0 }).unwrap();
        assert_eq!((removed.keeper, removed.servers.len()), (1, 2));
        // Reweighting another server leaves the service where it is.
        let m2 = map(3).apply_change(&MapChange::Reweight { id: 2, weight: 0.0 }).unwrap();
        assert_eq!(m2.keeper, 0);
    }

    #[test]
    fn changes_cross_the_wire_as_text() {
        for c in [
            MapChange::Add { id: 4, address: "h:1".into(), weight: 2.0, metrics: Some("h:2".into()), members: vec![] },
            MapChange::Add { id: 5, address: "h:1".into(), weight: 0.0, metrics: None, members: members(5) },
            MapChange::Members { id: 5, members: members(6) },
            MapChange::Reweight { id: 3, weight: 0.0 },
            MapChange::Remove { id: 3 },
            MapChange::Done { id: 1, from_epoch: 9 },
            MapChange::DirsDone { id: 1, from_epoch: 9 },
        ] {
            assert_eq!(MapChange::from_text(&c.to_text()).unwrap(), c);
        }
        let m = map(2).apply_change(&MapChange::Reweight { id: 1, weight: 0.5 }).unwrap();
        assert_eq!(ClusterMap::from_toml(&m.to_toml()).unwrap(), m);
    }

    #[test]
    fn remove_needs_a_drained_server() {
        let m = map(3);
        assert!(m.apply_change(&MapChange::Remove { id: 1 }).is_err());
        let drained = m.apply_change(&MapChange::Reweight { id: 1, weight: 0.0 }).unwrap();
        assert_eq!(drained.previous_home_of_dir("/x").is_some(), m.home_of_dir("/x") == 1);
        assert!((0..500).all(|i| drained.home_of_dir(&format!("/d{i}")) != 1));
        let mut cur = drained;
        for id in 0..3 {
            cur = cur.apply_change(&MapChange::DirsDone { id, from_epoch: 1 }).unwrap();
        }
        for id in 0..3 {
            cur = cur.apply_change(&MapChange::Done { id, from_epoch: 1 }).unwrap();
        }
        let removed = cur.apply_change(&MapChange::Remove { id: 1 }).unwrap();
        assert_eq!(removed.servers.len(), 2);
        // A removed server's id is never given again.
        let again =
            MapChange::Add { id: 1, address: "127.0.0.1:7009".into(), weight: 1.0, metrics: None, members: vec![] };
        assert!(removed.apply_change(&again).is_err());
        assert_eq!(removed.next_server_id(), 3);
        assert!(!removed.migrating());
        assert!(cur.apply_change(&MapChange::Reweight { id: 9, weight: 1.0 }).is_err());
        let all_zero = map(1).apply_change(&MapChange::Reweight { id: 0, weight: 0.0 });
        assert!(all_zero.is_err());
    }
}
