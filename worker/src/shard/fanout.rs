//! Reading a shard with enhanced fan-out: one subscription at a time, each event's records through the
//! same delivery as polling (`ShardReader::deliver`), the next subscription after the last
//! continuation sequence number (no gap, no repeat), and silence never holding the lease: a
//! subscription quiet for `reader.subscriptionIdleTimeout` is replaced, and a shard with no
//! delivering subscription for a lease duration is given up.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Cursor, Flow, ShardExit, ShardReader, start_at};
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

impl ShardReader {
    /// Reads the shard through subscriptions until it ends, the lease is lost, a stop is requested, or
    /// no subscription can be re-established within `resubscribe_limit`.
    pub(super) async fn read_fan_out(&self, d: &mut Dispatcher, cursor: &mut Cursor) -> Flow<ShardExit> {
        let key = self.held.key().clone();
        let stream: Arc<str> = Arc::from(key.stream());
        let shard: Arc<str> = Arc::from(key.shard_id());
        let metrics = self.runner.metrics().clone();
        let idle_timeout = self.settings.subscription_idle_timeout;
        let mut unpacker = self.unpacker(cursor);
        // Where the next subscription starts after; before any event, the lease's checkpoint says.
        let mut continuation: Option<String> = None;
        let mut failures = subscribe_backoff();
        let mut subscribe_log = RateLimited::new();
        let mut replace_log = RateLimited::new();
        if let Some(exit) = self.resolve_consumer(d, cursor, &stream, &mut failures).await? {
            return Ok(exit);
        }
        // Since when no subscription has delivered: the consumer's resolution (registering it and
        // waiting for ACTIVE may take a while on first use), or the end of the last subscription that
        // delivered an event.
        let mut down_since = Instant::now();
        // Since when no record has come (or the shard's end was last checked).
        let mut quiet_since = Instant::now();
        loop {
            if self.held.lost().is_cancelled() {
                return Ok(ShardExit::Lost);
            }
            if self.stop.is_cancelled() {
                return self.stopped(d, cursor).await;
            }
            if down_since.elapsed() >= self.settings.resubscribe_limit {
                return self.give_up(d, cursor, down_since).await;
            }
            let from = match &continuation {
                Some(sequence) => StartAt::AfterSequence(sequence.clone()),
                None => match start_at(&cursor.fetched) {
                    Some(from) => from,
                    None => return Ok(ShardExit::Ended),
                },
            };
            // As before a polling iterator: never read a recreated stream under the former one's lease.
            match self.check_incarnation(d, &stream, cursor).await? {
                Ok(None) => {}
                Ok(Some(exit)) => return Ok(exit),
                Err(e) => {
                    let delay = failures.next().unwrap_or(Duration::from_secs(2));
                    tracing::debug!(shard = %key, error = %e, ?delay, "cannot describe the stream before subscribing; retrying");
                    let until = (Instant::now() + delay).min(down_since + self.settings.resubscribe_limit);
                    self.drive(d, self.wait(Some(until))).await?;
                    continue;
                }
            }
            let mut subscription = match self.drive(d, self.kinesis.subscribe(&stream, &shard, &from)).await? {
                Ok(subscription) => subscription,
                Err(KinesisError::StreamNotFound { .. }) => return self.stream_gone(d, cursor, &stream).await,
                Err(e) => {
                    let reason = match e {
                        KinesisError::ResourceInUse(_) => "resource_in_use",
                        KinesisError::Throttled(_) => "limit_exceeded",
                        _ => "other",
                    };
                    metrics.subscribe_failed(reason);
                    let mut delay = failures.next().unwrap_or(Duration::from_secs(2));
                    if reason == "limit_exceeded" {
                        delay = delay.max(Duration::from_secs(1));
                    }
                    if let Some(held_back) = subscribe_log.allow() {
                        tracing::warn!(shard = %key, error = %e, reason, ?delay, held_back,
                            "SubscribeToShard failed; retrying (counted in leasehold_fanout_subscribe_failures_total)");
                    }
                    // Interrupted or not, the loop's top checks for a lost lease, a stop or the limit.
                    let until = (Instant::now() + delay).min(down_since + self.settings.resubscribe_limit);
                    self.drive(d, self.wait(Some(until))).await?;
                    continue;
                }
            };
            metrics.fanout_subscriptions.inc();
            tracing::debug!(shard = %key, from = ?from, "subscribed");
            let mut delivered = false;
            let why = loop {
                // Until the new subscription delivers, the give-up limit bounds the wait too.
                let wait = if delivered {
                    idle_timeout
                } else {
                    idle_timeout
                        .min((down_since + self.settings.resubscribe_limit).saturating_duration_since(Instant::now()))
                };
                match self.await_event(d, cursor, &mut subscription, wait).await? {
                    Next::Event(event) => {
                        delivered = true;
                        failures = subscribe_backoff();
                        let FanOutEvent { records, continuation: next, millis_behind } = event;
                        if !records.is_empty() {
                            quiet_since = Instant::now();
                        }
                        if let Some(exit) = self.deliver(d, cursor, &mut unpacker, records, Some(millis_behind)).await?
                        {
                            return Ok(exit);
                        }
                        match next {
                            Some(next) => continuation = Some(next),
                            None => {
                                drop(subscription);
                                return self.finish(d, cursor).await;
                            }
                        }
                        if self.quiet_shard_ended(d, cursor, &continuation, &mut quiet_since).await? {
                            drop(subscription);
                            return self.finish(d, cursor).await;
                        }
                        self.maybe_checkpoint(d, cursor).await?;
                    }
                    Next::Stop => {
                        drop(subscription);
                        return self.stopped(d, cursor).await;
                    }
                    Next::Ended => break ("ended", None),
                    Next::Idle => break ("idle", None),
                    Next::Broken(e) => break ("broken", Some(e)),
                }
            };
            drop(subscription);
            if delivered {
                down_since = Instant::now();
            }
            if self.quiet_shard_ended(d, cursor, &continuation, &mut quiet_since).await? {
                return self.finish(d, cursor).await;
            }
            metrics.subscription_replaced(why.0);
            match (why, replace_log.allow()) {
                (("ended", _), _) => {
                    tracing::info!(shard = %key, "subscription ended; subscribing again after the last event")
                }
                ((reason, error), Some(held_back)) => {
                    tracing::warn!(shard = %key, reason, error = ?error.map(|e| e.to_string()),
                    ?idle_timeout, held_back,
                    "subscription dropped; subscribing again after the last event (counted in leasehold_fanout_subscriptions_replaced_total)")
                }
                _ => {}
            }
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
                _ = self.stop.cancelled() => return self.stopped(d, cursor).await.map(Some),
                resolved = self.drive(d, self.kinesis.consumer_arn(stream)) => resolved?,
            };
            match resolved {
                Ok(_) => return Ok(None),
                Err(KinesisError::StreamNotFound { .. }) => return self.stream_gone(d, cursor, stream).await.map(Some),
                Err(e) => {
                    self.runner.metrics().subscribe_failed("other");
                    if let Some(held_back) = log.allow() {
                        tracing::warn!(shard = %self.held.key(), error = %e, held_back,
                            "cannot resolve the stream consumer; retrying (counted in leasehold_fanout_subscribe_failures_total)");
                    }
                }
            }
            if started.elapsed() >= self.settings.resubscribe_limit {
                return self.give_up(d, cursor, started).await.map(Some);
            }
            let delay = failures.next().unwrap_or(Duration::from_secs(2));
            self.drive(d, self.wait(Some(Instant::now() + delay))).await?;
            if self.held.lost().is_cancelled() {
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
        if quiet_since.elapsed() < self.settings.end_check_interval {
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
        let key = self.held.key();
        let (stream, shard): (Arc<str>, Arc<str>) = (Arc::from(key.stream()), Arc::from(key.shard_id()));
        let checked = async {
            let Some(iterator) = self.kinesis.iterator(&stream, &shard, &from).await? else { return Ok(true) };
            let batch = self.kinesis.get_records(&stream, &shard, &iterator, 1).await?;
            Ok::<_, KinesisError>(batch.records.is_empty() && batch.next_iterator.is_none())
        };
        match self.drive(d, checked).await? {
            Ok(ended) => {
                self.runner.metrics().fanout_end_checked(if ended { "ended" } else { "open" });
                if ended {
                    tracing::info!(shard = %key, "the subscription brought nothing and GetRecords shows the shard closed and read to its end");
                }
                Ok(ended)
            }
            Err(e) => {
                self.runner.metrics().fanout_end_checked("failed");
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
        let every = (self.settings.checkpoint_interval / 4).max(Duration::from_millis(10));
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
            _ = self.stop.cancelled() => Next::Stop,
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
        tracing::error!(shard = %self.held.key(), reason, "stream gone; giving the shard up");
        self.drain(d).await?;
        Ok(ShardExit::Failed { reason, last: cursor.position(d) })
    }

    /// No subscription delivered for a lease duration: the shard is released (what is done
    /// checkpointed) rather than held while nothing is read.
    async fn give_up(&self, d: &mut Dispatcher, cursor: &Cursor, down_since: Instant) -> Flow<ShardExit> {
        self.runner.metrics().fanout_shards_given_up.inc();
        let reason = format!(
            "no fan-out subscription delivered for {:?} (the lease duration); releasing the shard",
            down_since.elapsed()
        );
        tracing::error!(shard = %self.held.key(), reason, "giving the shard up (counted in leasehold_fanout_shards_given_up_total)");
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
