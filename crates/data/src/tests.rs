use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

fn small_segments(dir: &Path, bytes: u64) -> DataStore {
    DataStore::open(dir, DataOptions { segment_bytes: bytes, sync: false, reserve_bytes: 0, replica: false }).unwrap()
}

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

#[test]
fn appended_buffers_read_back_in_one_merged_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = DataStore::open(dir.path(), DataOptions::default()).unwrap();
    let files: Vec<Vec<u8>> = (0..1000).map(|i| data(i, (i as usize * 37) % 5000)).collect();
    let refs: Vec<&[u8]> = files.iter().map(Vec::as_slice).collect();
    let extents = store.append(7, &refs).unwrap();
    assert_eq!(store.stats().appends, 1, "one write call for a thousand files");
    // Ask in reverse order: the store sorts, merges and answers in the order asked.
    let wanted: Vec<Extent> = extents.iter().rev().copied().collect();
    let before = store.stats().reads;
    let got = store.read_many(&wanted, 0).unwrap();
    assert_eq!(store.stats().reads - before, 1, "contiguous records are one read");
    for (g, f) in got.iter().zip(files.iter().rev()) {
        assert_eq!(g, f);
    }
    // Every other extent: with a gap allowance one read, without one read per extent.
    let sparse: Vec<Extent> = extents.iter().step_by(2).copied().collect();
    let before = store.stats().reads;
    store.read_many(&sparse, 1 << 20).unwrap();
    assert_eq!(store.stats().reads - before, 1);
    let before = store.stats().reads;
    store.read_many(&sparse[..10], 0).unwrap();
    assert_eq!(store.stats().reads - before, 10);
    assert_eq!(store.read(&extents[3]).unwrap(), files[3]);
}

#[test]
fn segments_roll_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut extents = Vec::new();
    {
        let store = small_segments(dir.path(), 64 << 10);
        for i in 0..100 {
            let d = data(i, 3000);
            extents.push((store.append(i, &[&d]).unwrap()[0], d));
        }
        // A buffer bigger than a segment gets a segment of its own.
        let big = data(1000, 200 << 10);
        extents.push((store.append(1000, &[&big]).unwrap()[0], big));
        assert!(store.segments().len() >= 5, "{:?}", store.segments());
    }
    let store = small_segments(dir.path(), 64 << 10);
    for (e, d) in &extents {
        assert_eq!(&store.read(e).unwrap(), d);
    }
    let next = store.append(1, &[b"after reopen"]).unwrap()[0];
    assert_eq!(&store.read(&next).unwrap()[..], b"after reopen");
    assert_eq!(store.scan_segment(next.segment).unwrap().last().unwrap().1, 1);
}

#[test]
fn a_torn_tail_is_cut_and_earlier_data_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (e, seg_path) = {
        let store = DataStore::open(dir.path(), DataOptions::default()).unwrap();
        let e = store.append(1, &[b"acknowledged"]).unwrap()[0];
        (e, dir.path().join(segment_name(e.segment)))
    };
    // A crash in the middle of the next append: a header and half its data.
    let half = RecordHeader::for_data(2, &[9u8; 100]).encode();
    let mut f = OpenOptions::new().append(true).open(&seg_path).unwrap();
    f.write_all(&half).unwrap();
    f.write_all(&[9u8; 50]).unwrap();
    drop(f);
    let store = DataStore::open(dir.path(), DataOptions::default()).unwrap();
    assert_eq!(&store.read(&e).unwrap()[..], b"acknowledged");
    assert_eq!(std::fs::metadata(&seg_path).unwrap().len(), e.offset + e.len as u64);
    let next = store.append(3, &[b"next"]).unwrap()[0];
    assert_eq!(next.offset, e.offset + e.len as u64 + HEADER_LEN as u64);
    assert_eq!(&store.read(&next).unwrap()[..], b"next");
}

#[test]
fn corruption_and_bad_extents_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = DataStore::open(dir.path(), DataOptions::default()).unwrap();
    let e = store.append(1, &[b"hello world"]).unwrap()[0];
    let path = dir.path().join(segment_name(e.segment));
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(b"J", e.offset).unwrap();
    assert!(matches!(store.read(&e), Err(DataError::Corrupt { .. })));
    let wrong_len = Extent { len: 3, ..e };
    assert!(matches!(store.read(&wrong_len), Err(DataError::Corrupt { .. })));
    let beyond = Extent { offset: 1 << 30, ..e };
    assert!(matches!(store.read(&beyond), Err(DataError::OutOfRange(_))));
    assert!(matches!(store.read(&Extent { segment: 99, ..e }), Err(DataError::NoSegment(99))));
}

/// An index kept in memory, like the inode layouts the server keeps in its metadata store.
#[derive(Default)]
struct MemIndex {
    files: BTreeMap<u64, Extent>,
    /// Simulated crash points of `relocate`.
    fail_before: bool,
    fail_after: bool,
}

impl LiveIndex for MemIndex {
    fn live_in(&self, segment: u32) -> Result<Vec<Live>, DataError> {
        Ok(self
            .files
            .iter()
            .filter(|(_, e)| e.segment == segment)
            .map(|(o, e)| Live { key: *o, owner: *o, extent: *e })
            .collect())
    }

