//! The worker's Prometheus metrics (`/metrics`), shared by the coordinator, the shard readers and the
//! record runner.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::health::Health;

/// The label of a series counted by the policy applied (`records_exhausted`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PolicyLabels {
    policy: &'static str,
}

/// The label of a series counted by dead-letter destination.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DestinationLabels {
    destination: &'static str,
}

/// The labels of a dead letter sent cut: where to and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CutLabels {
    destination: &'static str,
    reason: &'static str,
}

/// The label of a series counted by reason (skipped user records, fan-out failures, finished windows).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    reason: String,
}

/// The label of a series counted by outcome (fan-out end checks).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabels {
    outcome: &'static str,
}

/// The label of a per-shard series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ShardLabels {
    shard: String,
}

/// The labels of a shard's lag series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LagLabels {
    stream: String,
    shard: String,
}

/// The labels of a handoff notice series: its event, and the reason only for refusals (so the other
/// events' series carry no empty `reason` label).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(crate) struct HandoffLabels {
    event: &'static str,
    reason: Option<&'static str>,
}

impl EncodeLabelSet for HandoffLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let mut labels = vec![("event", self.event)];
        labels.extend(self.reason.map(|reason| ("reason", reason)));
        labels.encode(encoder)
    }
}

/// The label set of a series counted by `reason`.
pub(crate) fn reason(reason: &str) -> ReasonLabels {
    ReasonLabels { reason: reason.to_string() }
}

fn shard_labels(shard: &str) -> ShardLabels {
    ShardLabels { shard: shard.to_string() }
}

fn lag_labels(stream: &str, shard: &str) -> LagLabels {
    LagLabels { stream: stream.to_string(), shard: shard.to_string() }
}

