//! What the fan-out server knows: its settings, the registered consumers, the open subscriptions and
//! the faults a test asked for.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::controls::FanOutFault;
use super::upstream::Upstream;

/// Timings and sizes; each has the service's value by default where the service has one.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// How long a subscription lives before its stream ends (the service: 5 minutes).
    pub(crate) subscription_lifetime: Duration,
    /// A new subscription for a consumer and shard within this time of the previous one's start is
    /// refused with ResourceInUseException (the service: 5 s).
    pub(crate) resubscribe_window: Duration,
    /// At most one SubscribeToShard call per consumer and shard in this time, else
    /// LimitExceededException (the service: 1 s).
    pub(crate) call_interval: Duration,
    /// How long a new consumer stays CREATING (and a deregistered one DELETING).
    pub(crate) consumer_transition: Duration,
    /// An event is pushed at least this often, records or not.
    pub(crate) event_interval: Duration,
    /// How often an idle subscription asks kinesalite for new records (puts through this server wake
    /// it at once).
    pub(crate) idle_poll: Duration,
    /// Records per event at most (one GetRecords page).
    pub(crate) records_per_event: usize,
    /// A call after the resubscribe window while a subscription is open takes over: the open one ends
    /// with ResourceInUseException (as the service documents). Off: the call is refused instead.
    pub(crate) takeover: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            subscription_lifetime: Duration::from_secs(300),
            resubscribe_window: Duration::from_secs(5),
            call_interval: Duration::from_secs(1),
            consumer_transition: Duration::from_millis(300),
            event_interval: Duration::from_secs(1),
            idle_poll: Duration::from_millis(100),
            records_per_event: 1000,
            takeover: false,
        }
    }
}

/// A registered stream consumer.
#[derive(Debug, Clone)]
pub(crate) struct Consumer {
    pub(crate) name: String,
    pub(crate) arn: String,
    pub(crate) stream_arn: String,
    pub(crate) creation_epoch_secs: u64,
    pub(crate) registered_at: Instant,
    pub(crate) deregistered_at: Option<Instant>,
}

/// How an open subscription is to end, when a test or a deregistration says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Not asked to end.
    Open,
    /// Cut the connection with no proper end.
    Cut,
    /// Send this exception as an event-stream message, then end.
    Exception(&'static str),
}

/// An open subscription, as the rest of the server sees it.
pub(crate) struct OpenSubscription {
    pub(crate) consumer_arn: String,
    pub(crate) stream: String,
    pub(crate) shard_id: String,
    pub(crate) ending: watch::Sender<Ending>,
    pub(crate) wake: Arc<Notify>,
    /// Closes the connection the subscription is served on.
    pub(crate) connection: CancellationToken,
    /// Over for the service (lifetime ended, taken over, failed), though its connection may still be
    /// draining to a client that reads slowly: it no longer counts as open.
    pub(crate) over: bool,
}

/// Faults waiting for the next SubscribeToShard calls.
pub(crate) struct PendingFault {
    pub(crate) shard_id: Option<String>,
    pub(crate) fault: FanOutFault,
    pub(crate) remaining: usize,
}

/// Everything mutable, behind one lock (held only for bookkeeping, never across a call).
#[derive(Default)]
pub(crate) struct Book {
    pub(crate) settings: Settings,
    pub(crate) consumers: BTreeMap<String, Consumer>,
    pub(crate) next_subscription: u64,
    pub(crate) open: HashMap<u64, OpenSubscription>,
    pub(crate) last_call: HashMap<(String, String), Instant>,
    pub(crate) last_start: HashMap<(String, String), Instant>,
    pub(crate) started: HashMap<String, usize>,
    pub(crate) faults: Vec<PendingFault>,
    pub(crate) stalls: Vec<Option<String>>,
    pub(crate) records_pushed: usize,
}

/// State shared by the server's handlers, its subscriptions and the test's controls.
pub(crate) struct Shared {
    pub(crate) upstream: Upstream,
    pub(crate) book: Mutex<Book>,
    /// Cancelled when the server is dropped: every subscription ends.
    pub(crate) shutdown: CancellationToken,
}

impl Shared {
    /// The book; a panic while holding it (only in a test) leaves it usable for the test's asserts.
    pub(crate) fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wakes the subscriptions reading `stream` (after a put to it went through this server).
    pub(crate) fn wake_stream(&self, stream: &str) {
        for subscription in self.book().open.values().filter(|s| s.stream == stream && !s.over) {
            subscription.wake.notify_one();
        }
    }
}

impl Book {
    /// Marks subscription `id` over (its pump stopped for good).
    pub(crate) fn over(&mut self, id: u64) {
        if let Some(subscription) = self.open.get_mut(&id) {
            subscription.over = true;
        }
    }

    /// The subscriptions that are open for the service.
    pub(crate) fn live(&self) -> impl Iterator<Item = (&u64, &OpenSubscription)> {
        self.open.iter().filter(|(_, s)| !s.over)
    }
}

impl Consumer {
    /// CREATING, ACTIVE or DELETING now; `None` once a deregistered consumer is gone.
    pub(crate) fn status(&self, transition: Duration) -> Option<&'static str> {
        match self.deregistered_at {
            Some(at) if at.elapsed() >= transition => None,
            Some(_) => Some("DELETING"),
            None if self.registered_at.elapsed() < transition => Some("CREATING"),
            None => Some("ACTIVE"),
        }
    }
}
