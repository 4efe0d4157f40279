//! `plusfs bench` large-file modes (`--block`, `--shared-file`) and the wire probe.
//!
//! With `--block B`, each client of the write and read phases moves its `--size` bytes per
//! file in calls of `B` bytes, as IOR's transfer size does (`-t`); with `--shared-file`
//! every client works on its own regions of one file, `DIR/shared`: region `i * clients
//! + k` for client `k`'s `i`-th "file" (N-to-1, strided). The `probe-write` and
//! `probe-read` phases move the same byte count between the clients and the servers with
//! `Probe` requests that store and read nothing: the limit the file phases compare with.

use anyhow::{bail, Result};
use plusfs_client::{Client, FsError};
use plusfs_proto::{Errno, Reply, Request};

/// Bytes per probe request.
const PROBE_REQUEST: usize = 4 << 20;
/// Probe requests a client has in flight.
const PROBE_WINDOW: usize = 4;

/// A size in bytes: a number with an optional suffix (`k`, `KiB`, `M`, `MiB`, `G`, `GiB`;
/// all binary).
pub fn parse_size(s: &str) -> Result<usize> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num.parse().map_err(|_| anyhow::anyhow!("'{s}' is not a size (like 4096, 16MiB, 1GiB)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => bail!("unknown size unit '{other}' in '{s}' (use k, M or G)"),
    };
    n.checked_shl(shift).filter(|v| v >> shift == n).ok_or_else(|| anyhow::anyhow!("size '{s}' is too large"))
}

/// Where one client's large-file I/O goes.
#[derive(Debug, Clone)]
pub(crate) struct LargeIo {
    /// Bytes per call.
    pub block: usize,
    /// Bytes per file (or per region of the shared file).
    pub size: usize,
    /// The clients' regions of one shared file instead of files of their own.
    pub shared: Option<SharedFile>,
}

/// The shared file and this client's place among the clients.
#[derive(Debug, Clone)]
pub(crate) struct SharedFile {
    pub path: String,
    pub client: usize,
    pub clients: usize,
}

impl LargeIo {
    /// The (path, offset) of this client's `i`-th file or region; `path` is the file
    /// the client would use on its own.
    pub fn target(&self, own: &str, i: usize) -> (String, u64) {
        match &self.shared {
            None => (own.to_string(), 0),
            Some(s) => (s.path.clone(), ((i * s.clients + s.client) * self.size) as u64),
        }
    }
}

/// Writes `io.size` bytes at `at` of `path` in calls of `io.block` bytes; the file is
/// created first unless it is the shared one (made before the phase).
pub(crate) async fn write(c: &Client, io: &LargeIo, path: &str, at: u64, contents: &[u8]) -> Result<(), FsError> {
    if io.shared.is_none() {
        c.create(path, 0o644, true).await?;
    }
    let mut done = 0;
    while done < io.size {
        let n = io.block.min(io.size - done);
        c.write(path, at + done as u64, &contents[..n]).await?;
        done += n;
    }
    Ok(())
}

/// Reads `io.size` bytes at `at` of `path` in calls of `io.block` bytes; a short read is
/// an error.
pub(crate) async fn read(c: &Client, io: &LargeIo, path: &str, at: u64) -> Result<(), FsError> {
    let mut done = 0;
    while done < io.size {
        let n = io.block.min(io.size - done);
        let got = c.read(path, at + done as u64, n).await?;
        if got.len() != n {
            let e = FsError::new("bench read", path, Errno::EIO);
            return Err(e.with_detail(format!("{} bytes at {}, {n} expected", got.len(), at + done as u64)));
        }
        done += n;
    }
    Ok(())
}

/// The wire probe: `bytes` sent to the servers (`write`) or fetched from them, in
/// requests of [`PROBE_REQUEST`] bytes, [`PROBE_WINDOW`] in flight, the servers taken in
/// turn.
pub(crate) async fn probe(c: &Client, bytes: usize, write: bool) -> Result<(), FsError> {
    use futures::stream::{self, StreamExt, TryStreamExt};
    let servers: Vec<u32> = c.map().servers.iter().map(|s| s.id).collect();
    let payload = bytes::Bytes::from(vec![0x5au8; PROBE_REQUEST]);
    let calls: Vec<_> = (0..bytes.div_ceil(PROBE_REQUEST))
        .map(|i| {
            let n = PROBE_REQUEST.min(bytes - i * PROBE_REQUEST);
            let server = servers[i % servers.len()];
            let req = match write {
                true => Request::Probe { data: payload.slice(..n).into(), reply_len: 0 },
                false => Request::Probe { data: Default::default(), reply_len: n as u32 },
            };
            async move {
                let want = if write { 0 } else { n };
                let got = match c.call_server(server, &req).await? {
                    Reply::Data(d) => d.len(),
                    other => {
                        return Err(FsError::new("probe", format!("server {server}"), Errno::EPROTO)
                            .with_detail(format!("unexpected reply {other:?}")))
                    }
                };
                match got == want {
                    true => Ok(()),
                    false => Err(FsError::new("probe", format!("server {server}"), Errno::EPROTO)
                        .with_detail(format!("{got} bytes back, {want} expected"))),
                }
            }
        })
        .collect();
    stream::iter(calls).buffer_unordered(PROBE_WINDOW).try_collect::<Vec<()>>().await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_the_rest() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("47008").unwrap(), 47_008);
        assert_eq!(parse_size("8k").unwrap(), 8192);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }

    #[test]
    fn shared_regions_interleave_the_clients() {
        let shared = |client| LargeIo {
            block: 1,
            size: 100,
            shared: Some(SharedFile { path: "/d/shared".into(), client, clients: 3 }),
        };
        assert_eq!(shared(0).target("/d/f.0.0", 0), ("/d/shared".to_string(), 0));
        assert_eq!(shared(2).target("/d/f.2.0", 0), ("/d/shared".to_string(), 200));
        assert_eq!(shared(1).target("/d/f.1.1", 1), ("/d/shared".to_string(), 400));
        let own = LargeIo { block: 1, size: 100, shared: None };
        assert_eq!(own.target("/d/f.1.1", 1), ("/d/f.1.1".to_string(), 0));
    }
}
