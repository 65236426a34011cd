//! Reading a shard with enhanced fan-out: one subscription at a time, each event's records through the
//! same delivery as polling (`ShardReader::deliver`), the next subscription after the last
//! continuation sequence number (no gap, no repeat), and silence never holding the lease: a
//! subscription quiet for `reader.subscriptionIdleTimeout` is replaced, and a shard with no
//! delivering subscription for a lease duration is given up.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::unpack::Unpacker;
use super::{Cursor, Flow, RowIncarnation, ShardExit, ShardReader, start_at};
use crate::dispatch::Dispatcher;
use crate::kinesis::{FanOutEvent, KinesisError, StartAt, Subscription};

/// Least time between two log lines of one kind of fault on one shard.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Delays between SubscribeToShard attempts: 200 ms doubling to 2 s, with jitter. A throttled call
/// waits at least a second (the limit is 1 call/s per consumer and shard).
fn subscribe_backoff() -> impl Iterator<Item = Duration> {
    super::backoff(Duration::from_millis(200), Duration::from_secs(2))
}

/// A log line at most every [`LOG_EVERY`], telling how many were held back.
struct RateLimited {
    last: Option<Instant>,
    held_back: u64,
}

impl RateLimited {
    fn new() -> Self {
        Self { last: None, held_back: 0 }
    }

    /// `Some(lines held back since the last one)` when a line may be logged now.
    fn allow(&mut self) -> Option<u64> {
        if self.last.is_some_and(|at| at.elapsed() < LOG_EVERY) {
            self.held_back += 1;
            return None;
        }
        self.last = Some(Instant::now());
        Some(std::mem::take(&mut self.held_back))
    }
}

/// What waiting on a subscription gave.
enum Next {
    Event(FanOutEvent),
    /// The service ended the subscription (its lifetime).
    Ended,
    /// No event within the idle timeout.
    Idle,
    Broken(KinesisError),
    Stop,
}

/// A fan-out reader's state between subscriptions.
struct FanOut {
    /// Where the next subscription starts after; before any event, the lease's checkpoint says.
    continuation: Option<String>,
    failures: Box<dyn Iterator<Item = Duration> + Send>,
    subscribe_log: RateLimited,
    replace_log: RateLimited,
    /// Since when no subscription has delivered: the consumer's resolution (registering it and
    /// waiting for ACTIVE may take a while on first use), or the end of the last subscription that
    /// delivered an event.
    down_since: Instant,
    /// Since when no record has come (or the shard's end was last checked).
    quiet_since: Instant,
    unpacker: Unpacker,
}

/// How one subscription ended.
enum Subscribed {
    /// The reader is done.
    Exit(ShardExit),
    /// It is to be replaced (why, with the error if it broke); `delivered` when it brought an event.
    Replaced { why: &'static str, error: Option<KinesisError>, delivered: bool },
    /// No subscription was opened (refused, or the stream not described): try again after a backoff.
    NotOpened,
}

impl ShardReader {
    /// Reads the shard through subscriptions until it ends, the lease is lost, a stop is requested, or
    /// no subscription can be re-established within `resubscribe_limit`.
    pub(super) async fn read_fan_out(&self, d: &mut Dispatcher, cursor: &mut Cursor) -> Flow<ShardExit> {
        let stream: Arc<str> = Arc::from(self.context.held.key().stream());
        let mut failures = subscribe_backoff();
        if let Some(exit) = self.resolve_consumer(d, cursor, &stream, &mut failures).await? {
            return Ok(exit);
        }
        let mut state = FanOut {
            continuation: None,
            failures: Box::new(failures),
            subscribe_log: RateLimited::new(),
            replace_log: RateLimited::new(),
            down_since: Instant::now(),
            quiet_since: Instant::now(),
            unpacker: self.unpacker(cursor),
        };
        loop {
            if self.context.held.lost().is_cancelled() {
                return Ok(ShardExit::Lost);
            }
            if self.context.stop.is_cancelled() {
                return self.stopped(d, cursor).await;
            }
            if state.down_since.elapsed() >= self.context.settings.resubscribe_limit {
                return self.give_up(d, cursor, state.down_since).await;
            }
            match self.subscribe_and_read(d, cursor, &mut state).await? {
                Subscribed::Exit(exit) => return Ok(exit),
                Subscribed::NotOpened => {}
                Subscribed::Replaced { why, error, delivered } => {
                    if delivered {
                        state.down_since = Instant::now();
                    }
                    if self.quiet_shard_ended(d, cursor, &state.continuation, &mut state.quiet_since).await? {
                        return self.finish(d, cursor).await;
                    }
                    self.replaced(why, error, &mut state.replace_log);
                }
            }
        }
    }

