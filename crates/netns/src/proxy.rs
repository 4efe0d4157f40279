//! The delaying proxy in front of a server: it listens on the server's public address in
//! the server's namespace and forwards each connection to the server's inner address,
//! holding every chunk of bytes, in each direction, for the link's delay (± jitter) after
//! it arrived. A request and its reply therefore each cross one delayed link, as on a
//! network whose every link adds the delay.
//!
//! Threads, not async tasks: a chunk must leave on time to the tens of microseconds, and
//! tokio's timers tick in milliseconds. Each direction of a connection has a reader (which
//! stamps chunks with their due time, so a delay never slows the byte rate) and a writer
//! (which sleeps until each is due, with the thread's timer slack set to 1 ns). A chunk
//! is never due before the one before it: jitter does not reorder a byte stream. The
//! delay is re-read from the network's state file when it changes.

use crate::{Net, STATE_FILE};
use anyhow::{Context, Result};
use rand::Rng;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime};

/// The delay and jitter in force, in ns; shared by all pumps.
#[derive(Default)]
struct Delay {
    delay_ns: AtomicU64,
    jitter_ns: AtomicU64,
}

impl Delay {
    /// When a chunk read `now` is due, never before `prev`.
    fn due(&self, now: Instant, prev: Instant) -> Instant {
        let d = self.delay_ns.load(Ordering::Relaxed) as i64;
        let j = self.jitter_ns.load(Ordering::Relaxed) as i64;
        let off = if j > 0 { d + rand::thread_rng().gen_range(-j..=j) } else { d };
        (now + Duration::from_nanos(off.max(0) as u64)).max(prev)
    }
}

/// Serves connections on each `(listen, to)` of `links`, forwarding them to `to`, with the
/// delay of host `host`'s link in the network whose state is in `data` (watched for
/// changes). Runs until the process is killed.
pub fn run(links: &[(SocketAddr, SocketAddr)], data: &Path, host: &str) -> Result<()> {
    let delay = Arc::new(Delay::default());
    load_delay(data, host, &delay);
    let (watched, d) = (data.join(STATE_FILE), delay.clone());
    let h = host.to_string();
    std::thread::Builder::new().name("watch".into()).spawn(move || watch(&watched, &h, &d))?;
    let mut acceptors = Vec::new();
    for &(listen, to) in links {
        let listener = TcpListener::bind(listen).with_context(|| format!("proxy cannot listen on {listen}"))?;
        tracing::info!(%listen, %to, "delaying proxy ready");
        let delay = delay.clone();
        acceptors.push(std::thread::Builder::new().name("accept".into()).spawn(move || accept(listener, to, delay))?);
    }
    for a in acceptors {
        let _ = a.join();
    }
    Ok(())
}

/// Forwards every connection `listener` accepts to `to`.
fn accept(listener: TcpListener, to: SocketAddr, delay: Arc<Delay>) {
    for conn in listener.incoming() {
        let Ok(client) = conn else { continue };
        let delay = delay.clone();
        std::thread::spawn(move || {
            if let Err(e) = splice(client, to, delay) {
                tracing::debug!(cause = %e, "proxied connection ended");
            }
        });
    }
}

fn load_delay(data: &Path, host: &str, delay: &Delay) {
    if let Ok(Some(net)) = Net::load(data) {
        let (d, j) = net.delay_of(host);
        delay.delay_ns.store(d * 1000, Ordering::Relaxed);
        delay.jitter_ns.store(j.min(d) * 1000, Ordering::Relaxed);
    }
}

/// Re-reads the delay whenever the state file changes (checked every 200 ms).
fn watch(path: &PathBuf, host: &str, delay: &Delay) {
    let mtime = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
    let mut seen = mtime(path);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = mtime(path);
        if now != seen {
            seen = now;
            load_delay(path.parent().unwrap_or(Path::new(".")), host, delay);
            tracing::info!(delay_ns = delay.delay_ns.load(Ordering::Relaxed), "link delay changed");
        }
    }
}

/// Connects to `to` and pumps both directions of `client` through delays.
fn splice(client: TcpStream, to: SocketAddr, delay: Arc<Delay>) -> Result<()> {
    let server = TcpStream::connect(to).with_context(|| format!("cannot reach the server at {to}"))?;
    for s in [&client, &server] {
        s.set_nodelay(true)?;
    }
    let up = pump(client.try_clone()?, server.try_clone()?, delay.clone());
    let down = pump(server, client, delay);
    let _ = up.join();
    let _ = down.join();
    Ok(())
}

/// One direction: a reader that stamps chunks, a writer that sends them when due.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Arc<Delay>) -> std::thread::JoinHandle<()> {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = std::thread::spawn(move || {
        set_timer_slack_1ns();
        for (due, chunk) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    std::thread::spawn(move || {
        let mut prev = Instant::now();
        let mut buf = vec![0u8; 256 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    prev = delay.due(Instant::now(), prev);
                    if tx.send((prev, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
        drop(tx);
        let _ = writer.join();
        let _ = from.shutdown(Shutdown::Read);
    })
}

/// Lets this thread's sleeps end on time instead of up to 50 µs late.
fn set_timer_slack_1ns() {
    #[allow(unsafe_code)]
    // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's timer slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_due_after_the_delay_and_never_reordered() {
        let d = Delay::default();
        d.delay_ns.store(1_000_000, Ordering::Relaxed);
        d.jitter_ns.store(900_000, Ordering::Relaxed);
        let start = Instant::now();
        let mut prev = start;
        for _ in 0..1000 {
            let due = d.due(start, prev);
            assert!(due >= prev);
            assert!(due >= start + Duration::from_micros(100));
            assert!(due <= start + Duration::from_micros(1900));
            prev = due;
        }
    }
}
