//! `spec.window`: a bounded consumer that replays the records that arrived between two times, with a
//! lease table of its own, and finishes (docs/operations.md, "Replay").

use std::time::{Duration, UNIX_EPOCH};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::spec::{DeletionPolicy, ReaderMode, StreamConsumerSpec};
use crate::validate::FieldError;

/// The word `window.end` takes for "the resource's creation time" (the operator pins it).
pub const END_NOW: &str = "now";

/// Default of `window.tipSlack`: how far past `end` the wall clock must be, with nothing more to read,
/// before a shard with no record after `end` counts as finished.
pub const DEFAULT_TIP_SLACK: Duration = Duration::from_secs(5);

/// Schema pattern of `window.start`: the RFC 3339 forms `startTimestamp` takes.
const WINDOW_START_PATTERN: &str = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|\+00:00)?$";

/// Schema pattern of `window.end`: a time as `start`, or `now`.
const WINDOW_END_PATTERN: &str =
    r"^(now|[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|\+00:00)?)$";

/// A replay window: every shard is read from `AT_TIMESTAMP start` and finished at its first record that
/// arrived after `end` (or, with nothing after `end` yet, once the stream's tip has passed `end`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WindowSpec {
    /// First arrival time replayed (RFC 3339, UTC), inclusive.
    #[schemars(regex(pattern = WINDOW_START_PATTERN), length(max = 40))]
    pub start: String,
    /// Last arrival time replayed (RFC 3339, UTC), inclusive; or `now`: the resource's creation time
    /// (`metadata.creationTimestamp`, which the operator writes into the workers' config, so every
    /// restart agrees).
    #[schemars(regex(pattern = WINDOW_END_PATTERN), length(max = 40))]
    pub end: String,
    /// What happens to the window's lease table once the window is `Completed` (or the resource is
    /// deleted before): `Delete` (default) or `Retain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = crate::spec::field_doc_wins)]
    pub deletion_policy: Option<DeletionPolicy>,
    /// How far past `end` the wall clock must be, with nothing more to read on a shard, before that
    /// shard is finished (covers records still in flight at `end` and clock skew). Default 5s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tip_slack: Option<String>,
}

/// A window's bounds in epoch milliseconds, both inclusive, and its tip slack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowBounds {
    /// First arrival time replayed.
    pub start_ms: i64,
    /// Last arrival time replayed.
    pub end_ms: i64,
    /// See [`WindowSpec::tip_slack`].
    pub tip_slack: Duration,
}

/// The window's progress, as the operator reports it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WindowStatus {
    /// The window's start (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    /// The window's end as pinned (RFC 3339): `window.end`, or the creation time for `now`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    /// The lease table of the window (named by the operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// Shards finished (their rows at `SHARD_END`).
    #[serde(default)]
    pub finished_shards: i32,
    /// Shards with a row in the window's table.
    #[serde(default)]
    pub shards: i32,
    /// Records handed to the processor over every shard, as counted in the rows at checkpoints
    /// (`window_records`; repeats after a crash counted again). Absent until a worker wrote one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records_replayed: Option<i64>,
    /// The window's `deletionPolicy` as applied (`Delete` or `Retain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<String>,
    /// Each shard's progress (`<stream>:<shardId>` and its checkpoint), at most 100 listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub progress: Vec<WindowShardProgress>,
    /// True once every shard is finished; the workers are then scaled to zero.
    #[serde(default)]
    pub completed: bool,
    /// Whether the window's table was deleted after completion (`deletionPolicy: Delete`).
    #[serde(default)]
    pub table_deleted: bool,
}

/// One shard of a window.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WindowShardProgress {
    /// `<stream>:<shardId>`.
    pub shard: String,
    /// Its checkpoint (`SHARD_END` once finished): the last position processed.
    pub checkpoint: String,
    /// `reading` or `finished`.
    #[serde(default)]
    pub state: String,
    /// Records of this shard handed to the processor, as counted at its last checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<i64>,
    /// The worker holding it, while read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// Epoch milliseconds of an RFC 3339 time in UTC.
pub fn parse_time_ms(text: &str) -> Option<i64> {
    let time = humantime::parse_rfc3339_weak(text).ok()?;
    let ms = time.duration_since(UNIX_EPOCH).ok()?.as_millis();
    i64::try_from(ms).ok()
}

