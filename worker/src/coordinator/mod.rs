//! The coordinator: one per worker. It scans the lease table, takes free and expired leases, balances by
//! cooperative handoff, renews what it holds, runs a reader per held shard, and gives everything back on
//! shutdown.
//!
//! Every scan is one pass of read -> plan -> act ([`Coordinator::tick`]), and the files follow it:
//! - `mode.rs`: the modes (full, segmented, manual assignment) as types, and this worker's share;
//! - `read.rs`: reading the table as the mode says, and taking in what a read shows;
//! - `plan.rs`: this worker's moves from what was read (the pure planners are `balance.rs`, by count,
//!   and `load_balance.rs`, by measured load);
//! - `act.rs`: carrying the moves out (take, ask, hand over) and telling the group;
//! - `readers.rs`: a shard's reader started on a lease taken and answered when it ends;
//! - `membership.rs`: the heartbeat, silent members removed;
//! - `shutdown.rs`: finishing, checkpointing and releasing everything at the end;
//! - `segmented/`: what `scan: segmented` keeps and decides (pure), its reads, plan and acts;
//! - `notices.rs`: handoff notices between peers; `outage.rs`: backing off a table that fails;
//!   `source.rs`: where shards are listed and read.

mod act;
pub(crate) mod balance;
mod load_balance;
mod membership;
mod mode;
mod notices;
mod outage;
mod plan;
mod read;
mod readers;
mod segmented;
mod shutdown;
mod source;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::dispatch::RecordRunner;
use crate::lease::{HeldLease, LeaseKey, LeasePage, LeaseStore};
use crate::metrics::Metrics;
use crate::processor::ProcessorFactory;
use crate::shard::{ReaderSettings, ShardExit};
use load_balance::LoadState;
pub use load_balance::{Balance, LoadTuning};
use membership::beat;
pub use mode::Mode;
use mode::{Role, Share};
pub use notices::HandoffInbox;
use notices::Handoffs;
pub use notices::{
    HandoffNotice, HandoffSecret, MAX_BODY_BYTES, MAX_NOTICE_AGE, MAX_NOTICE_KEYS, NOTICE_PATH, Refusal,
    SIGNATURE_HEADER, SecretError, now_ms, parse_notice, sign_notice, verify_notice,
};
#[cfg(feature = "cli")]
pub use notices::{inbox, route as notice_route, server_limits as notice_server_limits};
use outage::TableOutage;
pub(crate) use source::{KinesisShards, ShardSource};

/// Coordinator timing and mode.
#[derive(Debug, Clone)]
pub struct CoordinatorSettings {
    /// How often held leases are renewed (and the membership row beats).
    pub renew_interval: Duration,
    /// How often the table is read to take, ask for and give leases.
    pub scan_interval: Duration,
    /// How often the shard list is refreshed.
    pub shard_sync_interval: Duration,
    /// How long shards may take to finish in-flight records when given up.
    pub graceful_timeout: Duration,
    /// How long a handoff request is waited on before it may be made again.
    pub handoff_timeout: Duration,
    /// Shard reading.
    pub reader: ReaderSettings,
    /// What this worker is in its group, and how it reads the table.
    pub mode: Mode,
    /// Whether the group shares its leases by count or by measured load (`lease.balance`).
    pub balance: Balance,
}

/// A shard being read by this worker.
struct Running {
    held: Arc<HeldLease>,
    stop: CancellationToken,
    give_to: Option<String>,
    reader: JoinHandle<()>,
}

/// Runs one worker's share of a consumer group.
pub struct Coordinator {
    store: Arc<dyn LeaseStore>,
    shards: Arc<dyn ShardSource>,
    runner: Arc<RecordRunner>,
    /// The worker's metrics, which the coordinator and its readers count into.
    metrics: Arc<Metrics>,
    processors: Arc<dyn ProcessorFactory>,
    settings: CoordinatorSettings,
    running: HashMap<LeaseKey, Running>,
    requested: HashMap<LeaseKey, Instant>,
    exits_tx: mpsc::UnboundedSender<(LeaseKey, ShardExit)>,
    exits_rx: mpsc::UnboundedReceiver<(LeaseKey, ShardExit)>,
    reported_malformed: HashSet<String>,
    outage: TableOutage,
    next_sync: Instant,
    /// When the soonest lease seen held by another worker could count as expired: scanned then rather
    /// than at the next regular tick, so failover does not wait out a scan interval.
    next_expiry: Option<Instant>,
    /// When to scan again before the next regular tick: soon after taking rows their holder freed, as
    /// a holder's releases come in a burst that a scan may have cut in two.
    rescan_at: Option<Instant>,
    /// This worker's fair share as last planned.
    share: Share,
    /// The mode, with what it keeps between scans.
    role: Role,
    /// Handoff notices taken and sent (see `notices.rs`).
    handoffs: Handoffs,
    /// What `lease.balance: load` remembers between scans.
    load: LoadState,
}

