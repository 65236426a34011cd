//! Window consumers (`spec.window`) as the workers see them: the end pinned, the table named
//! (docs/operations.md, "Replay").

use std::borrow::Cow;

use kube::ResourceExt;
use leasehold_crds::{
    BillingMode, DeletionPolicy, END_NOW, LeaseTableSpec, StreamConsumer, StreamConsumerSpec, format_time_ms,
    window_table_name,
};

/// Writes into `spec` (the workers' copy of `consumer`'s) what a window's workers need decided for
/// them: `end: now` pinned to the resource's creation time (every restart agrees on it), and the lease
/// table the operator names for the window. A spec without `window` is left as it is.
pub fn pin_for_workers(consumer: &StreamConsumer, spec: &mut StreamConsumerSpec) {
    let Some(window) = spec.window.as_mut() else { return };
    if window.end == END_NOW
        && let Some(created) = &consumer.metadata.creation_timestamp
    {
        window.end = format_time_ms(created.0.as_millisecond());
    }
    // The worker itself never deletes a table; the operator does, per window.deletionPolicy.
    spec.lease_table = Some(window_table(consumer, DeletionPolicy::Retain));
}

/// The name of `consumer`'s window table (a StreamConsumer is namespaced: the API server always sets
/// its namespace).
pub fn table_name(consumer: &StreamConsumer) -> String {
    window_table_name(&consumer.namespace().unwrap_or_default(), &consumer.name_any())
}

/// The lease table of `consumer`'s window, on demand, under `policy`.
fn window_table(consumer: &StreamConsumer, policy: DeletionPolicy) -> LeaseTableSpec {
    LeaseTableSpec {
        name: table_name(consumer),
        billing_mode: Some(BillingMode::PayPerRequest),
        deletion_policy: Some(policy),
        read_capacity: None,
        write_capacity: None,
    }
}

/// `consumer` as the operator's stages see it: a window consumer carries its window's lease table
/// (named by [`window_table_name`], policy `window.deletionPolicy`, default `Delete`) as `leaseTable`,
/// so the table stage creates it, the rows are read and the finalizer applies its policy as for any
/// table. A consumer without `window` is borrowed as it is.
pub fn with_table(consumer: &StreamConsumer) -> Cow<'_, StreamConsumer> {
    let Some(window) = &consumer.spec.window else { return Cow::Borrowed(consumer) };
    let mut view = consumer.clone();
    view.spec.lease_table = Some(window_table(consumer, window.table_policy()));
    Cow::Owned(view)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn consumer(window: &str) -> StreamConsumer {
        let spec: StreamConsumerSpec =
            serde_yaml_ng::from_str(&format!("streams: [{{name: orders}}]\nprocessor: {{stdout: {{}}}}\n{window}"))
                .expect("spec");
        let mut consumer = StreamConsumer::new("orders-replay", spec);
        consumer.metadata.namespace = Some("shop".into());
        consumer.metadata.creation_timestamp = Some(Time("2026-12-03T15:00:00Z".parse().expect("time")));
        consumer
    }

    #[test]
    fn now_is_pinned_to_the_creation_time_and_the_table_named() {
        let c = consumer("window: {start: '2026-12-03T14:00:00Z', end: now}\n");
        let mut spec = c.spec.clone();
        pin_for_workers(&c, &mut spec);
        let window = spec.window.as_ref().expect("window");
        assert_eq!(window.end, "2026-12-03T15:00:00.000Z");
        assert_eq!(spec.lease_table.as_ref().map(|t| t.name.as_str()), Some("leasehold-window-shop-orders-replay"));
        let bounds = window.bounds(None).expect("a concrete end the worker reads");
        assert_eq!(bounds.end_ms - bounds.start_ms, 3_600_000);
        let mut again = c.spec.clone();
        pin_for_workers(&c, &mut again);
        assert_eq!(again, spec, "every reconcile pins the same end");
    }

    #[test]
    fn the_stages_see_the_window_table_with_its_policy() {
        let c = consumer("window: {start: '2026-12-03T14:00:00Z', end: now}\n");
        let table = with_table(&c).spec.lease_table.clone().expect("a table");
        assert_eq!(table.name, "leasehold-window-shop-orders-replay");
        assert_eq!(table.deletion_policy, Some(DeletionPolicy::Delete), "Delete by default");
        let kept = consumer("window: {start: '2026-12-03T14:00:00Z', end: now, deletionPolicy: Retain}\n");
        assert_eq!(
            with_table(&kept).spec.lease_table.clone().and_then(|t| t.deletion_policy),
            Some(DeletionPolicy::Retain)
        );
        assert!(matches!(with_table(&consumer("")), Cow::Borrowed(_)));
    }

    #[test]
    fn a_live_spec_is_left_as_it_is() {
        let c = consumer("");
        let mut spec = c.spec.clone();
        pin_for_workers(&c, &mut spec);
        assert_eq!(spec, c.spec);
    }
}