/// Every metric a worker exports, registered under the `leasehold_` prefix.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Records processed successfully.
    pub(crate) records_processed: Counter,
    /// Failed processing attempts (a record failing three times counts three).
    pub(crate) records_failed: Counter,
    /// Attempts retried in place after a failure.
    pub(crate) records_retried: Counter,
    /// Records whose attempts ran out, by what was done with them (`skip`, `requeue`, `deadLetter`).
    pub(crate) records_exhausted: Family<PolicyLabels, Counter>,
    /// Failed records given up at once, without retries, because they were older than
    /// `retry.maxRecordAge` (each also counted in `records_exhausted` under the policy applied).
    pub(crate) records_aged_out: Counter,
    /// Records passed over without processing because they do not match `filter` (checkpointed).
    pub(crate) records_filtered: Counter,
    /// Dead letters an on-failure destination refused or could not take, by destination (`sqs`,
    /// `s3`); each is retried until it is taken, the record's shard waiting meanwhile.
    pub(crate) dead_letter_failures: Family<DestinationLabels, Counter>,
    /// Dead letters sent cut (see `dispatch/letter.rs`), by `destination` (`kinesis`, `sqs`, `s3`) and
    /// `reason`: `too_large` (over the destination's limit, cut before sending), `refused` (the
    /// destination refused the whole letter as invalid).
    pub(crate) dead_letters_cut: Family<CutLabels, Counter>,
    /// Dead letters a destination refused as invalid even in their smallest cut form, by
    /// `destination`: given up for that destination (the others still get theirs).
    pub(crate) dead_letters_undeliverable: Family<DestinationLabels, Counter>,
    /// Records opening with the requeue header whose proof does not check (written by a producer, or
    /// under another key): processed as ordinary records, their bytes as they are.
    pub(crate) requeue_headers_rejected: Counter,
    /// Records being processed right now, over all shards.
    pub(crate) records_in_flight: Gauge,
    /// Leases this worker holds.
    pub(crate) leases_held: Gauge,
    /// Lease renewals that failed (each retried; the lease is lost when its deadline passes).
    pub(crate) renewals_failed: Counter,
    /// Leases this worker took over from a holder that stopped renewing them (not handed over).
    pub(crate) lease_takeovers: Counter,
    /// Leases this worker handed over to the worker that asked for them (cooperative handoff).
    pub(crate) lease_handoffs: Counter,
    /// Handoff notices (rows freed at shutdown, told to a peer), by `event`: `sent`, `unsent` (the
    /// peer did not take it; the scans find the rows), `received`, `taken` (a row noticed and taken),
    /// `refused` (with a `reason`: a notice, or a row of one, not taken).
    pub(crate) handoff_notices: Family<HandoffLabels, Counter>,
    /// Checkpoints written.
    pub(crate) checkpoints_written: Counter,
    /// Scans and membership heartbeats that could not use the lease table (retried with backoff).
    pub(crate) lease_table_failures: Counter,
    /// 1 while the lease table does not exist (deleted under the worker), else 0.
    pub(crate) lease_table_missing: Gauge,
    /// Records whose processing call has run longer than `lease.gracefulTimeout` and not returned.
    pub(crate) records_stuck: Gauge,
    /// Milliseconds behind the stream's tip at the last GetRecords or fan-out event, per shard.
    pub(crate) millis_behind_latest: Family<ShardLabels, Gauge>,
    /// How far behind this worker is on each shard it holds, in seconds, by `stream` and `shard`: the
    /// age of the oldest record read and not finished, or `millis_behind_latest` when larger.
    pub(crate) shard_lag_seconds: Family<LagLabels, crate::lease::LagGauge>,
    /// Each held shard's load as measured at this worker's last renewal or checkpoint of it (the
    /// figures it writes into the row), by `stream` and `shard`: records/s, bytes/s, busy ms/s. A
    /// worker's load is their sum. Busy time in seconds per second (the row's busy ms/s over 1000).
    pub(crate) shard_load_records: Family<LagLabels, Gauge>,
    pub(crate) shard_load_bytes: Family<LagLabels, Gauge>,
    pub(crate) shard_load_busy: Family<LagLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Records that open with the KPL magic bytes but are not readable aggregates, delivered whole.
    pub(crate) records_not_deaggregated: Counter,
    /// User records of aggregates left undelivered, by why (`outside_shard`: a KPL aggregate's user
    /// record hashing outside the shard, which the KPL puts again to the right shard).
    pub(crate) user_records_skipped: Family<ReasonLabels, Counter>,
    /// Fan-out subscriptions opened (SubscribeToShard answered).
    pub(crate) fanout_subscriptions: Counter,
    /// SubscribeToShard calls refused or failed, by reason (`resource_in_use`, `limit_exceeded`,
    /// `other`); each is retried with backoff.
    pub(crate) fanout_subscribe_failures: Family<ReasonLabels, Counter>,
    /// Subscriptions replaced by a new one, by why (`ended`: the service ended it, its 5-minute
    /// lifetime; `idle`: no event within `reader.subscriptionIdleTimeout`; `broken`: the event stream
    /// failed or the connection dropped).
    pub(crate) fanout_subscriptions_replaced: Family<ReasonLabels, Counter>,
    /// Shards given up (lease released) because no subscription delivered within a lease duration.
    pub(crate) fanout_shards_given_up: Counter,
    /// Checks of a quiet fan-out shard's end with one GetRecords, by outcome (`ended`: closed and read
    /// to its end, finished; `open`; `failed`).
    pub(crate) fanout_end_checks: Family<OutcomeLabels, Counter>,
    /// Stream consumers this worker registered (it found them absent).
    pub(crate) fanout_consumers_registered: Counter,
    /// GetRecords calls that timed out (each halves its shard's page limit, down to 10).
    pub(crate) get_records_timeouts: Counter,
    /// A shard's GetRecords page limit while shrunk below `maxRecords` after timeouts, per shard.
    pub(crate) get_records_limit: Family<ShardLabels, Gauge>,
    /// Window consumers (`spec.window`): records inside the window handed to the processor.
    pub(crate) window_records_replayed: Counter,
    /// Window consumers: records read that arrived before `window.start` (a child's older records),
    /// passed over unprocessed.
    pub(crate) window_records_before_start: Counter,
    /// Window consumers: shards finished, by `reason` (`past_end`: a record after `window.end` was
    /// read; `tip_passed`: nothing after `end` yet and the clock is past `end` + `tipSlack`;
    /// `shard_end`: the shard closed before either).
    pub(crate) window_shards_finished: Family<ReasonLabels, Counter>,
    /// Window consumers: 1 once every shard of the window is finished (the worker then exits 0).
    pub(crate) window_completed: Gauge,
    /// True while the coordinator runs (served as `/readyz`).
    ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut metrics = Self {
            registry: Registry::with_prefix("leasehold"),
            records_processed: Counter::default(),
            records_failed: Counter::default(),
            records_retried: Counter::default(),
            records_exhausted: Family::default(),
            records_aged_out: Counter::default(),
            records_filtered: Counter::default(),
            dead_letter_failures: Family::default(),
            dead_letters_cut: Family::default(),
            dead_letters_undeliverable: Family::default(),
            requeue_headers_rejected: Counter::default(),
            records_in_flight: Gauge::default(),
            leases_held: Gauge::default(),
            renewals_failed: Counter::default(),
            lease_takeovers: Counter::default(),
            lease_handoffs: Counter::default(),
            handoff_notices: Family::default(),
            checkpoints_written: Counter::default(),
            lease_table_failures: Counter::default(),
            lease_table_missing: Gauge::default(),
            records_stuck: Gauge::default(),
            millis_behind_latest: Family::default(),
            shard_lag_seconds: Family::default(),
            shard_load_records: Family::default(),
            shard_load_bytes: Family::default(),
            shard_load_busy: Family::default(),
            records_not_deaggregated: Counter::default(),
            user_records_skipped: Family::default(),
            fanout_subscriptions: Counter::default(),
            fanout_subscribe_failures: Family::default(),
            fanout_subscriptions_replaced: Family::default(),
            fanout_shards_given_up: Counter::default(),
            fanout_end_checks: Family::default(),
            fanout_consumers_registered: Counter::default(),
            get_records_timeouts: Counter::default(),
            get_records_limit: Family::default(),
            window_records_replayed: Counter::default(),
            window_records_before_start: Counter::default(),
            window_shards_finished: Family::default(),
            window_completed: Gauge::default(),
            ready: AtomicBool::new(false),
        };
        // Registered metrics share their storage with the fields above (they are handles).
        metrics.register_processing_and_leases();
        metrics.register_reading();
        metrics.register_window();
        metrics
    }
}

