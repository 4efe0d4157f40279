//! File contents: read, write, append, truncate, fsync.
//!
//! Requests go to the server holding the file's entry (Eq. 1, or Eq. 2 in a huge
//! directory), which keeps the layout in the inode and stores or fetches the bytes. Large
//! transfers are cut into requests of [`IO_CHUNK`] bytes, several in flight at once.

use crate::error::FsError;
use crate::fs::Client;
use bytes::Bytes;
use futures::stream::{self, StreamExt, TryStreamExt};
use plusfs_proto::path;
use plusfs_proto::{Attr, Errno, Payload, Reply, Request, SetAttr, MAX_FILE_SIZE};

/// Bytes per read or write request.
pub const IO_CHUNK: usize = 4 << 20;
/// Requests of one transfer in flight at once.
const IN_FLIGHT: usize = 4;

impl Client {
    fn file_target(&self, op: &'static str, raw: &str) -> Result<(String, String, String), FsError> {
        let p = self.norm(op, raw)?;
        let (dir, name) = path::split(&p).ok_or_else(|| FsError::new(op, raw, Errno::EISDIR))?;
        Ok((p.clone(), dir.to_string(), name.to_string()))
    }

    /// `pwrite(2)`: writes `data` at `offset`; returns the attributes after the write.
    /// The bytes are copied once, into a buffer the requests share.
    pub async fn write(&self, raw: &str, offset: u64, data: &[u8]) -> Result<Attr, FsError> {
        self.write_bytes(raw, offset, Bytes::copy_from_slice(data)).await
    }

