//! The checkpoints file `reset --export` writes and `reset --from-file` reads (JSON; YAML is read too).

use std::path::Path;

use leasehold_worker::lease::{Checkpoint, Lease, LeaseKey};
use serde::{Deserialize, Serialize};

use crate::shared::error::{CliError, Result};

/// One shard's checkpoint in the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Position {
    /// Stream name.
    pub stream: String,
    /// Shard id.
    pub shard: String,
    /// `checkpoint` as the row stores it: a sequence number, `TRIM_HORIZON`, `LATEST`,
    /// `AT_TIMESTAMP:<ms>` or `SHARD_END`.
    pub checkpoint: String,
    /// `checkpoint_subsequence`, inside a KPL aggregate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_sequence: Option<u32>,
}

impl Position {
    /// The row key.
    pub fn key(&self) -> LeaseKey {
        LeaseKey::new(self.stream.as_str(), self.shard.as_str())
    }

    /// The checkpoint it names.
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        Checkpoint::from_attributes(&self.checkpoint, self.sub_sequence)
            .map_err(|e| CliError::Malformed(format!("{}:{}: {e}", self.stream, self.shard)))
    }
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Positions {
    /// The table they were exported from (informational).
    #[serde(default)]
    pub table: String,
    /// When (RFC 3339, informational).
    #[serde(default)]
    pub exported_at: String,
    /// One entry per shard.
    pub checkpoints: Vec<Position>,
}

impl Positions {
    /// The positions of `leases`.
    pub fn of(table: &str, leases: &[&Lease]) -> Self {
        Positions {
            table: table.to_string(),
            exported_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            checkpoints: leases
                .iter()
                .map(|l| Position {
                    stream: l.key.stream().to_string(),
                    shard: l.key.shard_id().to_string(),
                    checkpoint: l.checkpoint.attribute(),
                    sub_sequence: l.checkpoint.sub_sequence(),
                })
                .collect(),
        }
    }

    /// Writes the file (JSON).
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(|e| CliError::Service(e.to_string()))?;
        std::fs::write(path, text + "\n").map_err(|e| CliError::Usage(format!("cannot write {}: {e}", path.display())))
    }

    /// Reads a file written by [`save`](Self::save) (or the same shape in YAML), checking every entry.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::NotFound(format!("cannot read {}: {e}", path.display())))?;
        let positions: Positions = serde_yaml_ng::from_str(&text)
            .map_err(|e| CliError::Malformed(format!("{} is not a checkpoints file: {e}", path.display())))?;
        for position in &positions.checkpoints {
            position.checkpoint().map_err(|e| CliError::Malformed(format!("{}: {e}", path.display())))?;
        }
        Ok(positions)
    }
}