impl Metrics {
    /// Registers the series of window consumers (`spec.window`).
    fn register_window(&mut self) {
        self.registry.register(
            "window_records_replayed",
            "Window consumers: records inside the window handed to the processor",
            self.window_records_replayed.clone(),
        );
        self.registry.register(
            "window_records_before_start",
            "Window consumers: records read that arrived before window.start, passed over",
            self.window_records_before_start.clone(),
        );
        self.registry.register(
            "window_shards_finished",
            "Window consumers: shards finished, by reason (past_end, tip_passed, shard_end)",
            self.window_shards_finished.clone(),
        );
        self.registry.register(
            "window_completed",
            "Window consumers: 1 once every shard of the window is finished",
            self.window_completed.clone(),
        );
    }

    /// Counts a window shard finished for `reason`.
    pub(crate) fn window_shard_finished(&self, reason: &str) {
        self.window_shards_finished.get_or_create(&self::reason(reason)).inc();
    }

    /// Registers the series of processing records and of the lease table.
    fn register_processing_and_leases(&mut self) {
        self.registry.register("records_processed", "Records processed successfully", self.records_processed.clone());
        self.registry.register("records_failed", "Failed processing attempts", self.records_failed.clone());
        self.registry.register("records_retried", "Attempts retried in place", self.records_retried.clone());
        self.registry.register(
            "records_exhausted",
            "Records whose attempts ran out, by policy applied (skip, requeue, deadLetter)",
            self.records_exhausted.clone(),
        );
        self.registry.register(
            "records_aged_out",
            "Failed records given up without retries, older than retry.maxRecordAge",
            self.records_aged_out.clone(),
        );
        self.registry.register(
            "records_filtered",
            "Records passed over unprocessed because they do not match the filter",
            self.records_filtered.clone(),
        );
        self.registry.register(
            "dead_letter_failures",
            "Dead letters an on-failure destination (sqs, s3) did not take; retried, the shard waits",
            self.dead_letter_failures.clone(),
        );
        self.registry.register(
            "dead_letters_cut",
            "Dead letters sent cut (payload prefix, size and SHA-256), by destination and reason (too_large, refused)",
            self.dead_letters_cut.clone(),
        );
        self.registry.register(
            "dead_letters_undeliverable",
            "Dead letters a destination refused as invalid even in their smallest form; given up for it",
            self.dead_letters_undeliverable.clone(),
        );
        self.registry.register(
            "requeue_headers_rejected",
            "Records with a requeue header whose proof does not check, processed as ordinary records",
            self.requeue_headers_rejected.clone(),
        );
        self.registry.register("records_in_flight", "Records being processed now", self.records_in_flight.clone());
        self.registry.register("leases_held", "Leases this worker holds", self.leases_held.clone());
        self.registry.register("lease_renewals_failed", "Lease renewals that failed", self.renewals_failed.clone());
        self.registry.register(
            "lease_takeovers",
            "Leases taken over from a holder that stopped renewing them (not handed over)",
            self.lease_takeovers.clone(),
        );
        self.registry.register(
            "lease_handoffs",
            "Leases handed over to the worker that asked for them",
            self.lease_handoffs.clone(),
        );
        self.registry.register(
            "handoff_notices",
            "Handoff notices by event: sent, unsent (left to the scans), received, taken (a noticed row taken), refused (by reason)",
            self.handoff_notices.clone(),
        );
        self.registry.register("checkpoints_written", "Checkpoints written", self.checkpoints_written.clone());
        self.registry.register(
            "lease_table_failures",
            "Scans and heartbeats that could not use the lease table",
            self.lease_table_failures.clone(),
        );
        self.registry.register(
            "aws_credential_failures",
            "AWS calls refused because of the worker's credentials (expired, revoked, unknown), process-wide",
            crate::aws::credentials::failures(),
        );
        self.registry.register(
            "lease_table_missing",
            "1 while the lease table does not exist (the worker waits for it; it does not recreate it)",
            self.lease_table_missing.clone(),
        );
        self.registry.register(
            "records_stuck",
            "Records whose processing has run longer than lease.gracefulTimeout without returning",
            self.records_stuck.clone(),
        );
    }