    /// Opens one subscription after the last event (or the checkpoint) and reads it until it ends.
    async fn subscribe_and_read(
        &self,
        d: &mut Dispatcher,
        cursor: &mut Cursor,
        state: &mut FanOut,
    ) -> Flow<Subscribed> {
        let key = self.context.held.key();
        let (stream, shard): (Arc<str>, Arc<str>) = (Arc::from(key.stream()), Arc::from(key.shard_id()));
        let from = match &state.continuation {
            Some(sequence) => StartAt::AfterSequence(sequence.clone()),
            None => match start_at(&cursor.fetched) {
                Some(from) => from,
                None => return Ok(Subscribed::Exit(ShardExit::Ended)),
            },
        };
        // As before a polling iterator: never read a recreated stream under the former one's lease.
        match self.check_incarnation(d, &stream, cursor).await? {
            RowIncarnation::Same => {}
            RowIncarnation::Recreated(exit) => return Ok(Subscribed::Exit(exit)),
            RowIncarnation::Unknown(e) => {
                let delay = state.failures.next().unwrap_or(Duration::from_secs(2));
                tracing::debug!(shard = %key, error = %e, ?delay, "cannot describe the stream before subscribing; retrying");
                self.back_off(d, delay, state.down_since).await?;
                return Ok(Subscribed::NotOpened);
            }
        }
        let subscription = match self.drive(d, self.kinesis.subscribe(&stream, &shard, &from)).await? {
            Ok(subscription) => subscription,
            Err(KinesisError::StreamNotFound { .. }) => {
                return self.stream_gone(d, cursor, &stream).await.map(Subscribed::Exit);
            }
            Err(e) => {
                self.subscribe_failed(d, e, state).await?;
                return Ok(Subscribed::NotOpened);
            }
        };
        self.context.metrics.fanout_subscriptions.inc();
        tracing::debug!(shard = %key, from = ?from, "subscribed");
        self.read_subscription(d, cursor, state, subscription).await
    }

    /// Reads `subscription`'s events until it ends, goes quiet or breaks, the shard ends, or a stop.
    async fn read_subscription(
        &self,
        d: &mut Dispatcher,
        cursor: &mut Cursor,
        state: &mut FanOut,
        mut subscription: Subscription,
    ) -> Flow<Subscribed> {
        let idle_timeout = self.context.settings.subscription_idle_timeout;
        let mut delivered = false;
        loop {
            // Until the new subscription delivers, the give-up limit bounds the wait too.
            let wait = if delivered {
                idle_timeout
            } else {
                let limit = state.down_since + self.context.settings.resubscribe_limit;
                idle_timeout.min(limit.saturating_duration_since(Instant::now()))
            };
            let (why, error) = match self.await_event(d, cursor, &mut subscription, wait).await? {
                Next::Event(event) => {
                    delivered = true;
                    state.failures = Box::new(subscribe_backoff());
                    let FanOutEvent { records, continuation: next, millis_behind } = event;
                    if !records.is_empty() {
                        state.quiet_since = Instant::now();
                    }
                    if let Some(exit) =
                        self.deliver(d, cursor, &mut state.unpacker, records, Some(millis_behind)).await?
                    {
                        return Ok(Subscribed::Exit(exit));
                    }
                    let ended = match next {
                        Some(next) => {
                            state.continuation = Some(next);
                            self.quiet_shard_ended(d, cursor, &state.continuation, &mut state.quiet_since).await?
                        }
                        None => true,
                    };
                    if ended {
                        drop(subscription);
                        return self.finish(d, cursor).await.map(Subscribed::Exit);
                    }
                    self.maybe_checkpoint(d, cursor).await?;
                    continue;
                }
                Next::Stop => {
                    drop(subscription);
                    return self.stopped(d, cursor).await.map(Subscribed::Exit);
                }
                Next::Ended => ("ended", None),
                Next::Idle => ("idle", None),
                Next::Broken(e) => ("broken", Some(e)),
            };
            return Ok(Subscribed::Replaced { why, error, delivered });
        }
    }

