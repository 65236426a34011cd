//! The formulas of docs/guides/lease-timings.md, computed from the code's defaults
//! (`leasehold_crds::defaults`) and checked against the measured figures of docs/benchmarks.md and its
//! data file docs/plots/data/benchmarks.json: a changed default, a changed formula or a new figure that
//! disagrees fails here.

use leasehold_crds::defaults;
use serde_json::Value;

const HOUR: f64 = 3600.0;
/// A lease row as the scale bench measured it (docs/benchmarks-archive.md: 163–165 B on average).
const MEASURED_ROW_BYTES: f64 = 165.0;
/// DynamoDB's read unit: a strongly consistent read of up to 4 KB.
const READ_UNIT_BYTES: f64 = 4096.0;

fn repo_file(path: &str) -> String {
    let full = format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}

fn data() -> Value {
    serde_json::from_str(&repo_file("docs/plots/data/benchmarks.json")).expect("benchmarks.json parses")
}

fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

/// Crash failover: the survivor sees the victim's last counter within a scan of its last renewal, which
/// came at most a renew interval before the crash, and takes the lease a lease duration after seeing it.
fn failover_bounds() -> (f64, f64) {
    let duration = secs(defaults::LEASE_DURATION);
    (duration - secs(defaults::RENEW_INTERVAL), duration + secs(defaults::SCAN_INTERVAL))
}

/// Write units per shard-hour at rest: a renewal per held lease and a heartbeat per worker every renew
/// interval, one unit each (rows are far below 1 KB).
fn writes_at_rest(workers: f64, shards: f64) -> f64 {
    HOUR / secs(defaults::RENEW_INTERVAL) * (1.0 + workers / shards)
}

/// Write units per second of one busy shard: its renewals plus a checkpoint every checkpoint interval.
fn busy_shard_writes_per_second() -> f64 {
    1.0 / secs(defaults::RENEW_INTERVAL) + 1.0 / secs(defaults::CHECKPOINT_INTERVAL)
}

/// Segmented reads per shard-hour, lease rows only: two readers of every row, a scan interval apart.
fn segmented_reads_floor() -> f64 {
    2.0 * MEASURED_ROW_BYTES / READ_UNIT_BYTES * HOUR / secs(defaults::SCAN_INTERVAL)
}

/// The KCL 2's lease taker: every worker scans the whole table every `(failover + epsilon) x 2`
/// (DynamoDBLeaseCoordinator, failoverTimeMillis 10,000, epsilonMillis 25), each Scan rounded up to
/// whole read units.
fn kcl2_reads(workers: f64, shards: f64) -> f64 {
    let scans_per_hour = HOUR / ((10.000 + 0.025) * 2.0);
    workers * scans_per_hour * (shards * MEASURED_ROW_BYTES / READ_UNIT_BYTES).ceil() / shards
}

#[test]
fn crash_failover_figures_lie_within_the_bound_of_the_defaults() {
    let (low, high) = failover_bounds();
    assert_eq!((low, high), (7.0, 10.5), "the guide states 7–10.5 s at the defaults");
    let measured = &data()["runtime_failover_handoff"]["failover kill -9"];
    let (min, max) = (measured["min"].as_f64().unwrap(), measured["max"].as_f64().unwrap());
    assert!(min >= low, "fastest failover {min} s beats duration - renewInterval = {low} s");
    assert!(max <= high, "slowest failover {max} s exceeds duration + scanInterval = {high} s");
    // The table of docs/benchmarks.md ("Failover, handoff, rebalance") quotes its own run's maximum.
    let page = repo_file("docs/benchmarks.md");
    let section = page.split("### Failover, handoff, rebalance").nth(1).expect("the failover section");
    let row = section.lines().find(|l| l.starts_with("| `kill -9`")).expect("the kill -9 row");
    let quoted: f64 = row
        .split("max ")
        .nth(1)
        .and_then(|rest| rest.split(" s").next())
        .map(|n| n.trim_start_matches("**").parse().expect("a number"))
        .expect("max N s in the row");
    assert!((low..=high).contains(&quoted), "benchmarks.md's max {quoted} s is outside {low}–{high} s");
}

#[test]
fn writes_at_rest_match_renewals_and_heartbeats() {
    let scale = &data()["scale"];
    let fleet = scale["fleet"].as_array().unwrap();
    let writes = scale["segmented"]["write_units_rest"].as_array().unwrap();
    for (size, measured) in fleet.iter().zip(writes) {
        let (w, s) = (size[0].as_f64().unwrap(), size[1].as_f64().unwrap());
        let (formula, measured) = (writes_at_rest(w, s), measured.as_f64().unwrap());
        // Never above the formula (a few term and change-row writes aside); at 100 x 1,000 the saturated
        // emulator timed some renewals out, so only the smaller fleets must come close to it.
        assert!(measured <= formula * 1.02, "{w} x {s}: {measured} write units, formula {formula}");
        if s <= 500.0 {
            assert!(measured >= formula * 0.97, "{w} x {s}: {measured} write units, formula {formula}");
        }
    }
    assert!((writes_at_rest(10.0, 100.0) - 1320.0).abs() < 1e-6, "the guide states 1,320 at 10 shards a worker");
    // What a busy shard asks of a provisioned table: 1.33 write units a second.
    assert!((busy_shard_writes_per_second() - 4.0 / 3.0).abs() < 1e-9);
}

#[test]
fn segmented_reads_at_rest_stay_between_the_lease_rows_and_the_renewal_budget() {
    let scale = &data()["scale"];
    let budget = HOUR / secs(defaults::RENEW_INTERVAL);
    assert_eq!(budget, scale["renewal_writes_target"].as_f64().unwrap());
    let floor = segmented_reads_floor();
    for measured in scale["segmented"]["read_units_rest"].as_array().unwrap() {
        let measured = measured.as_f64().unwrap();
        assert!((floor..=budget).contains(&measured), "{measured} read units outside {floor:.0}–{budget}");
    }
}

#[test]
fn the_kcl2_column_is_its_formula() {
    let scale = &data()["scale"];
    let fleet = scale["fleet"].as_array().unwrap();
    let column = scale["kcl2_arithmetic"]["read_units"].as_array().unwrap();
    for (size, figure) in fleet.iter().zip(column) {
        let (w, s) = (size[0].as_f64().unwrap(), size[1].as_f64().unwrap());
        assert_eq!(kcl2_reads(w, s).round(), figure.as_f64().unwrap(), "KCL 2 reads at {w} x {s}");
    }
    let renewals = HOUR / (10.000 / 3.0 - 0.025);
    assert_eq!(renewals.round(), scale["kcl2_arithmetic"]["write_units"][0].as_f64().unwrap());
}