    /// Registers the series of reading shards: behind latest, KPL, fan-out, GetRecords pages.
    fn register_reading(&mut self) {
        self.registry.register(
            "millis_behind_latest",
            "Milliseconds behind the tip at the last GetRecords or fan-out event, per shard",
            self.millis_behind_latest.clone(),
        );
        self.registry.register(
            "shard_lag_seconds",
            "Age of the oldest record read and not finished per shard, or millis_behind_latest when larger (seconds)",
            self.shard_lag_seconds.clone(),
        );
        self.registry.register(
            "shard_load_records_per_second",
            "Records per second arriving in each held shard (by their arrival timestamps: what the shard asks, even of a holder behind), as measured at its last renewal or checkpoint (a moving figure); the figure lease.balance: load weighs",
            self.shard_load_records.clone(),
        );
        self.registry.register(
            "shard_load_bytes_per_second",
            "Bytes of record data per second from each held shard, as measured at its last renewal or checkpoint",
            self.shard_load_bytes.clone(),
        );
        self.registry.register(
            "shard_load_busy_seconds_per_second",
            "Seconds per second the processor spent on each held shard's records (summed over records at once), as measured at its last renewal or checkpoint",
            self.shard_load_busy.clone(),
        );
        self.registry.register(
            "records_not_deaggregated",
            "Records with the KPL magic bytes that are not readable aggregates, delivered whole",
            self.records_not_deaggregated.clone(),
        );
        self.registry.register(
            "user_records_skipped",
            "User records of KPL aggregates not delivered, by reason (outside_shard)",
            self.user_records_skipped.clone(),
        );
        self.registry.register(
            "fanout_subscriptions",
            "Enhanced fan-out subscriptions opened",
            self.fanout_subscriptions.clone(),
        );
        self.registry.register(
            "fanout_subscribe_failures",
            "SubscribeToShard calls that failed, by reason (resource_in_use, limit_exceeded, other), retried with backoff",
            self.fanout_subscribe_failures.clone(),
        );
        self.registry.register(
            "fanout_subscriptions_replaced",
            "Fan-out subscriptions replaced, by reason (ended, idle, broken)",
            self.fanout_subscriptions_replaced.clone(),
        );
        self.registry.register(
            "fanout_shards_given_up",
            "Shards released because no fan-out subscription delivered within a lease duration",
            self.fanout_shards_given_up.clone(),
        );
        self.registry.register(
            "fanout_end_checks",
            "Checks of a quiet fan-out shard's end with GetRecords, by outcome (ended, open, failed)",
            self.fanout_end_checks.clone(),
        );
        self.registry.register(
            "fanout_consumers_registered",
            "Stream consumers this worker registered",
            self.fanout_consumers_registered.clone(),
        );
        self.registry.register(
            "get_records_timeouts",
            "GetRecords calls that timed out; each halves its shard's page limit (down to 10)",
            self.get_records_timeouts.clone(),
        );
        self.registry.register(
            "get_records_limit",
            "GetRecords page limit per shard, after timeouts shrank it (grows back to maxRecords)",
            self.get_records_limit.clone(),
        );
    }

