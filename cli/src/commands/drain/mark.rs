//! The draining mark on a worker's membership row (`member_draining`, docs/lease-protocol.md): while it
//! is there the worker takes no lease and hands every lease it holds to the others, who leave it out of
//! their fair shares.
//!
//! Both writes leave `lease_counter` alone: the counter is the worker's proof of life, moved only by its
//! heartbeat, so a mark never makes a dead worker look alive (nor delays its removal).

use leasehold_worker::lease::{GroupRows, LeaseError};

use crate::shared::error::{CliError, Result};
use crate::shared::target::Target;

/// Marks `worker` draining, if its membership row exists (it is a member) and is not marked yet;
/// false when it already was.
pub async fn mark(target: &Target, worker: &str) -> Result<bool> {
    match target.store("leasehold-cli").mark_draining(worker).await {
        Ok(marked) => Ok(marked),
        Err(LeaseError::ConditionFailed { .. }) => {
            Err(CliError::NotFound(format!("worker {worker} has no membership row in {}: it left", target.name())))
        }
        Err(e) => Err(CliError::Service(format!("marking {worker} draining: {e}"))),
    }
}

/// Removes `worker`'s draining mark; false when there was none (or no row: a worker that left takes
/// its mark with it).
pub async fn unmark(target: &Target, worker: &str) -> Result<bool> {
    target
        .store("leasehold-cli")
        .unmark_draining(worker)
        .await
        .map_err(|e| CliError::Service(format!("removing {worker}'s draining mark: {e}")))
}