    /// A SubscribeToShard call failed: counted, logged (rate-limited) and backed off from (at least a
    /// second after throttling: the limit is 1 call/s per consumer and shard).
    async fn subscribe_failed(&self, d: &mut Dispatcher, error: KinesisError, state: &mut FanOut) -> Flow<()> {
        let reason = match error {
            KinesisError::ResourceInUse(_) => "resource_in_use",
            KinesisError::Throttled(_) => "limit_exceeded",
            _ => "other",
        };
        self.context.metrics.subscribe_failed(reason);
        let mut delay = state.failures.next().unwrap_or(Duration::from_secs(2));
        if reason == "limit_exceeded" {
            delay = delay.max(Duration::from_secs(1));
        }
        if let Some(held_back) = state.subscribe_log.allow() {
            tracing::warn!(shard = %self.context.held.key(), error = %error, reason, ?delay, held_back,
                "SubscribeToShard failed; retrying (counted in leasehold_fanout_subscribe_failures_total)");
        }
        self.back_off(d, delay, state.down_since).await
    }

    /// Waits `delay`, but not past the give-up limit; interrupted or not, the reading loop's top
    /// checks for a lost lease, a stop or the limit next.
    async fn back_off(&self, d: &mut Dispatcher, delay: Duration, down_since: Instant) -> Flow<()> {
        let until = (Instant::now() + delay).min(down_since + self.context.settings.resubscribe_limit);
        self.drive(d, self.wait(Some(until))).await?;
        Ok(())
    }

    /// A subscription is replaced: counted, and logged (a drop rate-limited).
    fn replaced(&self, why: &'static str, error: Option<KinesisError>, log: &mut RateLimited) {
        let key = self.context.held.key();
        self.context.metrics.subscription_replaced(why);
        if why == "ended" {
            tracing::info!(shard = %key, "subscription ended; subscribing again after the last event");
        } else if let Some(held_back) = log.allow() {
            let idle_timeout = self.context.settings.subscription_idle_timeout;
            tracing::warn!(shard = %key, reason = why, error = ?error.map(|e| e.to_string()), ?idle_timeout, held_back,
                "subscription dropped; subscribing again after the last event (counted in leasehold_fanout_subscriptions_replaced_total)");
        }
    }

    /// Resolves (registering if absent) the stream consumer before the first subscription; failures
    /// are retried with backoff until a lease duration has passed, then the shard is given up. `Some`
    /// when the reader must exit.
    async fn resolve_consumer(
        &self,
        d: &mut Dispatcher,
        cursor: &Cursor,
        stream: &str,
        failures: &mut impl Iterator<Item = Duration>,
    ) -> Flow<Option<ShardExit>> {
        let started = Instant::now();
        let mut log = RateLimited::new();
        loop {
            let resolved = tokio::select! {
                _ = self.context.stop.cancelled() => return self.stopped(d, cursor).await.map(Some),
                resolved = self.drive(d, self.kinesis.consumer_arn(stream)) => resolved?,
            };
            match resolved {
                Ok(_) => return Ok(None),
                Err(KinesisError::StreamNotFound { .. }) => return self.stream_gone(d, cursor, stream).await.map(Some),
                Err(e) => {
                    self.context.metrics.subscribe_failed("other");
                    if let Some(held_back) = log.allow() {
                        tracing::warn!(shard = %self.context.held.key(), error = %e, held_back,
                            "cannot resolve the stream consumer; retrying (counted in leasehold_fanout_subscribe_failures_total)");
                    }
                }
            }
            if started.elapsed() >= self.context.settings.resubscribe_limit {
                return self.give_up(d, cursor, started).await.map(Some);
            }
            let delay = failures.next().unwrap_or(Duration::from_secs(2));
            self.drive(d, self.wait(Some(Instant::now() + delay))).await?;
            if self.context.held.lost().is_cancelled() {
                return Ok(Some(ShardExit::Lost));
            }
        }
    }

