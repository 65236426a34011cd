//! What a test can change and read on a running fan-out server.

use std::sync::Arc;
use std::time::Duration;

use super::state::{Ending, PendingFault, Shared};

/// An error SubscribeToShard can be made to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanOutFault {
    /// `ResourceInUseException`, as for a second subscription of one consumer and shard.
    ResourceInUse,
    /// `LimitExceededException`, as for more than one call per second per consumer and shard.
    LimitExceeded,
    /// `InternalFailureException`, the service's own failure (only as an event-stream exception).
    InternalFailure,
}

impl FanOutFault {
    pub(crate) fn error_type(self) -> &'static str {
        match self {
            FanOutFault::ResourceInUse => "ResourceInUseException",
            FanOutFault::LimitExceeded => "LimitExceededException",
            FanOutFault::InternalFailure => "InternalFailureException",
        }
    }
}

/// A handle on a running [`super::FanOutServer`]'s behaviour and counters; clones share the server.
#[derive(Clone)]
pub struct FanOutControls {
    pub(crate) shared: Arc<Shared>,
}

fn matches(filter: Option<&str>, shard_id: &str) -> bool {
    filter.is_none_or(|f| f == shard_id)
}

impl FanOutControls {
    /// How long subscriptions opened from now on live before their stream ends (default 5 minutes).
    pub fn set_subscription_lifetime(&self, lifetime: Duration) {
        self.shared.book().settings.subscription_lifetime = lifetime;
    }

    /// Whether a call after the resubscribe window takes over an open subscription of the same consumer
    /// and shard (ending it with ResourceInUseException, as the service's documentation says) instead
    /// of being refused with ResourceInUseException while it is open (the default).
    pub fn set_takeover(&self, takeover: bool) {
        self.shared.book().settings.takeover = takeover;
    }

    /// How soon after a subscription's start another one for the same consumer and shard is refused
    /// with ResourceInUseException (default 5 s, as the service).
    pub fn set_resubscribe_window(&self, window: Duration) {
        self.shared.book().settings.resubscribe_window = window;
    }

    /// The least time between two SubscribeToShard calls for one consumer and shard before
    /// LimitExceededException (default 1 s, as the service).
    pub fn set_call_interval(&self, interval: Duration) {
        self.shared.book().settings.call_interval = interval;
    }

    /// How long a consumer stays CREATING after registration and DELETING after deregistration
    /// (default 300 ms; the service takes seconds).
    pub fn set_consumer_transition(&self, transition: Duration) {
        self.shared.book().settings.consumer_transition = transition;
    }

    /// How often an event is pushed when there are no records (default 1 s).
    pub fn set_event_interval(&self, interval: Duration) {
        self.shared.book().settings.event_interval = interval;
    }

    /// How often an idle subscription polls kinesalite for records written around this server
    /// (default 100 ms; puts through the server wake subscriptions at once).
    pub fn set_idle_poll(&self, interval: Duration) {
        self.shared.book().settings.idle_poll = interval;
    }

    /// The most records in one event (default 1000).
    pub fn set_records_per_event(&self, records: usize) {
        self.shared.book().settings.records_per_event = records.max(1);
    }

    /// The next `times` SubscribeToShard calls (for `shard_id`, or any shard) answer `fault` as an
    /// HTTP error, before any other rule is checked.
    pub fn fail_next_subscribes(&self, shard_id: Option<&str>, fault: FanOutFault, times: usize) {
        self.shared.book().faults.push(PendingFault {
            shard_id: shard_id.map(str::to_string),
            fault,
            remaining: times,
        });
    }

    /// The next subscription that opens (for `shard_id`, or any shard) sends its initial response and
    /// then nothing, ever, with its connection kept open (until dropped or the server stops).
    pub fn stall_next_subscription(&self, shard_id: Option<&str>) {
        self.shared.book().stalls.push(shard_id.map(str::to_string));
    }

    /// Cuts the connections of the open subscriptions (of `shard_id`, or all) abruptly, whether or not
    /// their clients are reading: the client sees a broken body, not an end.
    pub fn drop_subscriptions(&self, shard_id: Option<&str>) {
        self.end_open(shard_id, Ending::Cut);
    }

    /// Ends the open subscriptions (of `shard_id`, or all) with `fault` as an event-stream exception
    /// message, as the service ends a stream on its own errors.
    pub fn fail_open_subscriptions(&self, shard_id: Option<&str>, fault: FanOutFault) {
        self.end_open(shard_id, Ending::Exception(fault.error_type()));
    }

    fn end_open(&self, shard_id: Option<&str>, ending: Ending) {
        let book = self.shared.book();
        for (_, subscription) in book.live().filter(|(_, s)| matches(shard_id, &s.shard_id)) {
            let _ = subscription.ending.send(ending);
            if ending == Ending::Cut {
                subscription.connection.cancel();
            }
        }
    }

    /// How many subscriptions of `shard_id` (any consumer) were accepted since the server started.
    pub fn subscriptions_started(&self, shard_id: &str) -> usize {
        self.shared.book().started.get(shard_id).copied().unwrap_or(0)
    }

    /// How many subscriptions are open now (not ended by lifetime, fault or takeover, connection alive).
    pub fn open_subscriptions(&self) -> usize {
        self.shared.book().live().count()
    }

    /// How many records were handed to subscriptions' connections so far (a client that does not read
    /// stops this growing).
    pub fn records_pushed(&self) -> usize {
        self.shared.book().records_pushed
    }

    /// The ARNs of the consumers registered now (CREATING or ACTIVE), in order.
    pub fn registered_consumers(&self) -> Vec<String> {
        let book = self.shared.book();
        let transition = book.settings.consumer_transition;
        book.consumers
            .values()
            .filter(|c| matches!(c.status(transition), Some("CREATING" | "ACTIVE")))
            .map(|c| c.arn.clone())
            .collect()
    }
}