    /// Counts a record whose attempts ran out and to which `policy` was applied.
    pub(crate) fn exhausted(&self, policy: &'static str) {
        self.records_exhausted.get_or_create(&PolicyLabels { policy }).inc();
    }

    /// How many records `policy` was applied to so far.
    #[cfg(test)]
    pub(crate) fn exhausted_count(&self, policy: &'static str) -> u64 {
        self.records_exhausted.get_or_create(&PolicyLabels { policy }).get()
    }

    /// Counts a dead letter `destination` did not take.
    pub(crate) fn dead_letter_failed(&self, destination: &'static str) {
        self.dead_letter_failures.get_or_create(&DestinationLabels { destination }).inc();
    }

    /// Counts a dead letter sent cut to `destination` for `reason`.
    pub(crate) fn dead_letter_cut(&self, destination: &'static str, reason: &'static str) {
        self.dead_letters_cut.get_or_create(&CutLabels { destination, reason }).inc();
    }

    /// Counts a dead letter `destination` refused in every form.
    pub(crate) fn dead_letter_undeliverable(&self, destination: &'static str) {
        self.dead_letters_undeliverable.get_or_create(&DestinationLabels { destination }).inc();
    }

    /// Counts `count` user records skipped for `reason`.
    pub(crate) fn skipped_user_records(&self, reason: &'static str, count: u64) {
        self.user_records_skipped.get_or_create(&self::reason(reason)).inc_by(count);
    }

    /// Counts a failed SubscribeToShard call.
    pub(crate) fn subscribe_failed(&self, reason: &'static str) {
        self.fanout_subscribe_failures.get_or_create(&self::reason(reason)).inc();
    }

    /// Counts a subscription replaced for `reason`.
    pub(crate) fn subscription_replaced(&self, reason: &'static str) {
        self.fanout_subscriptions_replaced.get_or_create(&self::reason(reason)).inc();
    }

    /// Counts a handoff notice `event` (see `handoff_notices`).
    pub(crate) fn handoff_noticed(&self, event: &'static str) {
        self.handoff_notices.get_or_create(&HandoffLabels { event, reason: None }).inc();
    }

    /// Counts a handoff notice (or a row of one) refused for `reason`.
    pub(crate) fn handoff_refused(&self, reason: &'static str) {
        self.handoff_notices.get_or_create(&HandoffLabels { event: "refused", reason: Some(reason) }).inc();
    }

