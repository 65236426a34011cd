//! Memory (RSS) and open file descriptors of every worker process of a round, sampled while the
//! nemesis runs: every process stays under a cap, and a soak's stayers (never killed or stopped) grow
//! no more than a bound from the end of the warm-up to the end of the run.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_testkit::process::rss_mib;

use crate::cluster::Cluster;

/// One reading of one process.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Since the round started.
    pub at: Duration,
    /// Resident memory, MiB.
    pub rss_mib: f64,
    /// Open file descriptors.
    pub fds: usize,
}

/// Every incarnation's samples, by incarnation id, with whether its slot is a stayer.
pub type Samples = Arc<Mutex<BTreeMap<String, (bool, Vec<Sample>)>>>;

/// What a round allows.
pub struct Bounds {
    /// RSS of any process, MiB.
    pub rss_cap_mib: f64,
    /// Open descriptors of any process.
    pub fd_cap: usize,
    /// A stayer's RSS growth from its first sample after the warm-up to its last, MiB.
    pub rss_growth_mib: f64,
    /// A stayer's descriptor growth over the same span.
    pub fd_growth: usize,
    /// Samples before this (since the round started) are the warm-up.
    pub warm_up: Duration,
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Samples every running worker each `every` until `done` is set.
pub fn spawn_sampler(
    cluster: Arc<Cluster>,
    every: Duration,
    done: Arc<AtomicBool>,
    samples: Samples,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !done.load(Ordering::SeqCst) {
            for slot in &cluster.slots {
                let slot = slot.lock().await;
                let Some(incarnation) = &slot.current else { continue };
                let pid = incarnation.process.pid();
                let sample = Sample { at: cluster.start.elapsed(), rss_mib: rss_mib(pid), fds: open_fds(pid) };
                // A process that has just died reads as nothing.
                if sample.rss_mib > 0.0 {
                    let mut all = samples.lock().expect("samples");
                    all.entry(incarnation.id.clone()).or_insert_with(|| (slot.stayer, Vec::new())).1.push(sample);
                }
            }
            tokio::time::sleep(every).await;
        }
    })
}

/// The round's figures, and every bound broken.
pub fn judge(samples: &Samples, bounds: &Bounds) -> (String, Vec<String>) {
    let all = samples.lock().expect("samples");
    let mut violations = Vec::new();
    let (mut peak_rss, mut peak_fds, mut count) = ((0.0f64, String::new()), (0usize, String::new()), 0);
    let mut stayers = Vec::new();
    for (id, (stayer, list)) in all.iter() {
        count += list.len();
        for s in list {
            if s.rss_mib > peak_rss.0 {
                peak_rss = (s.rss_mib, id.clone());
            }
            if s.fds > peak_fds.0 {
                peak_fds = (s.fds, id.clone());
            }
            if s.rss_mib > bounds.rss_cap_mib {
                violations
                    .push(format!("{id}: RSS {:.1} MiB at {:?} (cap {} MiB)", s.rss_mib, s.at, bounds.rss_cap_mib));
            }
            if s.fds > bounds.fd_cap {
                violations.push(format!("{id}: {} fds at {:?} (cap {})", s.fds, s.at, bounds.fd_cap));
            }
        }
        if !stayer {
            continue;
        }
        let warm: Vec<&Sample> = list.iter().filter(|s| s.at >= bounds.warm_up).collect();
        let (Some(first), Some(last)) = (warm.first(), warm.last()) else {
            violations.push(format!("stayer {id}: not sampled after the warm-up"));
            continue;
        };
        let rss_peak = list.iter().map(|s| s.rss_mib).fold(0.0, f64::max);
        let fd_peak = list.iter().map(|s| s.fds).max().unwrap_or(0);
        stayers.push(format!(
            "stayer {id}: RSS {:.1} -> {:.1} MiB (peak {rss_peak:.1}), fds {} -> {} (peak {fd_peak}), {} samples over {:?}",
            first.rss_mib,
            last.rss_mib,
            first.fds,
            last.fds,
            warm.len(),
            last.at.saturating_sub(first.at)
        ));
        if last.rss_mib - first.rss_mib > bounds.rss_growth_mib {
            violations.push(format!(
                "stayer {id}: RSS grew {:.1} MiB after the warm-up (bound {} MiB)",
                last.rss_mib - first.rss_mib,
                bounds.rss_growth_mib
            ));
        }
        if last.fds > first.fds + bounds.fd_growth {
            violations.push(format!(
                "stayer {id}: fds {} -> {} after the warm-up (bound +{})",
                first.fds, last.fds, bounds.fd_growth
            ));
        }
    }
    let mut summary = format!(
        "usage: {} processes, {count} samples, peak RSS {:.1} MiB ({}), peak fds {} ({})",
        all.len(),
        peak_rss.0,
        peak_rss.1,
        peak_fds.0,
        peak_fds.1
    );
    for line in stayers {
        summary.push_str("; ");
        summary.push_str(&line);
    }
    (summary, violations)
}
