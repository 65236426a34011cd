//! Writing checkpoints into lease rows for `reset` and `import-kcl`: every write conditioned on what
//! the command read, in order, stopping at the first refusal with exactly what was and was not written.

use leasehold_worker::lease::{Checkpoint, DynamoLeaseStore, Lease, LeaseKey, NewLease, ShardLeases};

use crate::shared::error::{CliError, Result};

/// One row to write.
#[derive(Debug, Clone)]
pub struct RowWrite {
    /// The row's key.
    pub key: LeaseKey,
    /// The row as the command read it; `None`: there was none, and one is created if still absent.
    pub seen: Option<Lease>,
    /// The checkpoint to write.
    pub checkpoint: Checkpoint,
    /// The shard's parents, as the row is to have them.
    pub parents: Vec<String>,
}

/// Writes `rows` in order: a row read is replaced only if its counter is unchanged since, a row absent
/// is created only if still absent. Stops at the first refusal with the rows written and those not
/// (`hint` ends the message); returns the keys written.
pub async fn write_rows(store: &DynamoLeaseStore, rows: &[RowWrite], hint: &str) -> Result<Vec<String>> {
    let mut written: Vec<String> = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let new = NewLease {
            key: row.key.clone(),
            checkpoint: row.checkpoint.clone(),
            parent_shard_ids: row.parents.clone(),
            stream_created: row.seen.as_ref().and_then(|seen| seen.stream_created),
        };
        let result = match &row.seen {
            Some(seen) => store.replace(seen, &new).await.map_err(CliError::from),
            None => match store.create_if_absent(&new).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(CliError::Conflict(format!("lease {}: a row appeared since the read", row.key))),
                Err(e) => Err(e.into()),
            },
        };
        if let Err(error) = result {
            let rest: Vec<String> = rows[i..].iter().map(|r| r.key.to_string()).collect();
            let message = format!(
                "stopped at {}: {error}\n  written ({}): {}\n  not written: {}{hint}",
                row.key,
                written.len(),
                if written.is_empty() { "none".to_string() } else { written.join(", ") },
                rest.join(", ")
            );
            return Err(match error {
                CliError::Conflict(_) => CliError::Conflict(message),
                _ => CliError::Service(message),
            });
        }
        written.push(row.key.to_string());
    }
    Ok(written)
}
