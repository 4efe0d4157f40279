//! A snapshot's data on disk, written and read one record at a time so that a slot of any
//! size is snapshotted, sent and installed in bounded memory.
//!
//! Layout: an 8-byte magic, then records, each a tag byte and its fields (integers big
//! endian), then an end record with the number of records before it (a file cut short, by
//! a crash or a broken transfer, has no end record and is refused):
//!
//! | tag | fields |
//! |---|---|
//! | `P` | segment `u32`, offset `u64`, length `u32`, the stored bytes of a file-data record |
//! | `K` | key length `u32`, value length `u32`, key, value: one key of the store |
//! | `E` | record count `u64` |
//!
//! File data comes first: an install places it before the keys that refer to it.

use plusfs_store::DataPiece;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

const MAGIC: &[u8; 8] = b"PFSSNAP1";
const PIECE: u8 = b'P';
const KV: u8 = b'K';
const END: u8 = b'E';
/// Largest field accepted when reading (a record or a key or value of the store).
const MAX_FIELD: u32 = 256 << 20;

/// One record of a snapshot.
#[derive(Debug, PartialEq, Eq)]
pub enum Item {
    /// A file-data record's stored bytes at its segment and offset.
    Piece(DataPiece),
    /// A key of the store and its value.
    Kv(Vec<u8>, Vec<u8>),
}

/// Writes a snapshot data file.
pub struct Writer {
    out: BufWriter<File>,
    records: u64,
    bytes: u64,
}

impl Writer {
    /// Creates `path` (which must not exist) for a new snapshot's data.
    pub fn create(path: &Path) -> std::io::Result<Writer> {
        let f = std::fs::OpenOptions::new().write(true).create_new(true).open(path)?;
        let mut out = BufWriter::with_capacity(1 << 20, f);
        out.write_all(MAGIC)?;
        Ok(Writer { out, records: 0, bytes: MAGIC.len() as u64 })
    }

    /// Appends a file-data record.
    pub fn piece(&mut self, p: &DataPiece) -> std::io::Result<()> {
        let len = field_len(p.bytes.len())?;
        self.out.write_all(&[PIECE])?;
        self.out.write_all(&p.segment.to_be_bytes())?;
        self.out.write_all(&p.offset.to_be_bytes())?;
        self.out.write_all(&len.to_be_bytes())?;
        self.out.write_all(&p.bytes)?;
        self.records += 1;
        self.bytes += 17 + p.bytes.len() as u64;
        Ok(())
    }

    /// Appends a key of the store.
    pub fn kv(&mut self, k: &[u8], v: &[u8]) -> std::io::Result<()> {
        let (kl, vl) = (field_len(k.len())?, field_len(v.len())?);
        self.out.write_all(&[KV])?;
        self.out.write_all(&kl.to_be_bytes())?;
        self.out.write_all(&vl.to_be_bytes())?;
        self.out.write_all(k)?;
        self.out.write_all(v)?;
        self.records += 1;
        self.bytes += 9 + (k.len() + v.len()) as u64;
        Ok(())
    }

    /// Writes the end record and makes the file durable. Returns its size in bytes.
    pub fn finish(mut self) -> std::io::Result<u64> {
        self.out.write_all(&[END])?;
        self.out.write_all(&self.records.to_be_bytes())?;
        let f = self.out.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        Ok(self.bytes + 9)
    }
}

fn field_len(n: usize) -> std::io::Result<u32> {
    u32::try_from(n)
        .ok()
        .filter(|&n| n <= MAX_FIELD)
        .ok_or_else(|| std::io::Error::other(format!("a snapshot field of {n} bytes is too large")))
}

/// Reads a snapshot data file record by record.
pub struct Reader {
    input: BufReader<File>,
    records: u64,
    done: bool,
}

impl Reader {
    /// Opens `path` and checks its magic.
    pub fn open(path: &Path) -> std::io::Result<Reader> {
        let mut input = BufReader::with_capacity(1 << 20, File::open(path)?);
        let mut magic = [0u8; 8];
        input.read_exact(&mut magic).map_err(|e| bad(format!("no snapshot header: {e}")))?;
        if &magic != MAGIC {
            return Err(bad("not a snapshot data file".into()));
        }
        Ok(Reader { input, records: 0, done: false })
    }

    fn u32(&mut self) -> std::io::Result<u32> {
        let mut b = [0u8; 4];
        self.input.read_exact(&mut b)?;
        Ok(u32::from_be_bytes(b))
    }

    fn u64(&mut self) -> std::io::Result<u64> {
        let mut b = [0u8; 8];
        self.input.read_exact(&mut b)?;
        Ok(u64::from_be_bytes(b))
    }

    fn bytes(&mut self, n: u32) -> std::io::Result<Vec<u8>> {
        if n > MAX_FIELD {
            return Err(bad(format!("a snapshot field of {n} bytes is too large")));
        }
        let mut v = vec![0u8; n as usize];
        self.input.read_exact(&mut v)?;
        Ok(v)
    }

    /// The next record, `None` after the end record; an error if the file ends without it
    /// or holds something else.
    pub fn next_item(&mut self) -> std::io::Result<Option<Item>> {
        if self.done {
            return Ok(None);
        }
        let mut tag = [0u8; 1];
        self.input.read_exact(&mut tag).map_err(|e| bad(format!("the snapshot ends without its end record: {e}")))?;
        let item = match tag[0] {
            PIECE => {
                let (segment, offset, len) = (self.u32()?, self.u64()?, self.u32()?);
                Item::Piece(DataPiece { segment, offset, bytes: self.bytes(len)? })
            }
            KV => {
                let (kl, vl) = (self.u32()?, self.u32()?);
                let k = self.bytes(kl)?;
                Item::Kv(k, self.bytes(vl)?)
            }
            END => {
                let n = self.u64()?;
                if n != self.records {
                    return Err(bad(format!("the snapshot says {n} records but holds {}", self.records)));
                }
                self.done = true;
                return Ok(None);
            }
            t => return Err(bad(format!("unknown snapshot record tag {t:#x}"))),
        };
        self.records += 1;
        Ok(Some(item))
    }
}

fn bad(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_in_order_and_a_cut_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.data");
        let mut w = Writer::create(&path).unwrap();
        let p = DataPiece { segment: 3, offset: 4096, bytes: vec![7; 10_000] };
        w.piece(&p).unwrap();
        w.kv(b"key", b"value").unwrap();
        w.kv(b"", b"").unwrap();
        let size = w.finish().unwrap();
        assert_eq!(size, std::fs::metadata(&path).unwrap().len());
        let mut r = Reader::open(&path).unwrap();
        let mut got = Vec::new();
        while let Some(i) = r.next_item().unwrap() {
            got.push(i);
        }
        let want = vec![Item::Piece(p), Item::Kv(b"key".to_vec(), b"value".to_vec()), Item::Kv(vec![], vec![])];
        assert_eq!(got, want);
        // Every cut of the file short of its end is refused, never read as a smaller snapshot.
        let whole = std::fs::read(&path).unwrap();
        for cut in [0, 5, 8, 9, 100, whole.len() - 9, whole.len() - 1] {
            std::fs::write(&path, &whole[..cut]).unwrap();
            let res = Reader::open(&path).and_then(|mut r| {
                while r.next_item()?.is_some() {}
                Ok(())
            });
            assert!(res.is_err(), "a file cut at {cut} of {} bytes was accepted", whole.len());
        }
        assert!(Writer::create(&path).is_err(), "an existing file is never overwritten");
    }
}
