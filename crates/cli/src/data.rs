//! `plusfs put`, `plusfs get`, `plusfs cat`: file contents between the cluster and local
//! files or standard output.

use clap::Args;
use plusfs_client::{Client, FsError, IO_CHUNK};
use plusfs_proto::Errno;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct PutArgs {
    /// Local file to copy (`-` for standard input).
    local: PathBuf,
    /// Cluster path of the new (or replaced) file.
    path: String,
    /// Permission bits of a new file, octal.
    #[arg(short, long, default_value = "644", value_parser = crate::files::parse_mode)]
    mode: u32,
}

#[derive(Args)]
pub struct GetArgs {
    /// Cluster file to copy.
    path: String,
    /// Local file to write (`-` for standard output).
    local: PathBuf,
}

#[derive(Args)]
pub struct CatArgs {
    #[arg(required = true)]
    paths: Vec<String>,
}

fn local_error(what: &str, path: &std::path::Path, e: std::io::Error) -> ExitCode {
    eprintln!("plusfs: cannot {what} '{}': {e}", path.display());
    ExitCode::FAILURE
}

/// `put`: creates or truncates the file, then writes the local data in chunks.
pub async fn put(c: &Client, a: PutArgs) -> ExitCode {
    let mut input: Box<dyn Read> = if a.local.as_os_str() == "-" {
        Box::new(std::io::stdin())
    } else {
        match std::fs::File::open(&a.local) {
            Ok(f) => Box::new(f),
            Err(e) => return local_error("open", &a.local, e),
        }
    };
    let result: Result<(), FsError> = async {
        c.create(&a.path, a.mode, false).await?;
        c.truncate(&a.path, 0).await?;
        let mut offset = 0u64;
        let mut buf = vec![0u8; IO_CHUNK * 4];
        loop {
            let n = fill(&mut input, &mut buf).map_err(|e| {
                FsError::new("read", a.local.display().to_string(), Errno(e.raw_os_error().unwrap_or(5)))
            })?;
            if n == 0 {
                return Ok(());
            }
            c.write(&a.path, offset, &buf[..n]).await?;
            offset += n as u64;
        }
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plusfs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Reads until `buf` is full or the input ends.
fn fill(input: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Copies a cluster file to `out` in chunks.
async fn copy_out(c: &Client, path: &str, out: &mut dyn Write) -> Result<(), FsError> {
    let size = c.lstat(path).await?.size;
    let mut offset = 0u64;
    while offset < size {
        let part = c.read(path, offset, (IO_CHUNK * 4).min((size - offset) as usize)).await?;
        if part.is_empty() {
            break;
        }
        out.write_all(&part).map_err(|e| FsError::new("write", "output", Errno(e.raw_os_error().unwrap_or(5))))?;
        offset += part.len() as u64;
    }
    Ok(())
}

/// `get`: copies a cluster file to a local file or standard output.
pub async fn get(c: &Client, a: GetArgs) -> ExitCode {
    let mut out: Box<dyn Write> = if a.local.as_os_str() == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        match std::fs::File::create(&a.local) {
            Ok(f) => Box::new(std::io::BufWriter::new(f)),
            Err(e) => return local_error("create", &a.local, e),
        }
    };
    let r = copy_out(c, &a.path, out.as_mut()).await;
    if let Err(e) = out.flush() {
        return local_error("write", &a.local, e);
    }
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plusfs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `cat`: writes files to standard output, one after the other.
pub async fn cat(c: &Client, a: CatArgs) -> ExitCode {
    let mut failed = false;
    let mut out = std::io::stdout().lock();
    for p in &a.paths {
        if let Err(e) = copy_out(c, p, &mut out).await {
            eprintln!("plusfs: {e}");
            failed = true;
        }
    }
    let _ = out.flush();
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
