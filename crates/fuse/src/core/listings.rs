//! Open directory handles: each keeps a window of its listing (read from the servers a page
//! at a time, in name order) and the attributes `readdirplus` fetched for part of it.
//!
//! Programs that read a large directory and then work through its entries (`rm -rf`,
//! `find -delete`, `shutil.rmtree`) look each entry up after the handle has moved past it
//! or been closed, in listing order or sorted by inode number (coreutils' `fts` sorts
//! directories of more than 10,000 entries so). The last [`RECENT`] entries listed of a
//! few directories are remembered, so that once lookups follow one of those orders the
//! attributes of the entries that come next are fetched in one batch ([`Ahead`]).

use super::types::Caller;
use plusfs_proto::{Attr, DirEntry};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The part of a directory listing an open handle holds: entries `base..base +
/// entries.len()` of the listing. Memory per handle is one page whatever the size of the
/// directory.
#[derive(Clone)]
pub(crate) struct Listing {
    /// The directory's path.
    pub dir: String,
    /// Who opened it (pages are read, and `readdirplus` looks at the entries, as them).
    pub caller: Caller,
    /// Index in the listing of the window's first entry.
    pub base: usize,
    /// The window.
    pub entries: Arc<Vec<DirEntry>>,
    /// The name the next page starts after (`None`: the listing ends with the window).
    pub next: Option<String>,
}

impl Listing {
    /// Index just past the window.
    pub fn end(&self) -> usize {
        self.base + self.entries.len()
    }
}

/// Attributes `readdirplus` fetched for entries `start..start + attrs.len()` of a listing
/// (`None`: removed since they were listed), and the directory's own.
#[derive(Clone)]
pub(crate) struct PlusPage {
    pub start: usize,
    pub attrs: Arc<Vec<Option<Attr>>>,
    pub dir_attr: Attr,
    /// When they were fetched.
    pub fetched: Instant,
}

/// An entry of an open listing that a lookup asks about (`Listings::find`).
pub(crate) struct Listed {
    pub fh: u64,
    pub listing: Listing,
    /// The entry's index in the listing.
    pub index: usize,
    /// Its attributes if fetched within the TTL (`Some(None)`: gone when they were).
    pub attr: Option<Option<Attr>>,
}

/// Most entries of directory listings remembered once read (about 6 MB).
const RECENT: usize = 131_072;
/// Directories whose recent listing is remembered.
const RECENT_DIRS: usize = 64;
/// Batches of looked-ahead attributes kept.
const AHEAD_PAGES: usize = 4;

/// The order lookups in a directory follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    Name,
    Ino,
}

/// The last entries listed of a directory, in name order.
struct Recent {
    dir: String,
    entries: Vec<DirEntry>,
    /// Indexes into `entries` by inode number (built when first needed).
    by_ino: Option<Vec<u32>>,
    /// The last lookup not answered from a batch: (name, inode number), and the order
    /// it followed the one before in.
    last: Option<(String, u64)>,
    streak: Option<Order>,
}

/// Attributes fetched ahead of the lookups of a program working through a directory.
struct Ahead {
    dir: String,
    caller: Caller,
    /// Names (sorted) and attributes (`None`: no such entry when fetched).
    names: Vec<String>,
    attrs: Vec<Option<Attr>>,
    fetched: Instant,
    removed: std::collections::HashSet<String>,
}

struct Open {
    listing: Listing,
    page: Option<PlusPage>,
    /// Names removed through this mount since `page` was fetched (its attributes for
    /// them are no longer true).
    removed: std::collections::HashSet<String>,
}

/// The open directory handles.
#[derive(Default)]
pub(crate) struct Listings {
    open: Mutex<HashMap<u64, Open>>,
    recent: Mutex<Vec<Recent>>,
    ahead: Mutex<Vec<Ahead>>,
    /// Counts the changes made through this mount that make fetched attributes stale, per
    /// directory (hashed into [`CHANGE_SLOTS`] counters) and for renames, which may touch
    /// any directory below: a batch fetched while one happened in its directory is not
    /// kept.
    changes: [std::sync::atomic::AtomicU64; CHANGE_SLOTS],
    moves: std::sync::atomic::AtomicU64,
}

/// Counters of changes by directory (a change in one directory seldom discards a batch
/// of another).
const CHANGE_SLOTS: usize = 32;

fn slot(dir: &str) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut h);
    (h.finish() % CHANGE_SLOTS as u64) as usize
}

impl Listings {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Open>> {
        self.open.lock().expect("listings")
    }

    /// Keeps `listing` under handle `fh` (a new handle, or the next window of one: the
    /// attributes fetched for the window before are dropped).
    pub fn insert(&self, fh: u64, listing: Listing) {
        self.lock().insert(fh, Open { listing, page: None, removed: Default::default() });
    }