    /// [`Client::write`] of bytes the caller hands over: the requests send slices of
    /// `data` itself, without copying it.
    pub async fn write_bytes(&self, raw: &str, offset: u64, data: Bytes) -> Result<Attr, FsError> {
        let (p, dir, name) = self.file_target("write", raw)?;
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > MAX_FILE_SIZE) {
            return Err(FsError::new("write", raw, Errno::EFBIG));
        }
        if let Some(a) = self.deleg_write(&dir, &name, offset, &data).await {
            return Ok(a);
        }
        if data.is_empty() {
            return self.write_one(raw, &p, &dir, &name, offset, Bytes::new(), false).await;
        }
        if let Some(from) = self.direct_write_from(offset, data.len()) {
            // The bytes below `small_file_bytes` go to the entry server as they always
            // did, the chunked rest straight to the data servers.
            let split = (from - offset) as usize;
            if split > 0 {
                self.write_relayed(raw, (&p, &dir, &name), offset, data.slice(..split)).await?;
            }
            return self.write_direct(raw, (&p, &dir, &name), from, data.slice(split..)).await;
        }
        self.write_relayed(raw, (&p, &dir, &name), offset, data).await
    }

    /// Writes `data` at `offset` through the file's entry server, which stores the bytes
    /// or relays them to their data servers.
    async fn write_relayed(
        &self,
        raw: &str,
        (p, dir, name): (&str, &str, &str),
        offset: u64,
        data: Bytes,
    ) -> Result<Attr, FsError> {
        let chunks: Vec<(u64, Bytes)> = (0..data.len())
            .step_by(IO_CHUNK)
            .map(|at| (offset + at as u64, data.slice(at..data.len().min(at + IO_CHUNK))))
            .collect();
        // The futures are built first (not in a stream closure) so the returned future is
        // `Send` for any caller lifetime.
        let writes: Vec<_> =
            chunks.into_iter().map(|(at, c)| self.write_one(raw, p, dir, name, at, c, false)).collect();
        let attrs: Vec<Attr> = stream::iter(writes).buffer_unordered(IN_FLIGHT).try_collect().await?;
        // The last reply to arrive has seen every write.
        Ok(attrs.into_iter().max_by_key(|a| (a.mtime, a.size)).expect("at least one chunk"))
    }

    /// Appends `data` at the end of the file (`O_APPEND`), atomically per request.
    pub async fn append(&self, raw: &str, data: &[u8]) -> Result<Attr, FsError> {
        let (p, dir, name) = self.file_target("write", raw)?;
        let mut last = None;
        for c in data.chunks(IO_CHUNK.max(1)) {
            last = Some(self.write_one(raw, &p, &dir, &name, 0, Bytes::copy_from_slice(c), true).await?);
        }
        match last {
            Some(a) => Ok(a),
            None => self.write_one(raw, &p, &dir, &name, 0, Bytes::new(), true).await,
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn write_one(
        &self,
        raw: &str,
        p: &str,
        dir: &str,
        name: &str,
        offset: u64,
        data: Bytes,
        append: bool,
    ) -> Result<Attr, FsError> {
        let req = Request::Write { path: p.to_string(), offset, data: data.into(), append };
        match self.entry_rpc("write", raw, dir, name, req).await?.0 {
            Reply::Attr(a) => Ok(a),
            other => Err(FsError::new("write", raw, Errno::EPROTO).with_detail(format!("unexpected reply {other:?}"))),
        }
    }

    /// `pread(2)`: up to `len` bytes at `offset` (fewer at the end of the file).
    pub async fn read(&self, raw: &str, offset: u64, len: usize) -> Result<Vec<u8>, FsError> {
        let (p, dir, name) = self.file_target("read", raw)?;
        if let Some(d) = self.deleg_read(&dir, &name, offset, len).await {
            return Ok(d);
        }
        if self.reads_directly(len) {
            return self.read_direct(raw, (&p, &dir, &name), offset, len).await;
        }
        let starts: Vec<u64> = (0..len).step_by(IO_CHUNK).map(|i| offset + i as u64).collect();
        let reads: Vec<_> = starts
            .into_iter()
            .map(|at| {
                let n = (offset + len as u64 - at).min(IO_CHUNK as u64) as u32;
                self.read_one(raw, &p, &dir, &name, at, n)
            })
            .collect();
        let parts: Vec<Payload> = stream::iter(reads).buffered(IN_FLIGHT).try_collect().await?;
        let mut out = Vec::with_capacity(len);
        for part in parts {
            let short = part.len() < IO_CHUNK;
            for c in part.chunks() {
                out.extend_from_slice(c);
            }
            if short {
                break; // end of file
            }
        }
        Ok(out)
    }

    async fn read_one(
        &self,
        raw: &str,
        p: &str,
        dir: &str,
        name: &str,
        offset: u64,
        len: u32,
    ) -> Result<Payload, FsError> {
        let req = Request::Read { path: p.to_string(), offset, len };
        match self.entry_rpc("read", raw, dir, name, req).await?.0 {
            Reply::Data(d) => Ok(d),
            other => Err(FsError::new("read", raw, Errno::EPROTO).with_detail(format!("unexpected reply {other:?}"))),
        }
    }

    /// The whole contents of a file.
    pub async fn read_all(&self, raw: &str) -> Result<Vec<u8>, FsError> {
        let size = self.lstat(raw).await?.size;
        self.read(raw, 0, size as usize).await
    }

    /// `truncate(2)`: sets a regular file's size (cut or zero-extended).
    pub async fn truncate(&self, raw: &str, size: u64) -> Result<Attr, FsError> {
        self.setattr(raw, SetAttr { size: Some(size), ..Default::default() })
            .await
            .map_err(|e| FsError { op: "truncate", ..e })
    }

    /// `fsync(2)`: the file's data and metadata are durable when it returns.
    pub async fn fsync(&self, raw: &str) -> Result<(), FsError> {
        let (p, dir, name) = self.file_target("sync", raw)?;
        self.entry_rpc("sync", raw, &dir, &name, Request::Fsync { path: p }).await?;
        self.deleg_lost()
    }
}

/// Descriptor-based calls over the client's descriptor table (`open_fd`, `openv`).
impl Client {
    fn handle(&self, op: &'static str, fd: i32) -> Result<crate::types::FileHandle, FsError> {
        self.fds.get(fd).ok_or_else(|| FsError::new(op, format!("descriptor {fd}"), Errno::EBADF))
    }

    /// `pread(2)` on a descriptor.
    pub async fn pread_fd(&self, fd: i32, offset: u64, len: usize) -> Result<Vec<u8>, FsError> {
        let h = self.handle("read", fd)?;
        self.inner().read(&h.path, offset, len).await
    }

    /// `pwrite(2)` on a descriptor (at the end of the file for `O_APPEND`).
    pub async fn pwrite_fd(&self, fd: i32, offset: u64, data: &[u8]) -> Result<Attr, FsError> {
        let h = self.handle("write", fd)?;
        if h.append {
            self.append(&h.path, data).await
        } else {
            self.inner().write(&h.path, offset, data).await
        }
    }

    /// `ftruncate(2)`.
    pub async fn ftruncate_fd(&self, fd: i32, size: u64) -> Result<Attr, FsError> {
        let h = self.handle("truncate", fd)?;
        self.inner().truncate(&h.path, size).await
    }

    /// `fsync(2)`.
    pub async fn fsync_fd(&self, fd: i32) -> Result<(), FsError> {
        let h = self.handle("sync", fd)?;
        self.inner().fsync(&h.path).await
    }
}

/// Extended attributes.
impl Client {
    /// Runs an xattr operation on the entry, or on the directory's own object.
    async fn xattr(&self, op_name: &'static str, raw: &str, op: plusfs_proto::XattrOp) -> Result<Reply, FsError> {
        let p = self.norm(op_name, raw)?;
        let dir_req = Request::DirXattr { path: p.clone(), op: op.clone() };
        let Some((dir, name)) = path::split(&p) else {
            return self.rpc(op_name, raw, self.home("/"), dir_req).await;
        };
        let req = Request::Xattr { path: p.clone(), op };
        match self.entry_rpc(op_name, raw, dir, name, req).await?.0 {
            Reply::IsDir { .. } => self.rpc(op_name, raw, self.home(&p), dir_req).await,
            r => Ok(r),
        }
    }

    /// `lgetxattr(2)`: the value of attribute `name` (ENODATA if it has none).
    pub async fn getxattr(&self, raw: &str, name: &str) -> Result<Vec<u8>, FsError> {
        match self.xattr("get attribute of", raw, plusfs_proto::XattrOp::Get { name: name.into() }).await? {
            Reply::Data(v) => Ok(v.to_vec()),
            other => Err(FsError::new("get attribute of", raw, Errno::EPROTO).with_detail(format!("{other:?}"))),
        }
    }

    /// `llistxattr(2)`: the attribute names.
    pub async fn listxattr(&self, raw: &str) -> Result<Vec<String>, FsError> {
        match self.xattr("list attributes of", raw, plusfs_proto::XattrOp::List).await? {
            Reply::Names(n) => Ok(n),
            other => Err(FsError::new("list attributes of", raw, Errno::EPROTO).with_detail(format!("{other:?}"))),
        }
    }

    /// `lsetxattr(2)`; `create` is XATTR_CREATE, `replace` XATTR_REPLACE.
    pub async fn setxattr(
        &self,
        raw: &str,
        name: &str,
        value: &[u8],
        create: bool,
        replace: bool,
    ) -> Result<(), FsError> {
        let op = plusfs_proto::XattrOp::Set { name: name.into(), value: value.to_vec(), create, replace };
        self.xattr("set attribute of", raw, op).await.map(drop)
    }

    /// `lremovexattr(2)`.
    pub async fn removexattr(&self, raw: &str, name: &str) -> Result<(), FsError> {
        self.xattr("remove attribute of", raw, plusfs_proto::XattrOp::Remove { name: name.into() }).await.map(drop)
    }
}
