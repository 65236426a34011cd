//! What the window tests share: times around a window's bounds, the records of a batch, and what the
//! stand-in kubelet's pods of one consumer delivered.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use leasehold_testkit::kinesis::numbered;
use leasehold_testkit::process::Delivery;

use super::kubelet::Kubelet;

/// Gap around a window's bounds: wider than any rounding of ApproximateArrivalTimestamp.
pub const GAP: Duration = Duration::from_millis(1500);

/// Now as RFC 3339 in UTC with milliseconds.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Every delivery of the pods of `consumer` (running, or stopped since).
pub fn deliveries_of(kubelet: &Kubelet, consumer: &str) -> Vec<Delivery> {
    // A pod scaled away is read once its process exited (a window's pods, scaled to zero).
    kubelet.wait_exited();
    let prefix = format!("{consumer}-workers-");
    let running = kubelet.running.lock().expect("running");
    let finished = kubelet.finished.lock().expect("finished");
    running
        .values()
        .chain(finished.iter())
        .filter(|w| w.owner.starts_with(&prefix))
        .flat_map(|w| w.deliveries())
        .collect()
}

/// How often each payload was delivered.
pub fn counts(deliveries: &[Delivery]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for d in deliveries {
        *counts.entry(d.data.clone()).or_default() += 1;
    }
    counts
}

/// The payloads of `records`, as the processor prints them.
pub fn payloads(records: &[(String, Vec<u8>)]) -> Vec<String> {
    records.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).collect()
}

/// 6 numbered records on each of 8 keys, numbered from `from`.
pub fn batch(from: u64) -> Vec<(String, Vec<u8>)> {
    (from..from + 6).flat_map(|n| (0..8).map(move |k| numbered(&format!("key-{k}"), n))).collect()
}