/// One read of the table: the rows read now, and whether they are the whole table.
struct Read {
    page: LeasePage,
    whole: bool,
}

impl Coordinator {
    /// A coordinator over `store`, listing and reading shards through `shards`, making each held
    /// shard's processor with `processors` and running its records with `runner`, counting into
    /// `metrics`.
    pub(crate) fn new(
        store: Arc<dyn LeaseStore>,
        shards: Arc<dyn ShardSource>,
        runner: Arc<RecordRunner>,
        metrics: Arc<Metrics>,
        processors: Arc<dyn ProcessorFactory>,
        settings: CoordinatorSettings,
    ) -> Self {
        let (exits_tx, exits_rx) = mpsc::unbounded_channel();
        let outage = TableOutage::new(settings.scan_interval);
        let role = Role::new(settings.mode.clone(), Instant::now());
        Self {
            store,
            shards,
            runner,
            metrics,
            processors,
            settings,
            running: HashMap::new(),
            requested: HashMap::new(),
            exits_tx,
            exits_rx,
            reported_malformed: HashSet::new(),
            outage,
            next_sync: Instant::now(),
            next_expiry: None,
            rescan_at: None,
            share: Share::default(),
            role,
            handoffs: Handoffs::default(),
            load: LoadState::default(),
        }
    }

    /// The same coordinator taking handoff notices from `inbox` (the store's settings should advertise
    /// the address that reaches it, so peers know where to send them).
    pub fn with_handoff_inbox(mut self, inbox: HandoffInbox) -> Self {
        self.handoffs.sender.secret = Some(inbox.secret.clone());
        self.handoffs.inbox = Some(inbox);
        self
    }

    fn owner(&self) -> &str {
        &self.store.settings().owner
    }

    fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Runs until `shutdown` is cancelled, then finishes in-flight records (bounded by the graceful
    /// timeout), checkpoints and releases every lease, and leaves the group.
    pub async fn run(mut self, shutdown: CancellationToken) {
        tracing::info!(owner = self.owner(), "worker started");
        // The membership row beats on its own task: a slow scan (many takes on a loaded table) must not
        // make the others judge this worker silent.
        let beating = CancellationToken::new();
        let beat = self.role.is_member().then(|| {
            tokio::spawn(beat(
                self.store.clone(),
                self.settings.renew_interval,
                self.metrics().clone(),
                beating.clone(),
            ))
        });
        let mut scan = tokio::time::interval(self.settings.scan_interval);
        scan.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some((key, exit)) = self.exits_rx.recv() => self.on_exit(key, exit).await,
                // Before the scans, or a scan loop kept busy by a takeover starves them; renewals run
                // on their own tasks and never wait here. Only notices signed by the group get this
                // far (64 at most waiting), and one costs at most a read per row of this worker's
                // share still to take: none once the share is full.
                Some(notice) = self.handoffs.next() => self.take_noticed(notice).await,
                _ = scan.tick() => self.tick().await,
                _ = sleep_until_some(self.next_expiry) => self.tick().await,
                _ = sleep_until_some(self.rescan_at) => {
                    self.rescan_at = None;
                    self.tick().await
                }
            }
        }
        // Stopped before leaving, so no beat recreates the row once it is deleted.
        beating.cancel();
        if let Some(beat) = beat {
            let _ = beat.await;
        }
        self.shut_down().await;
    }

    /// One scan: read the table, take in what it shows, plan this worker's moves, act on them.
    async fn tick(&mut self) {
        let now = Instant::now();
        let Some(Read { page, whole }) = self.read(now).await else { return };
        self.observe(&page, whole, now).await;
        let moves = self.plan(&page, whole, now).await;
        self.act(moves).await;
        if self.role.segmented().is_some() {
            self.keep_term(&page, whole).await;
        }
    }
}

/// At most the first 200 characters of `text` (a row another tool wrote may hold 400 KB in one value).
fn clip(text: &str) -> String {
    match text.char_indices().nth(200) {
        Some((end, _)) => format!("{}... ({} bytes)", &text[..end], text.len()),
        None => text.to_string(),
    }
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