/// RFC 3339 (UTC, milliseconds) of epoch milliseconds.
pub fn format_time_ms(ms: i64) -> String {
    let ms = u64::try_from(ms).unwrap_or(0);
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// The lease table the operator names for the window consumer `namespace/name`:
/// `leasehold-window-<namespace>-<name>` (Kubernetes names fit DynamoDB's alphabet; cut at 255).
pub fn window_table_name(namespace: &str, name: &str) -> String {
    let mut table = format!("leasehold-window-{namespace}-{name}");
    table.truncate(255);
    table
}

impl WindowSpec {
    /// The bounds, with `now` read as `created_ms` (the resource's creation time); `None` for `now`
    /// without one, or a time that does not parse (validation reports those).
    pub fn bounds(&self, created_ms: Option<i64>) -> Option<WindowBounds> {
        let start_ms = parse_time_ms(&self.start)?;
        let end_ms = if self.end == END_NOW { created_ms? } else { parse_time_ms(&self.end)? };
        let tip_slack = match &self.tip_slack {
            Some(text) => humantime::parse_duration(text).ok()?,
            None => DEFAULT_TIP_SLACK,
        };
        Some(WindowBounds { start_ms, end_ms, tip_slack })
    }

    /// The deletion policy of the window's table (default `Delete`).
    pub fn table_policy(&self) -> DeletionPolicy {
        self.deletion_policy.unwrap_or(DeletionPolicy::Delete)
    }
}

/// The rules of `spec.window` (the CRD's CEL rules say the same for the API server).
pub(crate) fn check(spec: &StreamConsumerSpec, errors: &mut Vec<FieldError>) {
    let Some(window) = &spec.window else { return };
    let mut refuse = |field: &str, message: &str| {
        errors.push(FieldError { field: field.into(), message: message.into() });
    };
    if spec.start_position.is_some() || spec.start_timestamp.is_some() {
        refuse("spec.startPosition", "a window starts at window.start: leave startPosition and startTimestamp out");
    }
    if spec.assignment.as_ref().is_some_and(|a| !a.shards.is_empty()) {
        refuse("spec.assignment", "a window reads every shard of its streams: leave assignment out");
    }
    if spec.stream_pattern.is_some() {
        refuse("spec.streamPattern", "a window reads named streams: give streams, not streamPattern");
    }
    if spec.reader.mode == Some(ReaderMode::FanOut) {
        refuse("spec.reader.mode", "a window is read by polling: leave reader.mode fanOut out");
    }
    let start = parse_time_ms(&window.start).filter(|_| utc(&window.start));
    if start.is_none() {
        refuse("spec.window.start", "not an RFC 3339 time in UTC");
    }
    let end = match window.end.as_str() {
        END_NOW => None,
        text => {
            let end = parse_time_ms(text).filter(|_| utc(text));
            if end.is_none() {
                refuse("spec.window.end", "not an RFC 3339 time in UTC, nor `now`");
            }
            end
        }
    };
    if let (Some(start), Some(end)) = (start, end)
        && start >= end
    {
        refuse("spec.window.end", "must be later than window.start");
    }
    if let Some(slack) = &window.tip_slack
        && humantime::parse_duration(slack).is_err()
    {
        refuse("spec.window.tipSlack", "not a duration (5s, 500ms, 1m)");
    }
}

/// True when `text` has no zone or a UTC one (`Z`, `+00:00`).
fn utc(text: &str) -> bool {
    let rest = text.get(19..).unwrap_or_default();
    let rest = rest.trim_start_matches(|c: char| c == '.' || c.is_ascii_digit());
    matches!(rest, "" | "Z" | "+00:00")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: &str) -> StreamConsumerSpec {
        serde_yaml_ng::from_str(&format!("streams: [{{name: orders}}]\nprocessor: {{stdout: {{}}}}\n{extra}"))
            .expect("spec")
    }

    fn errors(extra: &str) -> Vec<String> {
        match spec(extra).validate() {
            Ok(_) => vec![],
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn a_window_is_read_to_bounds() {
        let s = spec("window: {start: '2026-12-03T14:00:00Z', end: '2026-12-03T15:00:00Z'}");
        let window = s.window.as_ref().expect("window");
        let bounds = window.bounds(None).expect("bounds");
        assert_eq!(bounds.end_ms - bounds.start_ms, 3_600_000);
        assert_eq!(bounds.tip_slack, DEFAULT_TIP_SLACK);
        assert!(errors("window: {start: '2026-12-03T14:00:00Z', end: '2026-12-03T15:00:00Z'}").is_empty());
    }

    #[test]
    fn now_is_the_creation_time() {
        let s = spec("window: {start: '2026-12-03T14:00:00Z', end: now, tipSlack: 2s}");
        let window = s.window.as_ref().expect("window");
        assert_eq!(window.bounds(None), None);
        let bounds = window.bounds(Some(1_800_000_000_000)).expect("bounds");
        assert_eq!(bounds.end_ms, 1_800_000_000_000);
        assert_eq!(bounds.tip_slack, Duration::from_secs(2));
        assert_eq!(window.table_policy(), DeletionPolicy::Delete);
    }

    #[test]
    fn start_must_come_before_end() {
        let errs = errors("window: {start: '2026-12-03T15:00:00Z', end: '2026-12-03T14:00:00Z'}");
        assert!(errs.iter().any(|e| e.contains("spec.window.end: must be later than window.start")), "{errs:?}");
        let errs = errors("window: {start: '2026-12-03T15:00:00+02:00', end: now}");
        assert!(errs.iter().any(|e| e.contains("spec.window.start")), "{errs:?}");
    }

    #[test]
    fn conflicting_start_or_assignment_is_refused() {
        let w = "window: {start: '2026-12-03T14:00:00Z', end: now}\n";
        let errs = errors(&format!("{w}startPosition: TRIM_HORIZON"));
        assert!(errs.iter().any(|e| e.contains("spec.startPosition: a window starts at window.start")), "{errs:?}");
        let errs = errors(&format!("{w}assignment: {{shards: ['orders:shardId-000000000000']}}"));
        assert!(errs.iter().any(|e| e.contains("spec.assignment")), "{errs:?}");
        let errs = errors(&format!("{w}reader: {{mode: fanOut}}"));
        assert!(errs.iter().any(|e| e.contains("spec.reader.mode")), "{errs:?}");
    }

    #[test]
    fn the_table_name_is_the_resources() {
        assert_eq!(window_table_name("shop", "orders-replay"), "leasehold-window-shop-orders-replay");
        assert_eq!(window_table_name("a", &"x".repeat(300)).len(), 255);
    }
}
