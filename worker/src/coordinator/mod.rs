//! The coordinator: one per worker. It scans the lease table, takes free and expired leases, balances by
//! cooperative handoff, renews what it holds, runs a reader per held shard, and gives everything back on
//! shutdown.

mod balance;
mod notices;
mod outage;
mod running;
mod segmented;
mod segments;
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

use crate::discovery::Incarnation;
use crate::dispatch::Runner;
use crate::lease::{HeldLease, Lease, LeaseError, LeaseKey, LeasePage, LeaseStore, Member};
use crate::metrics::Metrics;
use crate::processor::ProcessorFactory;
use crate::shard::{ReaderSettings, ShardExit};
use balance::{Moves, View, plan};
pub use notices::HandoffInbox;
pub(crate) use notices::HandoffNotice;
use notices::{Handoffs, Peers};
#[cfg(feature = "cli")]
pub use notices::{inbox, route as notice_route};
use outage::TableOutage;
use running::beat;
use segmented::SegmentedScan;
pub(crate) use source::{KinesisShards, ShardSource};

/// How the coordinator reads the lease table (`lease.scan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanMode {
    /// Every scan reads the whole table, and every worker syncs the shard list: reads grow with
    /// workers x shards.
    Full,
    /// Every scan reads this worker's segments of the table (each segment is read by two workers);
    /// the whole table is read when a change calls for it and otherwise rarely, and one worker (the
    /// discovery term's holder) syncs the shard list for the group. See `segmented.rs`.
    Segmented {
        /// About how many rows one segment holds.
        rows_per_segment: usize,
    },
}

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
    /// Manual assignment: run exactly these shards, with no membership and no balancing.
    pub assigned: Option<Vec<LeaseKey>>,
    /// How the table is read (manual assignment always reads it whole).
    pub scan: ScanMode,
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
    runner: Arc<Runner>,
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
    /// This worker's fair share, the live workers it was computed over and whether it is draining,
    /// logged when they change.
    share: (usize, usize, bool),
    /// What `scan: segmented` keeps between scans (unused with `scan: full`).
    segmented: SegmentedScan,
    /// Handoff notices taken and sent (see `notices.rs`).
    handoffs: Handoffs,
}

/// One read of the table: the rows read now, and whether they are the whole table.
struct Read {
    page: LeasePage,
    whole: bool,
}

impl Coordinator {
    /// A coordinator over `store`, listing and reading shards through `shards`, making each held
    /// shard's processor with `processors` and running its records with `runner` (whose metrics it
    /// counts into).
    pub(crate) fn new(
        store: Arc<dyn LeaseStore>,
        shards: Arc<dyn ShardSource>,
        runner: Arc<Runner>,
        processors: Arc<dyn ProcessorFactory>,
        settings: CoordinatorSettings,
    ) -> Self {
        let (exits_tx, exits_rx) = mpsc::unbounded_channel();
        let outage = TableOutage::new(settings.scan_interval);
        let mut settings = settings;
        if settings.assigned.is_some() {
            // No membership, no balancing: nothing to split.
            settings.scan = ScanMode::Full;
        }
        Self {
            store,
            shards,
            runner,
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
            share: (0, 0, false),
            segmented: SegmentedScan::new(Instant::now()),
            handoffs: Handoffs::default(),
        }
    }

    /// The same coordinator taking handoff notices from `inbox` (the store's settings should advertise
    /// the address that reaches it, so peers know where to send them).
    pub fn with_handoff_inbox(mut self, inbox: HandoffInbox) -> Self {
        self.handoffs.inbox = Some(inbox);
        self
    }

    fn owner(&self) -> &str {
        &self.store.settings().owner
    }

    fn metrics(&self) -> &Arc<Metrics> {
        self.runner.metrics()
    }

