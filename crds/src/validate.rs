//! Every rule a spec must keep, each error naming its field: the worker refuses to start on them and
//! the operator reports them in status. The CRD (schema and CEL rules in `spec.rs`) says the same
//! wherever it can, so the API server refuses such a spec first; `crds/tests/refused-specs.json` lists
//! the cases both must refuse (tested here and on a real API server by the operator's tests).

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use crate::resolved::{LagTarget, ResolvedDurations, ResolvedSpec, defaults};
use crate::spec::{StartPosition, StreamConsumerSpec};

/// One problem with a spec, naming the field it is in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// Path of the field, e.g. `spec.streams[1].name`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl FieldError {
    pub(crate) fn new(field: impl Into<String>, message: impl fmt::Display) -> Self {
        Self { field: field.into(), message: message.to_string() }
    }
}

fn duration(errors: &mut Vec<FieldError>, field: &str, value: Option<&String>, default: Duration) -> Duration {
    match value {
        None => default,
        Some(text) => match humantime::parse_duration(text) {
            Ok(d) if !d.is_zero() => d,
            Ok(_) => {
                errors.push(FieldError::new(field, "must be longer than zero"));
                default
            }
            Err(e) => {
                errors.push(FieldError::new(field, format!("{text:?} is not a duration like 10s or 500ms ({e})")));
                default
            }
        },
    }
}

/// True when what follows the seconds of a timestamp is an optional fraction, then `Z`, `+00:00` or
/// nothing (the CRD's pattern says the same; the time parser would ignore another offset after a
/// fraction).
fn utc_suffix(rest: &str) -> bool {
    let rest = match rest.strip_prefix('.') {
        Some(fraction) => {
            let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return false;
            }
            &fraction[digits..]
        }
        None => rest,
    };
    matches!(rest, "" | "Z" | "+00:00")
}

/// The most records one http request may carry (`processor.http.batch.maxRecords`): the schema's
/// range attribute names it, so the API server and the worker's check enforce it from there.
pub const MAX_HTTP_BATCH: i32 = 500;

