//! Stage 2, ensure table: the lease table exists (created and tagged when missing) and is ACTIVE
//! before any worker starts.

use kube::ResourceExt;
use kube::runtime::events::EventType;
use leasehold_crds::{ResolvedSpec, StreamConsumer};

use super::build;
use super::table::{self, Owner, TableState};
use crate::conditions::Verdict;
use crate::context::Context;
use crate::error::Result;

/// Where the table stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableReadiness {
    /// The `TableReady` verdict.
    pub verdict: Verdict,
    /// True when workers may start: the table is ACTIVE, or leases live in memory.
    pub ready: bool,
}

/// Describes (or creates) the table; an AWS error fails the stage. A PROVISIONED table is created with
/// the spec's capacity, else sized for `open_shards` (the last count, one shard before any count;
/// [`super::size_table`] resizes it once the shards are counted).
pub async fn ensure_table(
    consumer: &StreamConsumer,
    ctx: &Context,
    resolved: &ResolvedSpec,
    open_shards: Option<i32>,
) -> Result<TableReadiness> {
    let Some(spec) = &consumer.spec.lease_table else {
        let replicas = build::desired_replicas(&consumer.spec, None);
        let message = if replicas > 1 {
            "no leaseTable: each worker keeps leases in memory and reads every shard on its own"
        } else {
            "no leaseTable: the worker keeps leases in memory"
        };
        return Ok(TableReadiness { verdict: Verdict::ok("InMemory", message), ready: true });
    };
    let clients = ctx.aws.get(&consumer.spec.aws).await;
    let provisioned = super::size_table::wanted(consumer, ctx, resolved, spec, open_shards.unwrap_or(1));
    let (state, created) = table::ensure(&clients.dynamodb, spec, &Owner::of(consumer)?, provisioned).await?;
    if created {
        tracing::info!(consumer = %consumer.name_any(), table = spec.name, "lease table created");
        ctx.publish(consumer, EventType::Normal, "TableCreated", format!("created lease table {}", spec.name)).await;
    }
    Ok(match state {
        TableState::Active => TableReadiness {
            verdict: Verdict::ok("Active", format!("lease table {} is ACTIVE", spec.name)),
            ready: true,
        },
        TableState::Creating => TableReadiness {
            verdict: Verdict::failed("TableCreating", format!("lease table {} is being created", spec.name)),
            ready: false,
        },
        TableState::Other(status) => TableReadiness {
            verdict: Verdict::failed("TableNotActive", format!("lease table {} is {status}", spec.name)),
            ready: false,
        },
    })
}
