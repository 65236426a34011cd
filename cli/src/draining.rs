//! The draining mark on a worker's membership row (`member_draining`, docs/lease-protocol.md): while it
//! is there the worker takes no lease and hands every lease it holds to the others, who leave it out of
//! their fair shares.
//!
//! Both writes leave `lease_counter` alone: the counter is the worker's proof of life, moved only by its
//! heartbeat, so a mark never makes a dead worker look alive (nor delays its removal).

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use leasehold_worker::internals::lease::{MEMBER_PREFIX, attr};

use crate::error::{CliError, Result, sdk_message};
use crate::table::now_ms;
use crate::target::Target;

/// Marks `worker` draining, if its membership row exists (it is a member) and is not marked yet;
/// false when it already was.
pub async fn mark(target: &Target, worker: &str) -> Result<bool> {
    let result = target
        .dynamodb
        .update_item()
        .table_name(&target.table)
        .key(attr::LEASE_KEY, AttributeValue::S(format!("{MEMBER_PREFIX}{worker}")))
        .update_expression("SET #draining = if_not_exists(#draining, :since)")
        .condition_expression("lease_owner = :worker")
        .expression_attribute_names("#draining", attr::MEMBER_DRAINING)
        .expression_attribute_values(":since", AttributeValue::N(now_ms().to_string()))
        .expression_attribute_values(":worker", AttributeValue::S(worker.to_string()))
        .return_values(ReturnValue::UpdatedOld)
        .send()
        .await;
    match result {
        // The old value, when there was one, says the mark was already there (its time is kept).
        Ok(out) => Ok(out.attributes.is_none_or(|old| !old.contains_key(attr::MEMBER_DRAINING))),
        Err(e) => {
            let message = sdk_message(&e);
            if message.starts_with("ConditionalCheckFailed") {
                Err(CliError::NotFound(format!("worker {worker} has no membership row in {}: it left", target.name())))
            } else {
                Err(CliError::Service(format!("marking {worker} draining: {message}")))
            }
        }
    }
}

/// Removes `worker`'s draining mark; false when there was none (or no row: a worker that left takes
/// its mark with it).
pub async fn unmark(target: &Target, worker: &str) -> Result<bool> {
    let result = target
        .dynamodb
        .update_item()
        .table_name(&target.table)
        .key(attr::LEASE_KEY, AttributeValue::S(format!("{MEMBER_PREFIX}{worker}")))
        .update_expression("REMOVE #draining")
        .condition_expression("attribute_exists(#draining)")
        .expression_attribute_names("#draining", attr::MEMBER_DRAINING)
        .send()
        .await;
    match result {
        Ok(_) => Ok(true),
        Err(e) => {
            let message = sdk_message(&e);
            if message.starts_with("ConditionalCheckFailed") {
                Ok(false)
            } else {
                Err(CliError::Service(format!("removing {worker}'s draining mark: {message}")))
            }
        }
    }
}