    /// Runs until `shutdown` is cancelled, then finishes in-flight records (bounded by the graceful
    /// timeout), checkpoints and releases every lease, and leaves the group.
    pub async fn run(mut self, shutdown: CancellationToken) {
        tracing::info!(owner = self.owner(), "worker started");
        // The membership row beats on its own task: a slow scan (many takes on a loaded table) must not
        // make the others judge this worker silent.
        let beating = CancellationToken::new();
        let beat = self.settings.assigned.is_none().then(|| {
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
        if self.is_segmented() {
            self.keep_term(&page, whole).await;
        }
    }

    fn is_segmented(&self) -> bool {
        matches!(self.settings.scan, ScanMode::Segmented { .. })
    }

    /// Reads the table as the scan mode says (the change row first, when due), unless an outage's
    /// backoff is still running; a failed read is counted and backed off from.
    async fn read(&mut self, now: Instant) -> Option<Read> {
        if !self.outage.ready(now) {
            return None;
        }
        if self.is_segmented() && now >= self.segmented.next_changes_check {
            self.segmented.next_changes_check = now + self.settings.renew_interval;
            self.watch_changes(now).await;
        }
        let read = match self.settings.scan {
            ScanMode::Full => self.store.list().await.map(|page| Read { page, whole: true }),
            ScanMode::Segmented { rows_per_segment } => self.read_segmented(now, rows_per_segment).await,
        };
        match read {
            Ok(read) => {
                self.outage.recovered();
                self.metrics().lease_table_missing.set(0);
                Some(read)
            }
            Err(e) => {
                self.metrics().lease_table_failures.inc();
                self.outage.failed("read", &e, now);
                self.metrics().lease_table_missing.set(i64::from(self.outage.is_missing()));
                // A takeover waiting for an expiry is retried after the backoff, not at once.
                self.next_expiry = None;
                None
            }
        }
    }

    /// Takes in what a read shows beyond the moves: malformed rows (reported once), silent members
    /// (their rows removed), the shard sync when due (on whole reads), and leases of ours that the
    /// table shows lost.
    async fn observe(&mut self, page: &LeasePage, whole: bool, now: Instant) {
        for malformed in &page.malformed {
            if self.reported_malformed.insert(malformed.key.clone()) {
                tracing::error!(row = %clip(&malformed.key), reason = %clip(&malformed.reason), "malformed lease row skipped");
            }
        }
        self.remove_silent_members(&page.members).await;
        if whole && self.syncs_shards() && now >= self.next_sync {
            let report = self.shards.sync(self.store.as_ref(), &page.leases).await;
            tracing::debug!(?report, "shard sync");
            self.next_sync = now + self.settings.shard_sync_interval;
            if report.created + report.deleted + report.foreign > 0 {
                // This worker's view lacks the rows it just wrote, as everyone else's does.
                self.segmented.want_whole_at(now);
                self.announce("shard rows created or removed").await;
            }
        }
        // A row that shows another owner means our lease is gone, whatever the renewer has seen so far;
        // so does a row replaced for a new incarnation of its stream (its owner kept until our next write).
        for lease in &page.leases {
            if let Some(running) = self.running.get(&lease.key) {
                if !lease.is_held_by(self.owner()) {
                    running.held.mark_lost("the table shows another owner");
                } else if lease.stream_created != running.held.stream_created() {
                    running.held.mark_lost("the row was replaced for a new incarnation of its stream");
                }
            }
        }
    }

    /// This worker's moves after a read: the balance plan over the rows (with `segmented`, over the
    /// running view, acting only on rows read now, plus the orphans of its segments).
    async fn plan(&mut self, page: &LeasePage, whole: bool, now: Instant) -> Moves {
        let timeout = self.settings.handoff_timeout;
        let running_keys: HashSet<LeaseKey> = self.running.keys().cloned().collect();
        self.requested.retain(|key, at| !running_keys.contains(key) && at.elapsed() < timeout);
        let segmented = self.is_segmented();
        let fresh: HashSet<LeaseKey> = page.leases.iter().map(|l| l.key.clone()).collect();
        let mut moves = if segmented {
            let (leases, members) = self.view_for_plan(&fresh);
            self.handoffs.peers = Peers::from_view(&leases, &members, self.owner());
            self.moves(&leases, &members, &running_keys)
        } else {
            self.handoffs.peers = Peers::from_view(&page.leases, &page.members, self.owner());
            self.moves(&page.leases, &page.members, &running_keys)
        };
        tracing::debug!(
            whole,
            target = moves.target,
            running = self.running.len(),
            take = moves.take.len(),
            ask = moves.ask.len(),
            give = moves.give.len(),
            "planned"
        );
        if (moves.target, moves.workers, moves.draining) != self.share {
            self.share = (moves.target, moves.workers, moves.draining);
            tracing::info!(
                target = moves.target,
                workers = moves.workers,
                draining = moves.draining,
                running = self.running.len(),
                "fair share"
            );
        }
        if segmented {
            self.plan_segmented(&mut moves, page, &fresh, whole, now).await;
        }
        moves
    }

    /// Carries the moves out: hands over what is asked for, takes leases (free, expired, orphaned),
    /// asks for handoffs.
    async fn act(&mut self, moves: Moves) {
        let Moves { take, expired_candidates, ask, give, .. } = moves;
        for (key, to) in give {
            if let Some(running) = self.running.get_mut(&key)
                && running.give_to.is_none()
            {
                tracing::info!(shard = %key, to, "handing lease over on request");
                running.give_to = Some(to);
                running.stop.cancel();
            }
        }
        self.next_expiry = None;
        let mut took_over = false;
        for lease in take.into_iter().chain(expired_candidates) {
            took_over |= self.take(lease).await;
        }
        if took_over {
            self.announce("leases taken over").await;
        }
        for lease in ask {
            self.ask(lease).await;
        }
    }

    /// Acquires `lease` and starts reading it; true when it was taken over from a worker that stopped
    /// renewing it (with `segmented`, the group changed: the caller tells the others).
    async fn take(&mut self, lease: Lease) -> bool {
        if !self.same_incarnation(&lease).await {
            return false;
        }
        let sent = Instant::now();
        let from_another = lease.owner.as_deref().is_some_and(|o| o != self.owner());
        let mut took_over = false;
        match self.store.acquire(&lease).await {
            Ok(acquired) => {
                if from_another {
                    self.metrics().lease_takeovers.inc();
                    tracing::info!(shard = %lease.key, from = lease.owner.as_deref().unwrap_or("-"),
                        "lease taken over: its holder stopped renewing it");
                    if self.is_segmented() {
                        // A worker died or stalled: the group changed, so read it all at the next
                        // scan, and tell those who read it rarely (once for all the takeovers of this scan).
                        self.segmented.want_whole_at(Instant::now());
                        took_over = true;
                    }
                }
                self.start(acquired, sent).await
            }
            Err(LeaseError::HeldByOther { remaining, .. }) => {
                let at = Instant::now() + remaining;
                self.next_expiry = Some(self.next_expiry.map_or(at, |next| next.min(at)));
            }
            Err(e @ LeaseError::NotObserved { .. }) => tracing::trace!(shard = %lease.key, error = %e, "not taken"),
            Err(e @ LeaseError::ItemTooLarge { .. }) => {
                // Retried at every scan (an operator may trim the row), reported once like a malformed row.
                if self.reported_malformed.insert(lease.key.to_string()) {
                    tracing::error!(row = %lease.key, error = %e, "lease row too large to take; skipped");
                }
            }
            Err(e) if e.is_not_held() => {
                tracing::debug!(shard = %lease.key, error = %e, "lost the race for a lease")
            }
            Err(e) => tracing::warn!(shard = %lease.key, error = %e, "acquire failed"),
        }
        took_over
    }

    /// Asks the holder of `lease` to hand it over.
    async fn ask(&mut self, lease: Lease) {
        let mut placed = self.store.request_handoff(&lease).await;
        if self.is_segmented() && matches!(placed, Err(LeaseError::ConditionFailed { .. })) {
            // The holder renewed since the whole read (likely on a large table): read the row
            // again and ask once more if it is still the holder's and its request is still the one
            // the plan judged (none, or a stale one to replace), rather than wait for the next
            // whole read.
            if let Ok(Some(now)) = self.store.get(&lease.key).await
                && now.owner == lease.owner
                && now.handoff_to == lease.handoff_to
            {
                placed = self.store.request_handoff(&now).await;
            }
        }
        match placed {
            Ok(_) => {
                tracing::info!(shard = %lease.key, holder = lease.owner.as_deref().unwrap_or("-"), "asked for a handoff");
                self.requested.insert(lease.key.clone(), Instant::now());
            }
            Err(e) => tracing::debug!(shard = %lease.key, error = %e, "handoff request not placed"),
        }
    }

    /// True when this worker lists the shards and writes their rows: every worker with `scan: full`
    /// (and with manual assignment), the discovery term's holder only with `scan: segmented`.
    fn syncs_shards(&self) -> bool {
        match self.settings.scan {
            ScanMode::Full => true,
            ScanMode::Segmented { .. } => self.segmented.term.as_ref().is_some_and(|term| term.is_valid()),
        }
    }

    /// True when `lease` belongs to its stream as it exists now: a row of a former incarnation (the
    /// stream deleted and recreated under its name) is never taken, since its checkpoint is about
    /// another stream; the next shard sync, brought forward, replaces it.
    async fn same_incarnation(&mut self, lease: &Lease) -> bool {
        let Some(created) = lease.stream_created else { return true };
        match self.shards.incarnation(lease.key.stream(), self.settings.renew_interval).await {
            Incarnation::Known(now) if now == created => true,
            Incarnation::Known(_) => {
                tracing::info!(shard = %lease.key, "row of a former incarnation of its stream not taken; syncing shards");
                self.next_sync = Instant::now();
                false
            }
            Incarnation::Gone => {
                tracing::debug!(shard = %lease.key, "stream gone; lease not taken");
                false
            }
            // Cannot be told now (throttled, no permission): taken as before stamps existed.
            Incarnation::Unknown => true,
        }
    }

    /// Deletes the membership rows of workers seen silent for a whole lease duration (crashed ones
    /// never leave), so rows do not pile up and every scan stops reading them. The delete is
    /// conditioned on the counter seen: a worker that beats again in between keeps its row, and of
    /// several workers removing the same row one succeeds.
    async fn remove_silent_members(&mut self, members: &[Member]) {
        if self.settings.assigned.is_some() {
            return;
        }
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

    fn moves(&self, leases: &[Lease], members: &[Member], running: &HashSet<LeaseKey>) -> Moves {
        match &self.settings.assigned {
            Some(assigned) => {
                let take = leases
                    .iter()
                    .filter(|l| assigned.contains(&l.key) && !running.contains(&l.key) && !l.checkpoint.is_shard_end())
                    .cloned()
                    .collect();
                Moves { target: assigned.len(), take, ..Moves::default() }
            }
            None => {
                let requested: HashSet<LeaseKey> = self.requested.keys().cloned().collect();
                plan(&View { me: self.owner(), leases, members, running, requested: &requested })
            }
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
