//! What the commands share: errors and exit codes, output, the target consumer and its clients, one
//! read of the lease table, checkpoint writes, the shard listing and the checkpoints file.

pub mod error;
pub mod output;
pub mod positions;
pub mod rows;
pub mod shards;
pub mod snapshot;
pub mod target;