    /// Replaces the window of open handle `fh` (nothing if it was closed meanwhile).
    pub fn set_window(&self, fh: u64, listing: Listing) {
        if let Some(o) = self.lock().get_mut(&fh) {
            *o = Open { listing, page: None, removed: Default::default() };
        }
    }

    /// The listing of `fh` (shared, not copied).
    pub fn get(&self, fh: u64) -> Option<Listing> {
        self.lock().get(&fh).map(|o| o.listing.clone())
    }

    /// The attributes fetched for `fh`, if they cover entry `index`.
    pub fn page(&self, fh: u64, index: usize) -> Option<PlusPage> {
        let open = self.lock();
        let page = open.get(&fh)?.page.as_ref()?;
        (index >= page.start && index < page.start + page.attrs.len().max(1)).then(|| page.clone())
    }

    /// Keeps the attributes fetched for `fh` from its window `window` (not if the handle
    /// has moved to another window meanwhile: they would name other entries).
    /// Nor if something changed in its directory through this mount since
    /// [`Listings::changes`] said `since` (before the fetch).
    pub fn set_page(&self, fh: u64, window: &Arc<Vec<DirEntry>>, page: PlusPage, since: u64) {
        let mut open = self.lock();
        let Some(o) = open.get_mut(&fh).filter(|o| Arc::ptr_eq(&o.listing.entries, window)) else { return };
        if self.changes(&o.listing.dir) == since {
            o.page = Some(page);
            o.removed.clear();
        }
    }

    /// The entry `name` of directory `dir` in the window of a handle `caller` opened (a
    /// program listing a directory and looking each entry up, as `ls -l` does), with the
    /// attributes fetched for it within `ttl`, if any.
    pub fn find(&self, dir: &str, caller: &Caller, name: &str, ttl: Duration) -> Option<Listed> {
        let open = self.lock();
        for (fh, o) in open.iter() {
            let l = &o.listing;
            if l.dir != dir || l.caller != *caller {
                continue;
            }
            let Ok(k) = l.entries.binary_search_by(|e| e.name.as_str().cmp(name)) else { continue };
            let index = l.base + k;
            let attr = o.page.as_ref().filter(|p| p.fetched.elapsed() < ttl).and_then(|p| {
                let gone = o.removed.contains(name);
                (index >= p.start && index < p.start + p.attrs.len())
                    .then(|| p.attrs[index - p.start].clone().filter(|_| !gone))
            });
            return Some(Listed { fh: *fh, listing: l.clone(), index, attr });
        }
        None
    }

    /// Directory `dir` changed through this mount: the attributes fetched for its open
    /// listings may be stale (the listings themselves stay, as a snapshot would).
    pub fn drop_pages(&self, dir: &str) {
        self.changed(dir);
        for o in self.lock().values_mut().filter(|o| o.listing.dir == dir) {
            o.page = None;
        }
        self.ahead.lock().expect("ahead").retain(|a| a.dir != dir);
    }

    /// The entry at `path` was renamed or exchanged through this mount: what was fetched
    /// for its directory, and for listings at or below it (a directory moved), is stale.
    pub fn path_changed(&self, path: &str) {
        self.moves.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let parent = plusfs_proto::path::split(path).map(|(d, _)| d);
        for o in self.lock().values_mut() {
            let d = o.listing.dir.as_str();
            if Some(d) == parent || plusfs_proto::path::is_within(d, path) {
                o.page = None;
            }
        }
        let stale = |d: &str| Some(d) == parent || plusfs_proto::path::is_within(d, path);
        self.ahead.lock().expect("ahead").retain(|a| !stale(&a.dir));
    }

    /// Entry `name` of `dir` was removed through this mount: the attributes fetched for it
    /// no longer hold (the others do).
    pub fn entry_removed(&self, dir: &str, name: &str) {
        self.changed(dir);
        for o in self.lock().values_mut().filter(|o| o.listing.dir == dir && o.page.is_some()) {
            o.removed.insert(name.to_string());
        }
        for a in self.ahead.lock().expect("ahead").iter_mut().filter(|a| a.dir == dir) {
            a.removed.insert(name.to_string());
        }
    }

