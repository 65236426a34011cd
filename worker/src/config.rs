//! The worker's configuration file: a YAML document holding a `StreamConsumer` spec.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use leasehold_crds::{FieldError, ResolvedSpec, StartPosition, StreamConsumerSpec};
use regex::Regex;

use crate::discovery::StreamSelection;
use crate::lease::{Checkpoint, LeaseKey};

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid spec document.
    #[error("invalid config {path}: {field}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Path of the offending field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The spec breaks one or more rules.
    #[error("invalid config {path}:\n{}", list(errors))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Every rule broken, each naming its field.
        errors: Vec<FieldError>,
    },
    /// A spec given as a value (not read from a file) breaks one or more rules.
    #[error("invalid spec:\n{}", list(errors))]
    InvalidSpec {
        /// Every rule broken, each naming its field.
        errors: Vec<FieldError>,
    },
}

fn list(errors: &[FieldError]) -> String {
    errors.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n")
}

/// A validated configuration with everything resolved: read from a YAML file ([`load`](Self::load)),
/// YAML text ([`parse`](Self::parse)) or a spec value ([`from_spec`](Self::from_spec)).
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The spec as written.
    pub(crate) spec: StreamConsumerSpec,
    /// Its settings, defaults applied.
    pub(crate) resolved: ResolvedSpec,
    /// Which streams (or shards) to read.
    pub(crate) selection: StreamSelection,
    /// The streams named by ARN: stream name -> ARN (their Kinesis calls pass `StreamARN`).
    pub(crate) stream_arns: HashMap<String, String>,
    /// Where shards without a checkpoint (and without parents) start.
    pub(crate) root_start: Checkpoint,
    /// The stream consumer of `reader.mode: fanOut`: `reader.consumerName`, else the lease table's
    /// name, else `leasehold` (the operator writes `reader.consumerName` for its workers).
    pub(crate) consumer_name: String,
    /// `spec.window`'s bounds: a bounded consumer (the root start is then `AT_TIMESTAMP start`).
    pub(crate) window: Option<leasehold_crds::WindowBounds>,
}

impl WorkerConfig {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        Self::parse(&text, path)
    }

    /// Parses and validates configuration text (`path` is only for messages).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let document = serde_yaml_ng::Deserializer::from_str(text);
        let spec: StreamConsumerSpec = serde_path_to_error::deserialize(document).map_err(|e| {
            let at = e.path().to_string();
            let message = e.into_inner().to_string();
            let mut field = if at == "." { "spec".to_string() } else { format!("spec.{at}") };
            // serde names a missing field only in its message; put it in the path too.
            if let Some(missing) = message.strip_prefix("missing field `").and_then(|m| m.split('`').next()) {
                field = format!("{field}.{missing}");
            }
            ConfigError::Parse { path: path.into(), field, message }
        })?;
        Self::from_spec(spec).map_err(|e| match e {
            ConfigError::InvalidSpec { errors } => ConfigError::Invalid { path: path.into(), errors },
            other => other,
        })
    }

    /// Validates `spec` (a `StreamConsumer`'s, or one built in code) and resolves its settings.
    pub fn from_spec(spec: StreamConsumerSpec) -> Result<Self, ConfigError> {
        let invalid = |errors| ConfigError::InvalidSpec { errors };
        let resolved = spec.validate().map_err(invalid)?;
        let selection = selection(&spec).map_err(|e| invalid(vec![e]))?;
        let root_start = match spec.start_position.unwrap_or(StartPosition::Latest) {
            StartPosition::Latest => Checkpoint::Latest,
            StartPosition::TrimHorizon => Checkpoint::TrimHorizon,
            StartPosition::AtTimestamp => {
                let text = spec.start_timestamp.as_deref().unwrap_or_default();
                let time = humantime::parse_rfc3339_weak(text).map_err(|e| {
                    invalid(vec![FieldError { field: "spec.startTimestamp".into(), message: e.to_string() }])
                })?;
                let ms = time.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
                Checkpoint::AtTimestamp(i64::try_from(ms).unwrap_or(i64::MAX))
            }
        };
        let window = match &spec.window {
            None => None,
            Some(window) => Some(window.bounds(None).ok_or_else(|| {
                invalid(vec![FieldError {
                    field: "spec.window.end".into(),
                    message: "`now` is pinned by the operator (to the resource's creation time); a worker's \
                              config needs a time"
                        .into(),
                }])
            })?),
        };
        let root_start = window.map_or(root_start, |w| Checkpoint::AtTimestamp(w.start_ms));
        let stream_arns =
            spec.streams.iter().filter_map(|s| Some((s.stream_name().to_string(), s.arn.clone()?))).collect();
        let consumer_name = spec.consumer_name(None);
        Ok(Self { spec, resolved, selection, stream_arns, root_start, consumer_name, window })
    }

    /// The spec as written.
    pub fn spec(&self) -> &StreamConsumerSpec {
        &self.spec
    }

    /// The spec's settings with defaults applied.
    pub fn resolved(&self) -> &ResolvedSpec {
        &self.resolved
    }

    /// The bounds of `spec.window`, for a bounded consumer.
    pub fn window(&self) -> Option<leasehold_crds::WindowBounds> {
        self.window
    }
}