    /// Counts a check of a quiet fan-out shard's end, by `outcome`.
    pub(crate) fn fanout_end_checked(&self, outcome: &'static str) {
        self.fanout_end_checks.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// Sets how far behind the tip `shard` was at its last read.
    pub(crate) fn behind(&self, shard: &str, millis: i64) {
        self.millis_behind_latest.get_or_create(&shard_labels(shard)).set(millis);
    }

    /// The lag gauge of `shard` of `stream`.
    pub fn shard_lag(&self, stream: &str, shard: &str) -> crate::lease::LagGauge {
        self.shard_lag_seconds.get_or_create(&lag_labels(stream, shard)).clone()
    }

    /// Forgets the lag and load series of `shard` of `stream` once this worker no longer reads it.
    pub fn forget_shard_lag(&self, stream: &str, shard: &str) {
        let labels = lag_labels(stream, shard);
        self.shard_lag_seconds.remove(&labels);
        self.shard_load_records.remove(&labels);
        self.shard_load_bytes.remove(&labels);
        self.shard_load_busy.remove(&labels);
    }

    /// The load gauges of `shard` of `stream`.
    pub fn shard_load(&self, stream: &str, shard: &str) -> crate::lease::LoadGauges {
        let labels = lag_labels(stream, shard);
        crate::lease::LoadGauges {
            records: self.shard_load_records.get_or_create(&labels).clone(),
            bytes: self.shard_load_bytes.get_or_create(&labels).clone(),
            busy: self.shard_load_busy.get_or_create(&labels).clone(),
        }
    }

    /// Sets `shard`'s GetRecords page limit.
    pub(crate) fn page_limit(&self, shard: &str, limit: i32) {
        self.get_records_limit.get_or_create(&shard_labels(shard)).set(i64::from(limit));
    }

    /// Forgets `shard`'s series once this worker no longer reads it.
    pub(crate) fn forget_shard(&self, shard: &str) {
        self.millis_behind_latest.remove(&shard_labels(shard));
        self.get_records_limit.remove(&shard_labels(shard));
    }

    /// Marks the worker ready (its coordinator runs) or not.
    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// True while the worker is ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// What the worker's `/metrics` and `/readyz` answer (see [`crate::health`]).
    pub fn health(self: &Arc<Self>) -> Health {
        let (encoding, readiness) = (self.clone(), self.clone());
        Health::new(
            move |out| prometheus_client::encoding::text::encode(out, &encoding.registry),
            move || readiness.is_ready(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One series of every labelled family, so the reference page can name their labels.
    fn with_every_series() -> Metrics {
        let metrics = Metrics::default();
        metrics.exhausted("skip");
        metrics.dead_letter_failed("sqs");
        metrics.dead_letter_cut("s3", "too_large");
        metrics.dead_letter_undeliverable("s3");
        metrics.skipped_user_records("outside_shard", 1);
        metrics.subscribe_failed("other");
        metrics.subscription_replaced("ended");
        metrics.handoff_noticed("sent");
        metrics.handoff_refused("stale");
        metrics.fanout_end_checked("open");
        metrics.behind("orders:shardId-0", 1);
        metrics.shard_lag("orders", "shardId-0");
        metrics.shard_load("orders", "shardId-0");
        metrics.page_limit("orders:shardId-0", 10);
        metrics
    }

    #[test]
    fn reference_page_of_the_worker_metrics_is_current() {
        use crate::reference::{check_or_write, generated_note, metric_families, metrics_markdown};
        let families = metric_families(&with_every_series().encode());
        let unseen: Vec<&str> = families.iter().filter(|f| f.samples == 0).map(|f| f.name.as_str()).collect();
        assert!(unseen.is_empty(), "give these families a series in with_every_series(): {unseen:?}");
        assert!(families.len() >= 30, "{families:?}");
        let page = format!(
            "# Worker metrics\n\n{}\n\
             Every metric a worker serves on `/metrics` (the `--metrics-addr` flag, port 9090 by default), \
             as its registry encodes it. The operator's are in [operator-metrics.md](operator-metrics.md).\n\n{}",
            generated_note("the worker's registry (`worker/src/metrics.rs`)"),
            metrics_markdown(&families)
        );
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference/worker-metrics.md");
        if let Err(e) = check_or_write(&path, &page) {
            panic!("{e}");
        }
    }

    #[test]
    fn encodes_prefixed_names_and_labels() {
        let metrics = Metrics::default();
        metrics.records_processed.inc_by(3);
        metrics.exhausted("skip");
        metrics.behind("orders:shardId-0", 42);
        metrics.records_not_deaggregated.inc();
        metrics.skipped_user_records("outside_shard", 4);
        let text = metrics.encode();
        assert!(text.contains("leasehold_records_not_deaggregated_total 1"), "{text}");
        assert!(text.contains("leasehold_user_records_skipped_total{reason=\"outside_shard\"} 4"), "{text}");
        assert!(text.contains("leasehold_records_processed_total 3"), "{text}");
        assert!(text.contains("leasehold_records_exhausted_total{policy=\"skip\"} 1"), "{text}");
        assert!(text.contains("leasehold_millis_behind_latest{shard=\"orders:shardId-0\"} 42"), "{text}");
        metrics.forget_shard("orders:shardId-0");
        assert!(!metrics.encode().contains("orders:shardId-0"));
        metrics.shard_load("orders", "shardId-1").busy.set(0.25);
        let text = metrics.encode();
        assert!(
            text.contains("leasehold_shard_load_busy_seconds_per_second{stream=\"orders\",shard=\"shardId-1\"} 0.25"),
            "{text}"
        );
        metrics.forget_shard_lag("orders", "shardId-1");
        assert!(!metrics.encode().contains("shardId-1"));
    }
}