    fn changed(&self, dir: &str) {
        self.changes[slot(dir)].fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Where the count of changes through this mount that concern `dir` stands (see
    /// [`Listings::set_ahead`]).
    pub fn changes(&self, dir: &str) -> u64 {
        let ord = std::sync::atomic::Ordering::Acquire;
        self.changes[slot(dir)].load(ord).wrapping_add(self.moves.load(ord))
    }

    /// Drops the listing of `fh`.
    pub fn remove(&self, fh: u64) {
        self.lock().remove(&fh);
    }

    /// A handle read `window` of `dir`'s listing (`first`: from its start): remembered
    /// after the entries listed before it, the oldest dropped past [`RECENT`].
    pub fn listed(&self, dir: &str, window: &[DirEntry], first: bool) {
        let mut recent = self.recent.lock().expect("recent listings");
        let mut r = match recent.iter().position(|r| r.dir == dir) {
            Some(k) => recent.remove(k),
            None => Recent { dir: dir.to_string(), entries: Vec::new(), by_ino: None, last: None, streak: None },
        };
        let follows = r.entries.last().zip(window.first()).is_some_and(|(a, b)| a.name < b.name);
        if first || !follows {
            r.entries.clear();
        }
        r.entries.extend_from_slice(window);
        if r.entries.len() > RECENT {
            let cut = r.entries.len() - RECENT;
            r.entries.drain(..cut);
        }
        r.by_ino = None;
        // The directories listed longest ago go first (a program removing a tree lists
        // each subdirectory while it works through the directory above).
        let mut total = r.entries.len() + recent.iter().map(|r| r.entries.len()).sum::<usize>();
        while !recent.is_empty() && (total > RECENT || recent.len() >= RECENT_DIRS) {
            total -= recent.remove(0).entries.len();
        }
        recent.push(r);
    }

    /// A lookup of `name` in `dir` that nothing here answered: when `dir` was listed
    /// lately and this lookup follows the two before in name or inode order, the entries
    /// (`name` and up to `count - 1` after it in that order) whose attributes to fetch at
    /// once, in name order.
    pub fn ahead_of(&self, dir: &str, name: &str, count: usize) -> Option<Vec<String>> {
        let mut recent = self.recent.lock().expect("recent listings");
        let r = recent.iter_mut().find(|r| r.dir == dir)?;
        let at = r.entries.binary_search_by(|e| e.name.as_str().cmp(name)).ok()?;
        let ino = r.entries[at].ino;
        let order = match r.last.replace((name.to_string(), ino)) {
            Some((_, last_ino)) if last_ino < ino => Some(Order::Ino),
            Some((last, _)) if last.as_str() < name => Some(Order::Name),
            _ => None,
        };
        let order = match std::mem::replace(&mut r.streak, order) {
            before if before == order => order?,
            _ => return None,
        };
        let mut names: Vec<String> = match order {
            Order::Name => r.entries[at..].iter().take(count).map(|e| e.name.clone()).collect(),
            Order::Ino => {
                let entries = &r.entries;
                let by_ino = r.by_ino.get_or_insert_with(|| {
                    let mut v: Vec<u32> = (0..entries.len() as u32).collect();
                    v.sort_unstable_by_key(|i| entries[*i as usize].ino);
                    v
                });
                let from = by_ino.partition_point(|i| entries[*i as usize].ino < ino);
                by_ino[from..].iter().take(count).map(|i| entries[*i as usize].name.clone()).collect()
            }
        };
        names.sort_unstable();
        Some(names)
    }

    /// Keeps the attributes fetched for `names` (sorted) of `dir` as `caller`, unless
    /// something changed through this mount since [`Listings::changes`] said `since`
    /// (before the fetch). Whether they were kept.
    pub fn set_ahead(
        &self,
        dir: &str,
        caller: &Caller,
        names: Vec<String>,
        attrs: Vec<Option<Attr>>,
        since: u64,
    ) -> bool {
        let mut ahead = self.ahead.lock().expect("ahead");
        if self.changes(dir) != since {
            return false;
        }
        ahead.retain(|a| a.dir != dir || a.caller != *caller);
        if ahead.len() >= AHEAD_PAGES {
            ahead.remove(0);
        }
        let (dir, caller, fetched) = (dir.to_string(), caller.clone(), Instant::now());
        ahead.push(Ahead { dir, caller, names, attrs, fetched, removed: Default::default() });
        true
    }

    /// The attributes of `name` in `dir` fetched ahead for `caller` within `ttl`.
    pub fn find_ahead(&self, dir: &str, caller: &Caller, name: &str, ttl: Duration) -> Option<Attr> {
        let ahead = self.ahead.lock().expect("ahead");
        let a = ahead.iter().find(|a| a.dir == dir && a.caller == *caller && a.fetched.elapsed() < ttl)?;
        let k = a.names.binary_search_by(|n| n.as_str().cmp(name)).ok()?;
        a.attrs[k].clone().filter(|_| !a.removed.contains(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plusfs_proto::FileKind;

    /// Entries `e00000`... in name order; inode numbers in the reverse order.
    fn window(from: usize, n: usize) -> Vec<DirEntry> {
        (from..from + n)
            .map(|i| DirEntry { name: format!("e{i:05}"), ino: 1_000_000 - i as u64, kind: FileKind::File })
            .collect()
    }

    #[test]
    fn lookups_in_listing_order_fetch_the_entries_that_follow() {
        let l = Listings::default();
        l.listed("/d", &window(0, 100), true);
        l.listed("/d", &window(100, 100), false);
        assert_eq!(l.ahead_of("/d", "e00010", 8), None, "no order yet");
        assert_eq!(l.ahead_of("/d", "e00011", 8), None, "one step is no order");
        let names = l.ahead_of("/d", "e00012", 8).unwrap();
        assert_eq!(names, (12..20).map(|i| format!("e{i:05}")).collect::<Vec<_>>());
        assert_eq!(l.ahead_of("/d", "nothing", 8), None, "not listed");
        assert_eq!(l.ahead_of("/e", "e00013", 8), None, "another directory");
    }

    #[test]
    fn lookups_in_inode_order_fetch_the_next_inodes() {
        let l = Listings::default();
        l.listed("/d", &window(0, 200), true);
        // Inode numbers fall as names rise: `fts` sorted by inode works from the end.
        for name in ["e00199", "e00198"] {
            assert_eq!(l.ahead_of("/d", name, 4), None);
        }
        let names = l.ahead_of("/d", "e00197", 4).unwrap();
        assert_eq!(names, ["e00194", "e00195", "e00196", "e00197"]);
    }

    #[test]
    fn random_lookups_fetch_nothing_ahead_and_changes_drop_what_was() {
        let l = Listings::default();
        l.listed("/d", &window(0, 200), true);
        for name in ["e00050", "e00020", "e00150", "e00010", "e00100"] {
            assert_eq!(l.ahead_of("/d", name, 4), None, "{name}");
        }
        let a = |i: u64| Some(plusfs_proto::Attr::of_dir(&plusfs_proto::DirObject::new(i, 0o755, 0, 0)));
        let caller = Caller::ROOT;
        let since = l.changes("/d");
        l.entry_removed("/d", "x");
        assert!(!l.set_ahead("/d", &caller, vec!["a".into()], vec![a(1)], since), "a change came meanwhile");
        let since = l.changes("/d");
        l.path_changed("/elsewhere/x");
        assert!(!l.set_ahead("/d", &caller, vec!["a".into()], vec![a(1)], since), "a rename came meanwhile");
        assert!(l.set_ahead("/d", &caller, vec!["a".into(), "b".into()], vec![a(1), a(2)], l.changes("/d")));
        let ttl = Duration::from_secs(1);
        assert_eq!(l.find_ahead("/d", &caller, "b", ttl).map(|a| a.ino), Some(2));
        assert_eq!(l.find_ahead("/d", &Caller { uid: 5, ..Caller::ROOT }, "b", ttl), None, "another caller");
        l.entry_removed("/d", "b");
        assert_eq!(l.find_ahead("/d", &caller, "b", ttl), None);
        assert!(l.find_ahead("/d", &caller, "a", ttl).is_some());
        l.path_changed("/d/a");
        assert_eq!(l.find_ahead("/d", &caller, "a", ttl), None);
    }

    #[test]
    fn a_listing_read_again_from_its_start_is_remembered_anew_and_bounded() {
        let l = Listings::default();
        l.listed("/d", &window(0, 10), true);
        l.listed("/d", &window(0, 10), true);
        assert_eq!(l.recent.lock().unwrap()[0].entries.len(), 10);
        for k in 0..(RECENT / 4096 + 2) {
            l.listed("/d", &window(10 + k * 4096, 4096), false);
        }
        assert_eq!(l.recent.lock().unwrap()[0].entries.len(), RECENT);
        // A small directory listed after it drops the oldest entries of all: the big one.
        l.listed("/a", &window(0, 1), true);
        assert_eq!(l.recent.lock().unwrap().iter().map(|r| r.dir.as_str()).collect::<Vec<_>>(), ["/a"]);
        for k in 0..RECENT_DIRS + 5 {
            l.listed(&format!("/s{k}"), &window(0, 1), true);
        }
        assert_eq!(l.recent.lock().unwrap().len(), RECENT_DIRS);
        l.listed("/d", &window(0, 1000), true);
        l.listed("/sub", &window(0, 10), true);
        let dirs: Vec<String> = l.recent.lock().unwrap().iter().map(|r| r.dir.clone()).collect();
        assert!(dirs.contains(&"/d".to_string()), "small listings leave room for the big one: {dirs:?}");
    }
}