    /// True when the subscription has brought no record for `end_check_interval` and one GetRecords
    /// after `continuation` (or the cursor, before any event) shows the shard closed and read to its
    /// end. The service ends a closed shard's subscription itself (no continuation, child shards), but
    /// an implementation that keeps sending empty events for it (kinesis-mock) must not hold a finished
    /// parent, and its children unread, forever. A failed check is tried again an interval later.
    async fn quiet_shard_ended(
        &self,
        d: &mut Dispatcher,
        cursor: &Cursor,
        continuation: &Option<String>,
        quiet_since: &mut Instant,
    ) -> Flow<bool> {
        if quiet_since.elapsed() < self.context.settings.end_check_interval {
            return Ok(false);
        }
        *quiet_since = Instant::now();
        let from = match continuation {
            Some(sequence) => StartAt::AfterSequence(sequence.clone()),
            None => match start_at(&cursor.fetched) {
                Some(from) => from,
                None => return Ok(true),
            },
        };
        let key = self.context.held.key();
        let (stream, shard): (Arc<str>, Arc<str>) = (Arc::from(key.stream()), Arc::from(key.shard_id()));
        let checked = async {
            let Some(iterator) = self.kinesis.iterator(&stream, &shard, &from).await? else { return Ok(true) };
            let batch = self.kinesis.get_records(&stream, &shard, &iterator, 1).await?;
            Ok::<_, KinesisError>(batch.records.is_empty() && batch.next_iterator.is_none())
        };
        match self.drive(d, checked).await? {
            Ok(ended) => {
                self.context.metrics.fanout_end_checked(if ended { "ended" } else { "open" });
                if ended {
                    tracing::info!(shard = %key, "the subscription brought nothing and GetRecords shows the shard closed and read to its end");
                }
                Ok(ended)
            }
            Err(e) => {
                self.context.metrics.fanout_end_checked("failed");
                tracing::debug!(shard = %key, error = %e, "could not check the end of a quiet shard; checking again later");
                Ok(false)
            }
        }
    }

    /// The next event of `subscription` (as [`Self::next_event`]), checkpointing the done prefix as
    /// `checkpointInterval` allows meanwhile: records finish after the event that brought them, and with an
    /// implementation that pushes once a second (kinesis-mock) they would otherwise stay
    /// uncheckpointed, and be read again after a crash, until the next event.
    async fn await_event(
        &self,
        d: &mut Dispatcher,
        cursor: &mut Cursor,
        subscription: &mut Subscription,
        wait: Duration,
    ) -> Flow<Next> {
        let deadline = Instant::now() + wait;
        // Checked a few times an interval, so records that finish soon after their event are
        // checkpointed soon after (a write only goes out when the interval has passed).
        let every = (self.context.settings.checkpoint_interval / 4).max(Duration::from_millis(10));
        loop {
            let tick = (Instant::now() + every).min(deadline);
            let next =
                self.drive(d, self.next_event(subscription, tick.saturating_duration_since(Instant::now()))).await?;
            if matches!(next, Next::Idle) && Instant::now() < deadline {
                self.maybe_checkpoint(d, cursor).await?;
                continue;
            }
            return Ok(next);
        }
    }

    /// The next event of `subscription`, unless none comes within `wait` or a stop is asked for.
    async fn next_event(&self, subscription: &mut Subscription, wait: Duration) -> Next {
        tokio::select! {
            _ = self.context.stop.cancelled() => Next::Stop,
            next = tokio::time::timeout(wait, subscription.next()) => match next {
                Err(_) => Next::Idle,
                Ok(Ok(Some(event))) => Next::Event(event),
                Ok(Ok(None)) => Next::Ended,
                Ok(Err(e)) => Next::Broken(e),
            },
        }
    }

    /// The stream is gone: the records running finish and the shard is given up, as polling does.
    async fn stream_gone(&self, d: &mut Dispatcher, cursor: &Cursor, stream: &str) -> Flow<ShardExit> {
        let reason = format!("stream {stream} not found");
        tracing::error!(shard = %self.context.held.key(), reason, "stream gone; giving the shard up");
        self.drain(d).await?;
        Ok(ShardExit::Failed { reason, last: cursor.position(d) })
    }

    /// No subscription delivered for a lease duration: the shard is released (what is done
    /// checkpointed) rather than held while nothing is read.
    async fn give_up(&self, d: &mut Dispatcher, cursor: &Cursor, down_since: Instant) -> Flow<ShardExit> {
        self.context.metrics.fanout_shards_given_up.inc();
        let reason = format!(
            "no fan-out subscription delivered for {:?} (the lease duration); releasing the shard",
            down_since.elapsed()
        );
        tracing::error!(shard = %self.context.held.key(), reason, "giving the shard up (counted in leasehold_fanout_shards_given_up_total)");
        self.drain(d).await?;
        Ok(ShardExit::Failed { reason, last: cursor.position(d) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fault_logs_are_rate_limited_and_say_how_many_were_held_back() {
        let mut log = RateLimited::new();
        assert_eq!(log.allow(), Some(0));
        assert_eq!(log.allow(), None);
        assert_eq!(log.allow(), None);
        tokio::time::advance(LOG_EVERY).await;
        assert_eq!(log.allow(), Some(2));
        assert_eq!(log.allow(), None);
    }
}
