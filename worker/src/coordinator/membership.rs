//! Membership: this worker's heartbeat row, and the rows of silent members removed. Manual
//! assignment has no membership.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Coordinator;
use crate::lease::{LeaseStore, Member};
use crate::metrics::Metrics;

impl Coordinator {
    /// Deletes the membership rows of workers seen silent for a whole lease duration (crashed ones
    /// never leave), so rows do not pile up and every scan stops reading them. The delete is
    /// conditioned on the counter seen: a worker that beats again in between keeps its row, and of
    /// several workers removing the same row one succeeds. Members only: manual assignment has none.
    pub(super) async fn remove_silent_members(&mut self, members: &[Member]) {
        let me = self.owner().to_string();
        for member in members.iter().filter(|m| !m.alive && m.owner != me) {
            match self.store.remove_member(member).await {
                Ok(()) => {
                    tracing::info!(member = member.owner, "membership row of a silent worker removed");
                    self.announce("a silent worker removed").await;
                }
                Err(e) => tracing::debug!(member = member.owner, error = %e, "membership row not removed"),
            }
        }
    }
}

/// Writes this worker's membership row every `interval` until `stop`; a failed beat is counted and
/// logged, and the next one comes sooner.
pub(super) async fn beat(
    store: Arc<dyn LeaseStore>,
    interval: Duration,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut failing = false;
    loop {
        let next = match store.heartbeat().await {
            Ok(()) => {
                if failing {
                    tracing::info!("membership heartbeat written again");
                }
                failing = false;
                interval
            }
            Err(e) => {
                metrics.lease_table_failures.inc();
                if !failing {
                    tracing::warn!(error = %e, "membership heartbeat failed; retrying");
                }
                failing = true;
                interval / 3
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(next) => {}
        }
    }
}