fn selection(spec: &StreamConsumerSpec) -> Result<StreamSelection, FieldError> {
    if let Some(assignment) = spec.assignment.as_ref().filter(|a| !a.shards.is_empty()) {
        let keys = assignment.shards.iter().filter_map(|s| LeaseKey::parse(s)).collect();
        return Ok(StreamSelection::Assigned(keys));
    }
    if let Some(pattern) = &spec.stream_pattern {
        let regex = Regex::new(pattern).map_err(|e| FieldError {
            field: "spec.streamPattern".into(),
            message: format!("not a regular expression: {e}"),
        })?;
        return Ok(StreamSelection::Pattern(regex));
    }
    Ok(StreamSelection::Named(spec.streams.iter().map(|s| s.stream_name().to_string()).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<WorkerConfig, ConfigError> {
        WorkerConfig::parse(text, Path::new("worker.yaml"))
    }

    #[test]
    fn the_design_example_loads() {
        let config = parse(
            "streams: [{name: orders}]\naws: {region: us-east-1}\nleaseTable: {name: orders-leases}\n\
             workers: {replicas: 2}\nstartPosition: TRIM_HORIZON\nlease: {duration: 10s, renewInterval: 3s}\n\
             processor: {stdout: {}}\nordering: key\nconcurrency: 4\n",
        )
        .expect("valid");
        assert_eq!(config.root_start, Checkpoint::TrimHorizon);
        assert!(matches!(config.selection, StreamSelection::Named(ref names) if names == &["orders"]));
    }

    #[test]
    fn errors_name_the_field() {
        let err = parse("streams: [{name: orders}]\nprocessor: {stdout: {}}\nlease: {duration: 3}").unwrap_err();
        assert!(err.to_string().contains("spec.lease.duration"), "{err}");
        let err = parse("streams: [{name: orders}, {name: orders}]\nprocessor: {stdout: {}}").unwrap_err();
        assert!(err.to_string().contains("spec.streams[1].name"), "{err}");
        let err = parse("streams: [{name: orders}]\nprocessor: {stdout: {}}\nconcurency: 3").unwrap_err();
        assert!(err.to_string().contains("concurency"), "{err}");
        let err = parse("streamPattern: '('\nprocessor: {stdout: {}}").unwrap_err();
        assert!(err.to_string().contains("spec.streamPattern"), "{err}");
        let err = parse("streams: [{name: orders}]\nprocessor: {http: {url: 'http://x/', batch: {maxRecords: 501}}}")
            .unwrap_err();
        assert!(err.to_string().contains("spec.processor.http.batch.maxRecords: must be between 1 and 500"), "{err}");
        let err = parse("streams: [{name: orders}]\nprocessor: {http: {url: 'http://x/', batch: {maxRecord: 5}}}")
            .unwrap_err();
        assert!(
            err.to_string().contains("spec.processor.http.batch") && err.to_string().contains("maxRecord"),
            "{err}"
        );
    }

    #[test]
    fn http_batching_is_read() {
        let config = parse(
            "streams: [{name: orders}]\nprocessor: {http: {url: 'http://x/', batch: {maxRecords: 50, maxDelay: 20ms}}}",
        )
        .expect("valid");
        let batch = config.spec.processor.http.as_ref().and_then(|h| h.batch.as_ref()).expect("batch");
        assert_eq!(batch.max_records, Some(50));
        assert_eq!(config.resolved.durations.http_batch_max_delay, std::time::Duration::from_millis(20));
        assert_eq!(config.resolved.http_batch_records, 50);
    }

    #[test]
    fn fan_out_names_its_consumer() {
        let config = parse(
            "streams: [{name: orders}]\nleaseTable: {name: orders-leases}\nprocessor: {stdout: {}}\nreader: {mode: fanOut}",
        )
        .expect("valid");
        assert_eq!(config.resolved.mode, leasehold_crds::ReaderMode::FanOut);
        assert_eq!(config.consumer_name, "orders-leases");
        let err =
            parse("streams: [{name: orders}]\nprocessor: {stdout: {}}\nreader: {mode: fanOut, consumerName: 'a b'}")
                .unwrap_err();
        assert!(err.to_string().contains("spec.reader.consumerName"), "{err}");
    }

    #[test]
    fn a_spec_value_is_validated_as_a_file_is() {
        let spec: StreamConsumerSpec =
            serde_yaml_ng::from_str("streams: [{name: orders}, {name: orders}]\nprocessor: {stdout: {}}")
                .expect("spec");
        let err = WorkerConfig::from_spec(spec).unwrap_err();
        assert!(matches!(&err, ConfigError::InvalidSpec { .. }), "{err:?}");
        assert!(err.to_string().contains("spec.streams[1].name"), "{err}");
        let spec: StreamConsumerSpec =
            serde_yaml_ng::from_str("streams: [{name: orders}]\nprocessor: {stdout: {}}").expect("spec");
        let config = WorkerConfig::from_spec(spec).expect("valid");
        assert_eq!(config.spec().streams.len(), 1);
        assert_eq!(config.root_start, Checkpoint::Latest);
    }

    #[test]
    fn a_window_starts_at_its_start_and_needs_a_concrete_end() {
        let config = parse(
            "streams: [{name: orders}]\nprocessor: {stdout: {}}\n\
             window: {start: '2026-12-03T14:00:00Z', end: '2026-12-03T15:00:00Z'}",
        )
        .expect("valid");
        let window = config.window().expect("window");
        assert_eq!(config.root_start, Checkpoint::AtTimestamp(window.start_ms));
        let err = parse(
            "streams: [{name: orders}]\nprocessor: {stdout: {}}\nwindow: {start: '2026-12-03T14:00:00Z', end: now}",
        )
        .unwrap_err();
        assert!(err.to_string().contains("spec.window.end: `now` is pinned by the operator"), "{err}");
    }

    #[test]
    fn assignment_selects_exact_shards() {
        let config = parse("assignment: {shards: ['orders:shardId-000000000001']}\nprocessor: {stdout: {}}").unwrap();
        assert!(matches!(config.selection, StreamSelection::Assigned(ref keys) if keys.len() == 1));
    }
}