    fn relocate(&mut self, moves: &[Move]) -> Result<(), DataError> {
        let crash = || DataError::Corrupt { segment: 0, offset: 0, reason: "simulated crash".into() };
        if self.fail_before {
            return Err(crash());
        }
        for m in moves {
            assert_eq!(self.files.get(&m.key), Some(&m.from));
            self.files.insert(m.key, m.to);
        }
        if self.fail_after {
            return Err(crash());
        }
        Ok(())
    }
}

fn check_all(store: &DataStore, index: &MemIndex, model: &BTreeMap<u64, Vec<u8>>) {
    assert_eq!(index.files.len(), model.len());
    for (owner, e) in &index.files {
        assert_eq!(&store.read(e).unwrap(), &model[owner], "file {owner}");
    }
}

#[test]
fn compaction_reclaims_dead_space_and_keeps_live_data() {
    let dir = tempfile::tempdir().unwrap();
    let store = small_segments(dir.path(), 32 << 10);
    let mut index = MemIndex::default();
    let mut model = BTreeMap::new();
    for i in 0..200u64 {
        let d = data(i, 1000);
        index.files.insert(i, store.append(i, &[&d]).unwrap()[0]);
        model.insert(i, d);
    }
    // Delete four files in five.
    for i in (0..200u64).filter(|i| i % 5 != 0) {
        index.files.remove(&i);
        model.remove(&i);
    }
    let bytes_before: u64 = store.segments().iter().map(|s| s.bytes).sum();
    let stats = compact(&store, &mut index, 0.5).unwrap();
    assert!(stats.segments_compacted >= 5, "{stats:?}");
    // Only the 40 survivors are ever copied (those in the active segment stay put).
    assert!(stats.records_moved > 0 && stats.records_moved <= 40, "{stats:?}");
    let bytes_after: u64 = store.segments().iter().map(|s| s.bytes).sum();
    assert!(bytes_after < bytes_before / 2, "{bytes_before} -> {bytes_after}");
    check_all(&store, &index, &model);
}

#[test]
fn a_crash_at_any_step_of_compaction_loses_nothing() {
    for crash_after_relocate in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = small_segments(dir.path(), 16 << 10);
        let mut index = MemIndex::default();
        let mut model = BTreeMap::new();
        for i in 0..60u64 {
            let d = data(i, 900);
            index.files.insert(i, store.append(i, &[&d]).unwrap()[0]);
            model.insert(i, d);
        }
        for i in (0..60u64).filter(|i| i % 3 != 0) {
            index.files.remove(&i);
            model.remove(&i);
        }
        index.fail_before = !crash_after_relocate;
        index.fail_after = crash_after_relocate;
        assert!(compact(&store, &mut index, 0.9).is_err());
        check_all(&store, &index, &model);
        // Restart: reopen the store; unreferenced segments go, live data stays.
        drop(store);
        let store = small_segments(dir.path(), 16 << 10);
        index.fail_before = false;
        index.fail_after = false;
        collect_garbage(&store, &index).unwrap();
        check_all(&store, &index, &model);
        compact(&store, &mut index, 0.9).unwrap();
        check_all(&store, &index, &model);
    }
}

#[test]
fn random_writes_deletes_compactions_and_restarts_match_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    let mut index = MemIndex::default();
    let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut store = small_segments(dir.path(), 48 << 10);
    for step in 0..600u64 {
        match rng.gen_range(0..100) {
            0..=59 => {
                // Write (or overwrite) a batch of files in one append.
                let owners: Vec<u64> = (0..rng.gen_range(1..8)).map(|_| rng.gen_range(0..80)).collect();
                let bufs: Vec<Vec<u8>> = owners.iter().map(|o| data(step * 100 + o, rng.gen_range(0..4000))).collect();
                let records: Vec<(u64, &[u8])> = owners.iter().zip(&bufs).map(|(o, b)| (*o, b.as_slice())).collect();
                let extents = store.append_records(&records).unwrap();
                for ((o, b), e) in owners.iter().zip(&bufs).zip(extents) {
                    index.files.insert(*o, e);
                    model.insert(*o, b.clone());
                }
            }
            60..=84 => {
                let o = rng.gen_range(0..80);
                index.files.remove(&o);
                model.remove(&o);
            }
            85..=94 => {
                compact(&store, &mut index, rng.gen_range(0.2..0.9)).unwrap();
            }
            _ => {
                drop(store);
                store = small_segments(dir.path(), 48 << 10);
                collect_garbage(&store, &index).unwrap();
            }
        }
        if step % 50 == 0 {
            check_all(&store, &index, &model);
        }
    }
    check_all(&store, &index, &model);
}

/// A record is readable whatever roll happens while it is looked up: readers of the
/// segment that was active a moment ago never hear that it does not exist.
#[test]
fn records_stay_readable_while_appends_roll_segments() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(small_segments(dir.path(), 4096));
    let last = Arc::new(Mutex::new(None::<Extent>));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (store, last, done) = (store.clone(), last.clone(), done.clone());
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(e) = *last.lock() {
                    store.read(&e).unwrap();
                    store.read_stored(&e).unwrap();
                    reads += 1;
                }
            }
            reads
        })
    };
    for i in 0..3_000u64 {
        let e = store.append(1, &[&data(i, 1000)]).unwrap()[0];
        *last.lock() = Some(e);
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.join().expect("no read failed");
    assert!(reads > 0 && store.segments().len() > 700, "{reads} reads, {} segments", store.segments().len());
}
