//! What a link does to traffic: delay and jitter (added by the user-space proxy in front of
//! each server), a rate limit (tbf) and random loss (nftables), with the units an operator
//! types (`100us`, `1ms`, `1gbit`, `0.1%`).

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The shape of every link of a private network (or of one member's link).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkShape {
    /// One-way delay added to each direction of a connection to a server, in µs.
    pub delay_us: u64,
    /// Uniform jitter around the delay, in µs (never reorders a connection's bytes).
    pub jitter_us: u64,
    /// Rate limit of each link in bits per second (0: none).
    pub rate_bps: u64,
    /// Packets dropped on arrival, in parts per million.
    pub loss_ppm: u32,
}

impl LinkShape {
    /// The one-way delay.
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_us)
    }

    /// The jitter.
    pub fn jitter(&self) -> Duration {
        Duration::from_micros(self.jitter_us)
    }
}

impl std::fmt::Display for LinkShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "delay {}us jitter {}us", self.delay_us, self.jitter_us)?;
        match self.rate_bps {
            0 => write!(f, " rate unlimited")?,
            r => write!(f, " rate {}", format_rate(r))?,
        }
        write!(f, " loss {}%", self.loss_ppm as f64 / 10_000.0)
    }
}

/// Parses a duration such as `100us`, `1ms`, `0.5ms`, `2s` (a bare number is µs).
pub fn parse_duration_us(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, scale) = [("us", 1.0), ("µs", 1.0), ("ms", 1e3), ("ns", 1e-3), ("s", 1e6)]
        .iter()
        .find_map(|(suffix, scale)| s.strip_suffix(suffix).map(|n| (n, *scale)))
        .unwrap_or((s, 1.0));
    let v: f64 = num.trim().parse().with_context(|| format!("'{s}' is not a duration (e.g. 100us, 1ms)"))?;
    if !(0.0..=10e6).contains(&(v * scale)) {
        bail!("'{s}': a link delay must be between 0 and 10 s");
    }
    Ok((v * scale).round() as u64)
}

/// Parses a rate such as `1gbit`, `100mbit`, `500kbit` (bits per second; `0` for none).
pub fn parse_rate(s: &str) -> Result<u64> {
    let lower = s.trim().to_ascii_lowercase();
    let (num, scale) = [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)]
        .iter()
        .find_map(|(suffix, scale)| lower.strip_suffix(suffix).map(|n| (n.to_string(), *scale)))
        .unwrap_or((lower.clone(), 1.0));
    let v: f64 = num.trim().parse().with_context(|| format!("'{s}' is not a rate (e.g. 1gbit, 100mbit)"))?;
    let bps = v * scale;
    if bps != 0.0 && !(8e3..=100e9).contains(&bps) {
        bail!("'{s}': a link rate must be between 8kbit and 100gbit (or 0 for none)");
    }
    Ok(bps as u64)
}

/// Parses a loss such as `0.1%` or `5%` into parts per million.
pub fn parse_loss_ppm(s: &str) -> Result<u32> {
    let num = s.trim().strip_suffix('%').with_context(|| format!("'{s}': give the loss in percent, e.g. 0.1%"))?;
    let v: f64 = num.trim().parse().with_context(|| format!("'{s}' is not a percentage"))?;
    if !(0.0..=50.0).contains(&v) {
        bail!("'{s}': a link loss must be between 0% and 50%");
    }
    Ok((v * 10_000.0).round() as u32)
}

fn format_rate(bps: u64) -> String {
    match bps {
        b if b >= 1_000_000_000 && b % 1_000_000 == 0 => format!("{}mbit", b / 1_000_000),
        b if b >= 1_000_000 => format!("{}kbit", b / 1_000),
        b => format!("{b}bit"),
    }
}

/// The rate in `tc`'s syntax.
pub(crate) fn tc_rate(bps: u64) -> String {
    format!("{}bit", bps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_parse() {
        assert_eq!(parse_duration_us("100us").unwrap(), 100);
        assert_eq!(parse_duration_us("1ms").unwrap(), 1000);
        assert_eq!(parse_duration_us("0.5ms").unwrap(), 500);
        assert_eq!(parse_duration_us("20").unwrap(), 20);
        assert!(parse_duration_us("fast").is_err());
        assert!(parse_duration_us("-1ms").is_err());
        assert_eq!(parse_rate("1gbit").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("100mbit").unwrap(), 100_000_000);
        assert_eq!(parse_rate("0").unwrap(), 0);
        assert!(parse_rate("1bit").is_err());
        assert_eq!(parse_loss_ppm("0.1%").unwrap(), 1000);
        assert_eq!(parse_loss_ppm("5%").unwrap(), 50_000);
        assert!(parse_loss_ppm("5").is_err());
        assert!(parse_loss_ppm("80%").is_err());
        let s = LinkShape { delay_us: 100, jitter_us: 20, rate_bps: 1_000_000_000, loss_ppm: 1000 };
        assert_eq!(s.to_string(), "delay 100us jitter 20us rate 1000mbit loss 0.1%");
    }
}