/// True when `name` is `lengths` long and made of `a-z A-Z 0-9 _ - .` (the AWS naming rule of tables
/// and streams).
fn valid_aws_name(name: &str, lengths: std::ops::RangeInclusive<usize>) -> bool {
    lengths.contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

/// True for a stream ARN of the form the CRD schema requires ([`STREAM_ARN_PATTERN`](crate::STREAM_ARN_PATTERN)).
pub fn valid_stream_arn(arn: &str) -> bool {
    static PATTERN: std::sync::LazyLock<Option<regex::Regex>> =
        std::sync::LazyLock::new(|| regex::Regex::new(crate::spec::STREAM_ARN_PATTERN).ok());
    PATTERN.as_ref().is_some_and(|pattern| pattern.is_match(arn))
}

/// True for an SQS queue URL of the form the CRD schema requires: `http(s)://<host>/<account>/<name>`.
pub fn valid_queue_url(url: &str) -> bool {
    static PATTERN: std::sync::LazyLock<Option<regex::Regex>> =
        std::sync::LazyLock::new(|| regex::Regex::new(r"^https?://\S+/[0-9]+/[a-zA-Z0-9_-]{1,80}(\.fifo)?$").ok());
    PATTERN.as_ref().is_some_and(|pattern| pattern.is_match(url))
}

/// True for an S3 bucket name: 3-63 of `a-z 0-9 . -`, beginning and ending with a letter or digit.
pub fn valid_bucket_name(name: &str) -> bool {
    let edge = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    (3..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        && edge(name.as_bytes().first())
        && edge(name.as_bytes().last())
}

/// Exactly one of `shards`, `onDemand: true` (the shard count's range is the schema's: `bounds`).
fn check_shape(errors: &mut Vec<FieldError>, field: &str, shape: Option<crate::spec::CreateIfMissing>) {
    let Some(shape) = shape else { return };
    if shape.shards.is_some() == (shape.on_demand == Some(true)) {
        errors.push(FieldError::new(field, "set exactly one of shards, onDemand: true"));
    }
}

/// True for a valid DynamoDB table name: 3-255 of `a-z A-Z 0-9 _ - .`.
pub fn valid_table_name(name: &str) -> bool {
    valid_aws_name(name, 3..=255)
}

/// True for a valid Kinesis stream name: 1-128 of `a-z A-Z 0-9 _ - .`.
pub fn valid_stream_name(name: &str) -> bool {
    valid_aws_name(name, 1..=128)
}

/// True for a valid Kinesis stream consumer name: 1-128 of `a-z A-Z 0-9 _ - .`.
pub fn valid_consumer_name(name: &str) -> bool {
    valid_aws_name(name, 1..=128)
}

/// `text` made a valid Kinesis consumer name: every other character becomes `-`, and a name longer
/// than 128 keeps its first 111 characters and ends in `-` and 16 hex digits of a hash of the whole
/// (so two long names that share a prefix stay apart).
pub fn kinesis_consumer_name(text: &str) -> String {
    let cleaned: String =
        text.chars().map(|c| if c.is_ascii_alphanumeric() || "_-.".contains(c) { c } else { '-' }).collect();
    match cleaned.len() {
        0 => "leasehold".into(),
        1..=128 => cleaned,
        _ => {
            // FNV-1a: stable across versions and platforms, which std's hasher does not promise.
            let hash =
                text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
            format!("{}-{hash:016x}", &cleaned[..111])
        }
    }
}

/// The default consumer name of the StreamConsumer `namespace`/`name`: `<namespace>.<name>` (a
/// namespace holds no `.`, so no two resources share one), made valid by [`kinesis_consumer_name`].
pub fn default_consumer_name(namespace: &str, name: &str) -> String {
    kinesis_consumer_name(&format!("{namespace}.{name}"))
}

impl StreamConsumerSpec {
    /// The stream consumer name of a fan-out reader: `reader.consumerName`, else the default of the
    /// resource `namespace`/`name` when known (the operator), else the lease table's name (a lease
    /// table is one consumer group), else `leasehold`.
    pub fn consumer_name(&self, resource: Option<(&str, &str)>) -> String {
        if let Some(name) = &self.reader.consumer_name {
            return name.clone();
        }
        match (resource, &self.lease_table) {
            (Some((namespace, name)), _) => default_consumer_name(namespace, name),
            (None, Some(table)) => kinesis_consumer_name(&table.name),
            (None, None) => "leasehold".into(),
        }
    }

    /// Every problem with the spec, or the spec with its defaults applied.
    pub fn validate(&self) -> Result<ResolvedSpec, Vec<FieldError>> {
        let mut errors = Vec::new();
        self.check_streams(&mut errors);
        self.check_processor(&mut errors);
        self.check_workers(&mut errors);
        self.check_numbers(&mut errors);
        match serde_json::to_value(self) {
            Ok(spec) => crate::bounds::check(&spec, &mut errors),
            Err(e) => errors.push(FieldError::new("spec", format!("cannot be read as JSON: {e}"))),
        }
        crate::window::check(self, &mut errors);
        if let Some(table) = &self.lease_table
            && !valid_table_name(&table.name)
        {
            errors.push(FieldError::new(
                "spec.leaseTable.name",
                format!("{:?} is not a DynamoDB table name (3-255 of a-z, A-Z, 0-9, _, -, .)", table.name),
            ));
        }
        self.check_start_position(&mut errors);
        let durations = self.durations(&mut errors);
        let http = self.processor.http.as_ref();
        if durations.renew_interval >= durations.lease {
            errors.push(FieldError::new(
                "spec.lease.renewInterval",
                format!(
                    "must be shorter than lease.duration ({:?} >= {:?})",
                    durations.renew_interval, durations.lease
                ),
            ));
        }
        let lag_scaling = self.lag_target(&mut errors);
        let max_record_age = self
            .retry
            .as_ref()
            .and_then(|r| r.max_record_age.as_ref())
            .map(|age| duration(&mut errors, "spec.retry.maxRecordAge", Some(age), Duration::from_secs(1)));
        if !errors.is_empty() {
            return Err(errors);
        }
        // The checks above keep every number in range, so these conversions cannot fail.
        let retry = self.retry.as_ref();
        let count = |n: Option<i32>, default: usize| n.and_then(|n| usize::try_from(n).ok()).unwrap_or(default);
        Ok(ResolvedSpec {
            durations,
            max_records: self.reader.max_records.unwrap_or(defaults::MAX_RECORDS),
            deaggregate: self.reader.deaggregate.unwrap_or(defaults::DEAGGREGATE),
            mode: self.reader.mode.unwrap_or(defaults::READER_MODE),
            ordering: self.ordering.unwrap_or(defaults::ORDERING),
            concurrency: count(self.concurrency, defaults::CONCURRENCY),
            max_attempts: retry
                .and_then(|r| r.max_attempts)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(defaults::MAX_ATTEMPTS),
            on_exhausted: retry.and_then(|r| r.on_exhausted).unwrap_or(defaults::ON_EXHAUSTED),
            max_record_age,
            bisect: retry.and_then(|r| r.bisect).unwrap_or(false),
            http_batch_records: count(
                http.and_then(|h| h.batch.as_ref()).and_then(|b| b.max_records),
                defaults::HTTP_BATCH_RECORDS,
            ),
            lease_scan: self.lease.scan.unwrap_or(defaults::LEASE_SCAN),
            segment_rows: count(self.lease.segment_rows, defaults::SEGMENT_ROWS),
            lease_balance: self.lease.balance.unwrap_or(defaults::LEASE_BALANCE),
            lag_scaling,
        })
    }

    /// `workers.autoscaling.lag` resolved, with the rules its CEL checks repeated.
    fn lag_target(&self, errors: &mut Vec<FieldError>) -> Option<LagTarget> {
        let lag = self.workers.autoscaling.as_ref()?.lag.as_ref()?;
        let field = "spec.workers.autoscaling.lag";
        if self.lease_table.is_none() {
            errors.push(FieldError::new(
                field,
                "workers.autoscaling.lag needs leaseTable: the lag is read from the lease rows",
            ));
        }
        let target = duration(errors, &format!("{field}.target"), Some(&lag.target), Duration::ZERO);
        let scale_up_after = duration(
            errors,
            &format!("{field}.scaleUpAfter"),
            lag.scale_up_after.as_ref(),
            defaults::LAG_SCALE_UP_AFTER,
        );
        let scale_down_after = duration(
            errors,
            &format!("{field}.scaleDownAfter"),
            lag.scale_down_after.as_ref(),
            defaults::LAG_SCALE_DOWN_AFTER,
        );
        if scale_down_after < scale_up_after {
            errors.push(FieldError::new(
                format!("{field}.scaleDownAfter"),
                "scaleDownAfter must not be shorter than scaleUpAfter (workers would be removed faster than they are added)",
            ));
        }
        Some(LagTarget { target, scale_up_after, scale_down_after })
    }

    fn check_streams(&self, errors: &mut Vec<FieldError>) {
        let assigned = self.assignment.as_ref().is_some_and(|a| !a.shards.is_empty());
        match (self.streams.is_empty(), &self.stream_pattern) {
            (true, None) if !assigned => {
                errors.push(FieldError::new("spec.streams", "name at least one stream, or set streamPattern"))
            }
            (false, Some(_)) => {
                errors.push(FieldError::new("spec.streamPattern", "give streams or streamPattern, not both"))
            }
            _ => {}
        }
        let mut seen = HashSet::new();
        for (i, stream) in self.streams.iter().enumerate() {
            check_shape(errors, &format!("spec.streams[{i}].createIfMissing"), stream.create_if_missing);
            if stream.create_if_missing.is_some() && stream.name.is_none() {
                errors.push(FieldError::new(
                    format!("spec.streams[{i}].createIfMissing"),
                    "createIfMissing needs name: a stream is created in the consumer's own account",
                ));
            }
            match (&stream.name, &stream.arn) {
                (Some(_), Some(_)) | (None, None) => {
                    errors.push(FieldError::new(format!("spec.streams[{i}]"), "set exactly one of name, arn"));
                    continue;
                }
                (None, Some(given)) if !valid_stream_arn(given) => {
                    errors.push(FieldError::new(
                        format!("spec.streams[{i}].arn"),
                        format!(
                            "{given:?} is not a stream ARN (arn:<partition>:kinesis:<region>:<account>:stream/<name>)"
                        ),
                    ));
                    continue;
                }
                _ => {}
            }
            let field = if stream.name.is_some() { "name" } else { "arn" };
            let name = stream.stream_name();
            if !valid_stream_name(name) {
                errors.push(FieldError::new(
                    format!("spec.streams[{i}].{field}"),
                    format!("{name:?} is not a Kinesis stream name (1-128 of a-z, A-Z, 0-9, _, -, .)"),
                ));
            } else if !seen.insert(name) {
                errors.push(FieldError::new(
                    format!("spec.streams[{i}].{field}"),
                    format!(
                        "stream {name:?} is named twice; a worker reads a stream through one subscription, and \
                         lease keys are <stream name>:<shardId> (same-named streams of two accounts need two consumers)"
                    ),
                ));
            }
        }
        if let Some(assignment) = &self.assignment {
            let mut seen = HashSet::new();
            for (i, shard) in assignment.shards.iter().enumerate() {
                let field = format!("spec.assignment.shards[{i}]");
                match shard.split_once(':') {
                    Some((stream, id)) if valid_stream_name(stream) && !id.is_empty() => {
                        if !seen.insert(shard.as_str()) {
                            errors.push(FieldError::new(field, format!("{shard:?} is listed twice")));
                        }
                    }
                    _ => errors.push(FieldError::new(field, format!("{shard:?} is not <stream>:<shardId>"))),
                }
            }
        }
    }

    fn check_start_position(&self, errors: &mut Vec<FieldError>) {
        match (self.start_position, &self.start_timestamp) {
            (Some(StartPosition::AtTimestamp), None) => {
                errors.push(FieldError::new("spec.startTimestamp", "required with startPosition AT_TIMESTAMP"))
            }
            (Some(StartPosition::AtTimestamp), Some(ts))
                if humantime::parse_rfc3339_weak(ts).is_err() || !ts.get(19..).is_some_and(utc_suffix) =>
            {
                errors.push(FieldError::new("spec.startTimestamp", format!("{ts:?} is not an RFC 3339 time in UTC")))
            }
            (Some(StartPosition::AtTimestamp), Some(_)) => {}
            (_, Some(_)) => {
                errors.push(FieldError::new("spec.startTimestamp", "allowed only with startPosition AT_TIMESTAMP"))
            }
            _ => {}
        }
    }

    /// Every duration of the spec parsed, each error pushed and its default taken in its place.
    fn durations(&self, errors: &mut Vec<FieldError>) -> ResolvedDurations {
        let lease = &self.lease;
        let http = self.processor.http.as_ref();
        let d = ResolvedDurations::default();
        let mut parse = |field: &str, value: Option<&String>, default| duration(errors, field, value, default);
        ResolvedDurations {
            lease: parse("spec.lease.duration", lease.duration.as_ref(), d.lease),
            renew_interval: parse("spec.lease.renewInterval", lease.renew_interval.as_ref(), d.renew_interval),
            scan_interval: parse("spec.lease.scanInterval", lease.scan_interval.as_ref(), d.scan_interval),
            shard_sync_interval: parse(
                "spec.lease.shardSyncInterval",
                lease.shard_sync_interval.as_ref(),
                d.shard_sync_interval,
            ),
            checkpoint_interval: parse(
                "spec.lease.checkpointInterval",
                lease.checkpoint_interval.as_ref(),
                d.checkpoint_interval,
            ),
            graceful_timeout: parse("spec.lease.gracefulTimeout", lease.graceful_timeout.as_ref(), d.graceful_timeout),
            idle_time: parse("spec.reader.idleTime", self.reader.idle_time.as_ref(), d.idle_time),
            subscription_idle_timeout: parse(
                "spec.reader.subscriptionIdleTimeout",
                self.reader.subscription_idle_timeout.as_ref(),
                d.subscription_idle_timeout,
            ),
            retry_backoff: parse(
                "spec.retry.backoff",
                self.retry.as_ref().and_then(|r| r.backoff.as_ref()),
                d.retry_backoff,
            ),
            http_timeout: parse("spec.processor.http.timeout", http.and_then(|h| h.timeout.as_ref()), d.http_timeout),
            http_batch_max_delay: parse(
                "spec.processor.http.batch.maxDelay",
                http.and_then(|h| h.batch.as_ref()).and_then(|b| b.max_delay.as_ref()),
                d.http_batch_max_delay,
            ),
            multilang_timeout: parse(
                "spec.processor.multilang.timeout",
                self.processor.multilang.as_ref().and_then(|m| m.timeout.as_ref()),
                d.multilang_timeout,
            ),
        }
    }

    fn check_processor(&self, errors: &mut Vec<FieldError>) {
        let p = &self.processor;
        let kinds = [p.stdout.is_some(), p.http.is_some(), p.multilang.is_some(), p.custom.is_some()]
            .iter()
            .filter(|k| **k)
            .count();
        if kinds != 1 {
            errors.push(FieldError::new(
                "spec.processor",
                format!("set exactly one of stdout, http, multilang, custom ({kinds} set)"),
            ));
        }
        if let Some(multilang) = &p.multilang {
            match multilang.command.first() {
                None => errors.push(FieldError::new("spec.processor.multilang.command", "must not be empty")),
                Some(program) if program.is_empty() => errors.push(FieldError::new(
                    "spec.processor.multilang.command",
                    "the program (command[0]) must not be empty",
                )),
                Some(_) => {}
            }
        }
    }

    fn check_workers(&self, errors: &mut Vec<FieldError>) {
        if let Some(auto) = &self.workers.autoscaling {
            let min = auto.min_replicas.unwrap_or(1);
            if min > auto.max_replicas {
                errors.push(FieldError::new(
                    "spec.workers.autoscaling.minReplicas",
                    format!("must not exceed maxReplicas ({min} > {})", auto.max_replicas),
                ));
            }
        }
    }

    fn check_numbers(&self, errors: &mut Vec<FieldError>) {
        if let Some(name) = &self.reader.consumer_name
            && !valid_consumer_name(name)
        {
            errors.push(FieldError::new(
                "spec.reader.consumerName",
                format!("{name:?} is not a Kinesis consumer name (1-128 of a-z, A-Z, 0-9, _, -, .)"),
            ));
        }
        if let Some(output) = &self.output {
            check_shape(errors, "spec.output.createIfMissing", output.create_if_missing);
        }
        if let Some(filter) = &self.filter {
            if filter.patterns.is_empty() || filter.patterns.len() > 10 {
                errors.push(FieldError::new("spec.filter.patterns", "give 1 to 10 patterns"));
            }
            for (i, pattern) in filter.patterns.iter().enumerate() {
                if let Err(e) = crate::filter::Pattern::parse(pattern) {
                    errors.push(FieldError::new(format!("spec.filter.patterns[{i}]"), e));
                }
            }
        }
        if let Some(retry) = &self.retry {
            let dead_letter = retry.on_exhausted == Some(crate::spec::OnExhausted::DeadLetter);
            let destination = retry.dead_letter_stream.is_some()
                || retry.dead_letter_queue.is_some()
                || retry.dead_letter_bucket.is_some();
            if dead_letter && !destination {
                errors.push(FieldError::new(
                    "spec.retry.deadLetterStream",
                    "deadLetterStream, deadLetterQueue or deadLetterBucket is required with onExhausted deadLetter",
                ));
            }
            if let Some(queue) = &retry.dead_letter_queue
                && !valid_queue_url(queue)
            {
                errors.push(FieldError::new(
                    "spec.retry.deadLetterQueue",
                    format!("{queue:?} is not an SQS queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>)"),
                ));
            }
            if let Some(bucket) = &retry.dead_letter_bucket
                && !valid_bucket_name(&bucket.name)
            {
                errors.push(FieldError::new(
                    "spec.retry.deadLetterBucket.name",
                    format!("{:?} is not an S3 bucket name (3-63 of a-z, 0-9, ., -)", bucket.name),
                ));
            }
            let batched = self
                .processor
                .http
                .as_ref()
                .and_then(|h| h.batch.as_ref())
                .and_then(|b| b.max_records)
                .is_some_and(|n| n > 1);
            if retry.bisect == Some(true) && !batched {
                errors.push(FieldError::new(
                    "spec.retry.bisect",
                    "retry.bisect needs processor.http.batch.maxRecords above 1 (it splits http batches)",
                ));
            }
            if retry.dead_letter_stream_create_if_missing.is_some() && retry.dead_letter_stream.is_none() {
                errors.push(FieldError::new(
                    "spec.retry.deadLetterStreamCreateIfMissing",
                    "deadLetterStreamCreateIfMissing needs deadLetterStream",
                ));
            }
            check_shape(
                errors,
                "spec.retry.deadLetterStreamCreateIfMissing",
                retry.dead_letter_stream_create_if_missing,
            );
            let gives_up = retry.on_exhausted.is_some_and(|p| p != crate::spec::OnExhausted::Block);
            if retry.max_record_age.is_some() && !gives_up {
                errors.push(FieldError::new(
                    "spec.retry.maxRecordAge",
                    "maxRecordAge needs an onExhausted that gives a record up (requeue, deadLetter or skip)",
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> StreamConsumerSpec {
        serde_yaml_ng::from_str(yaml).expect("spec parses")
    }

    fn fields(yaml: &str) -> Vec<String> {
        spec(yaml).validate().expect_err("invalid").into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn the_design_example_is_valid_with_defaults() {
        let resolved = spec("streams: [{name: orders}]\nleaseTable: {name: orders-leases}\nprocessor: {stdout: {}}")
            .validate()
            .expect("valid");
        assert_eq!(resolved, ResolvedSpec::default());
        let durations = resolved.durations;
        assert_eq!(durations.lease, Duration::from_secs(10));
        assert_eq!(durations.renew_interval, Duration::from_secs(3));
        assert_eq!(durations.shard_sync_interval, Duration::from_secs(10));
    }

    #[test]
    fn each_rule_names_its_field() {
        let base = "processor: {stdout: {}}\n";
        assert_eq!(fields("processor: {stdout: {}}"), vec!["spec.streams"]);
        assert_eq!(fields(&format!("{base}streams: [{{name: a}}, {{name: a}}]")), vec!["spec.streams[1].name"]);
        assert_eq!(fields(&format!("{base}streams: [{{name: a}}]\nstreamPattern: x")), vec!["spec.streamPattern"]);
        assert_eq!(fields("streams: [{name: a}]\nprocessor: {}"), vec!["spec.processor"]);
        assert_eq!(fields("streams: [{name: a}]\nprocessor: {stdout: {}, http: {url: x}}"), vec!["spec.processor"]);
        assert_eq!(
            fields(&format!("{base}streams: [{{name: a}}]\nlease: {{duration: 2s, renewInterval: 3s}}")),
            vec!["spec.lease.renewInterval"]
        );
        assert_eq!(
            fields(&format!("{base}streams: [{{name: a}}]\nlease: {{duration: soon}}")),
            vec!["spec.lease.duration"]
        );
        assert_eq!(
            fields(&format!("{base}streams: [{{name: a}}]\nleaseTable: {{name: 'x'}}")),
            vec!["spec.leaseTable.name"]
        );
        assert_eq!(
            fields(&format!("{base}streams: [{{name: a}}]\nstartPosition: AT_TIMESTAMP")),
            vec!["spec.startTimestamp"]
        );
        assert_eq!(
            fields(&format!("{base}streams: [{{name: a}}]\nstartTimestamp: '2024-01-01T00:00:00Z'")),
            vec!["spec.startTimestamp"]
        );
        assert_eq!(
            fields(&format!(
                "{base}streams: [{{name: a}}]\nworkers: {{autoscaling: {{shardsPerWorker: 2, minReplicas: 5, maxReplicas: 2}}}}"
            )),
            vec!["spec.workers.autoscaling.minReplicas"]
        );
        assert_eq!(fields(&format!("{base}assignment: {{shards: [nocolon]}}")), vec!["spec.assignment.shards[0]"]);
        let http = |batch: &str| format!("streams: [{{name: a}}]\nprocessor: {{http: {{url: x, batch: {batch}}}}}");
        assert_eq!(fields(&http("{maxRecords: 0}")), vec!["spec.processor.http.batch.maxRecords"]);
        assert_eq!(fields(&http("{maxRecords: 501}")), vec!["spec.processor.http.batch.maxRecords"]);
        assert_eq!(fields(&http("{maxDelay: soon}")), vec!["spec.processor.http.batch.maxDelay"]);
        let reader = |reader: &str| format!("{base}streams: [{{name: a}}]\nreader: {reader}");
        assert_eq!(fields(&reader("{mode: fanOut, consumerName: 'a/b'}")), vec!["spec.reader.consumerName"]);
        assert_eq!(fields(&reader("{subscriptionIdleTimeout: 0s}")), vec!["spec.reader.subscriptionIdleTimeout"]);
    }

    #[test]
    fn fan_out_is_read_with_its_defaults() {
        let fan_out = spec("streams: [{name: a}]\nprocessor: {stdout: {}}\nreader: {mode: fanOut}");
        let resolved = fan_out.validate().expect("valid");
        assert_eq!(resolved.mode, crate::spec::ReaderMode::FanOut);
        assert_eq!(resolved.durations.subscription_idle_timeout, Duration::from_secs(10));
        assert_eq!(fan_out.consumer_name(Some(("team-a", "orders"))), "team-a.orders");
        assert_eq!(fan_out.consumer_name(None), "leasehold");
        let err = serde_yaml_ng::from_str::<StreamConsumerSpec>("processor: {}\nreader: {mode: fanout}")
            .expect_err("the mode is camelCase");
        assert!(err.to_string().contains("fanOut"), "{err}");
    }

    #[test]
    fn default_consumer_names_are_valid_and_distinct() {
        let long = "n".repeat(253);
        let a = default_consumer_name("ns", &long);
        let b = default_consumer_name("ns", &format!("{}x", &long[..252]));
        assert!(valid_consumer_name(&a) && valid_consumer_name(&b), "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(kinesis_consumer_name("a/b c"), "a-b-c");
    }

    #[test]
    fn http_batching_defaults_to_a_5ms_linger() {
        let spec = spec("streams: [{name: a}]\nprocessor: {http: {url: x, batch: {maxRecords: 500}}}");
        let resolved = spec.validate().expect("valid");
        assert_eq!(resolved.durations.http_batch_max_delay, Duration::from_millis(5));
        assert_eq!(resolved.http_batch_records, 500);
    }

    #[test]
    fn balance_defaults_to_count_and_load_is_selectable() {
        let resolved = spec("streams: [{name: a}]\nprocessor: {stdout: {}}").validate().expect("valid");
        assert_eq!(resolved.lease_balance, crate::LeaseBalance::Count);
        let resolved =
            spec("streams: [{name: a}]\nprocessor: {stdout: {}}\nlease: {balance: load}").validate().expect("valid");
        assert_eq!(resolved.lease_balance, crate::LeaseBalance::Load);
        assert!(
            serde_yaml_ng::from_str::<StreamConsumerSpec>(
                "streams: [{name: a}]\nprocessor: {stdout: {}}\nlease: {balance: cpu}"
            )
            .is_err()
        );
    }

    #[test]
    fn the_scan_mode_defaults_to_segmented_and_full_is_selectable() {
        let resolved = spec("streams: [{name: a}]\nprocessor: {stdout: {}}").validate().expect("valid");
        assert_eq!((resolved.lease_scan, resolved.segment_rows), (crate::LeaseScan::Segmented, 80));
        let resolved = spec("streams: [{name: a}]\nprocessor: {stdout: {}}\nlease: {scan: full, segmentRows: 20}")
            .validate()
            .expect("valid");
        assert_eq!((resolved.lease_scan, resolved.segment_rows), (crate::LeaseScan::Full, 20));
        assert_eq!(
            fields("streams: [{name: a}]\nprocessor: {stdout: {}}\nlease: {segmentRows: 0}"),
            vec!["spec.lease.segmentRows"]
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = serde_yaml_ng::from_str::<StreamConsumerSpec>("streams: [{name: a}]\nprocesor: {stdout: {}}")
            .expect_err("typo");
        assert!(err.to_string().contains("procesor"), "{err}");
    }
}
