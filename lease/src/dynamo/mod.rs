//! The DynamoDB lease store: one table shared by every worker of a consumer.

mod convert;
mod errors;
mod table;

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};

use super::checkpoint::Checkpoint;
use super::error::{LeaseError, Result};
use super::key::LeaseKey;
use super::observer::{Observer, ensure_holder};
use super::progress::{Progress, ProgressRows, decode_progress, encode_progress};
use super::row::{
    Lease, Member, NewLease, attr, changes_key, decode, decode_requeue_secret, decode_row, encode_new,
    encode_replacement, encode_requeue_row, member_key, member_row_key, requeue_key_row,
};
use super::settings::LeaseSettings;
use super::{GroupRows, LeasePage, LeaseStore, PageToken, ShardLeases};
// `from_item` also for the fuzz targets (`internals::parse`).
pub use convert::from_item;
use convert::to_item;
use errors::{Request, classify};
pub use table::{TableBilling, create_table, ensure_table, not_a_lease_table};

/// A [`LeaseStore`] over a DynamoDB table with hash key `lease_key`.
#[derive(Debug)]
pub struct DynamoLeaseStore {
    client: Client,
    table: String,
    settings: LeaseSettings,
    observer: Observer,
}

/// One conditional UpdateItem: what to change, on what condition, with which values.
struct Update {
    operation: &'static str,
    expression: String,
    condition: &'static str,
    values: Vec<(&'static str, AttributeValue)>,
}

/// An update expression of `set` (a `SET ...` clause) and `remove` (attribute names, possibly none)
/// that also writes `checkpoint`: its sub-sequence is set inside an aggregate and removed otherwise.
fn checkpoint_expression(
    set: &str,
    remove: &str,
    checkpoint: &Checkpoint,
    values: &mut Vec<(&'static str, AttributeValue)>,
) -> String {
    values.push((":checkpoint", AttributeValue::S(checkpoint.attribute())));
    let mut set = format!("{set}, {} = :checkpoint", attr::CHECKPOINT);
    let mut remove: Vec<&str> = if remove.is_empty() { Vec::new() } else { vec![remove] };
    match checkpoint.sub_sequence() {
        Some(sub_sequence) => {
            values.push((":subsequence", AttributeValue::N(sub_sequence.to_string())));
            set.push_str(&format!(", {} = :subsequence", attr::CHECKPOINT_SUBSEQUENCE));
        }
        None => remove.push(attr::CHECKPOINT_SUBSEQUENCE),
    }
    if remove.is_empty() { set } else { format!("{set} REMOVE {}", remove.join(", ")) }
}

/// `set` (a `SET ...` clause) that also writes the holder's lag carried by `held`, when it measured
/// one: the lag rides on writes the holder makes anyway.
fn lag_expression(set: &str, held: &Lease, values: &mut Vec<(&'static str, AttributeValue)>) -> String {
    let mut set = match held.lag_ms {
        Some(lag_ms) => {
            values.push((":lag", AttributeValue::N(lag_ms.to_string())));
            format!("{set}, {} = :lag", attr::LAG_MS)
        }
        None => set.to_string(),
    };
    // The load rides on the same writes (see `lease::load`).
    let placeholders = [":load_records", ":load_bytes", ":load_busy"];
    for ((name, value), placeholder) in
        held.load.as_ref().map(super::row::load_values).into_iter().flatten().zip(placeholders)
    {
        values.push((placeholder, AttributeValue::N(value.to_string())));
        set.push_str(&format!(", {name} = {placeholder}"));
    }
    // A window's records count too (see `attr::WINDOW_RECORDS`).
    if let Some(records) = held.window_records {
        values.push((":window_records", AttributeValue::N(records.to_string())));
        set.push_str(&format!(", {} = :window_records", attr::WINDOW_RECORDS));
    }
    set
}

const HOLDER_CONDITION: &str = "lease_owner = :me AND lease_counter = :counter";

impl DynamoLeaseStore {
    /// A store over `table`, writing as the worker described by `settings`. The table must exist (see
    /// [`ensure_table`]).
    pub fn new(client: Client, table: impl Into<String>, settings: LeaseSettings) -> Self {
        Self { client, table: table.into(), settings, observer: Observer::default() }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    fn request<'a>(&'a self, key: Option<&'a LeaseKey>, operation: &'static str) -> Request<'a> {
        Request { table: &self.table, key, operation }
    }

    fn member_key_value(owner: &str) -> AttributeValue {
        AttributeValue::S(member_row_key(owner))
    }

    fn key_value(key: &LeaseKey) -> AttributeValue {
        AttributeValue::S(key.to_string())
    }

    /// `:me`, `:counter` (of `held`) and `:one`: the values of every write this worker conditions on a
    /// row's counter.
    fn holder_values(&self, held: &Lease) -> Vec<(&'static str, AttributeValue)> {
        vec![
            (":me", AttributeValue::S(self.settings.owner.clone())),
            (":counter", AttributeValue::N(held.counter.to_string())),
            (":one", AttributeValue::N("1".into())),
        ]
    }

    /// One consistent Scan page, of segment `(segment, total)` when given.
    async fn scan_page(
        &self,
        segments: Option<(u32, u32)>,
        start: Option<&PageToken>,
        limit: i32,
    ) -> Result<LeasePage> {
        let start_key =
            start.map(|token| HashMap::from([(attr::LEASE_KEY.to_string(), AttributeValue::S(token.0.clone()))]));
        let mut request = self
            .client
            .scan()
            .table_name(&self.table)
            .consistent_read(true)
            .limit(limit.max(1))
            .set_exclusive_start_key(start_key);
        if let Some((segment, total)) = segments {
            let as_i32 = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
            request = request.segment(as_i32(segment)).total_segments(as_i32(total));
        }
        let out = request.send().await.map_err(|e| classify(e, self.request(None, "list")))?;
        let mut page = LeasePage::default();
        for item in out.items.unwrap_or_default() {
            page.push(decode_row(&from_item(&item)));
        }
        self.observer.observe_page(&mut page, self.settings.clock.monotonic(), self.settings.duration);
        page.next = out
            .last_evaluated_key
            .and_then(|key| key.get(attr::LEASE_KEY).and_then(|v| v.as_s().ok()).cloned())
            .map(PageToken);
        Ok(page)
    }

    async fn update(&self, key: &LeaseKey, update: Update) -> Result<Lease> {
        let mut request = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::LEASE_KEY, Self::key_value(key))
            .update_expression(update.expression)
            .condition_expression(update.condition)
            .return_values(ReturnValue::AllNew);
        for (name, value) in update.values {
            request = request.expression_attribute_values(name, value);
        }
        let result = match request.send().await {
            Ok(out) => Ok(decode(&from_item(&out.attributes.unwrap_or_default()))?),
            Err(e) => Err(classify(e, self.request(Some(key), update.operation))),
        };
        self.observer.after_write(key, result, self.settings.clock.monotonic())
    }

    /// Deletes the row `key` if its counter is still `counter`: the one conditional delete, of shard
    /// and membership rows alike.
    async fn delete_if_unchanged(&self, key: &LeaseKey, counter: u64, operation: &'static str) -> Result<()> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .key(attr::LEASE_KEY, Self::key_value(key))
            .condition_expression("lease_counter = :counter")
            .expression_attribute_values(":counter", AttributeValue::N(counter.to_string()))
            .send()
            .await
            .map_err(|e| classify(e, self.request(Some(key), operation)))?;
        self.observer.forget(key);
        Ok(())
    }
}

#[async_trait]
impl ShardLeases for DynamoLeaseStore {
    fn settings(&self) -> &LeaseSettings {
        &self.settings
    }

    async fn create_if_absent(&self, lease: &NewLease) -> Result<bool> {
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(to_item(&encode_new(lease))))
            .condition_expression("attribute_not_exists(lease_key)")
            .send()
            .await;
        match put {
            Ok(_) => Ok(true),
            Err(e) => match classify(e, self.request(Some(&lease.key), "create")) {
                LeaseError::ConditionFailed { .. } => Ok(false),
                other => Err(other),
            },
        }
    }

    async fn replace(&self, seen: &Lease, new: &NewLease) -> Result<()> {
        if new.key != seen.key {
            return Err(LeaseError::ConditionFailed { key: seen.key.clone(), operation: "replace" });
        }
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(to_item(&encode_replacement(seen, new))))
            .condition_expression("lease_counter = :counter")
            .expression_attribute_values(":counter", AttributeValue::N(seen.counter.to_string()))
            .send()
            .await
            .map_err(|e| classify(e, self.request(Some(&seen.key), "replace")))?;
        self.observer.forget(&seen.key);
        Ok(())
    }

    async fn get(&self, key: &LeaseKey) -> Result<Option<Lease>> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(attr::LEASE_KEY, Self::key_value(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify(e, self.request(Some(key), "get")))?;
        let Some(item) = out.item else { return Ok(None) };
        let lease = decode(&from_item(&item))?;
        self.observer.observe(&lease, self.settings.clock.monotonic());
        Ok(Some(lease))
    }

    async fn acquire(&self, seen: &Lease) -> Result<Lease> {
        self.observer.may_acquire(seen, &self.settings)?;
        let mut values = self.holder_values(seen);
        values.push((":expiry", AttributeValue::N(self.settings.expiry_ms().to_string())));
        let update = Update {
            operation: "acquire",
            expression: "SET lease_owner = :me, lease_expiry = :expiry, lease_counter = lease_counter + :one".into(),
            condition: "lease_counter = :counter",
            values,
        };
        self.update(&seen.key, update).await
    }

    async fn renew(&self, held: &Lease) -> Result<Lease> {
        ensure_holder(held, &self.settings)?;
        let mut values = self.holder_values(held);
        values.push((":expiry", AttributeValue::N(self.settings.expiry_ms().to_string())));
        let set = "SET lease_expiry = :expiry, lease_counter = lease_counter + :one";
        let expression = lag_expression(set, held, &mut values);
        let update = Update { operation: "renew", expression, condition: HOLDER_CONDITION, values };
        self.update(&held.key, update).await
    }

    async fn checkpoint(&self, held: &Lease, checkpoint: &Checkpoint) -> Result<Lease> {
        ensure_holder(held, &self.settings)?;
        let mut values = self.holder_values(held);
        let set = lag_expression("SET lease_counter = lease_counter + :one", held, &mut values);
        let expression = checkpoint_expression(&set, "", checkpoint, &mut values);
        let update = Update { operation: "checkpoint", expression, condition: HOLDER_CONDITION, values };
        self.update(&held.key, update).await
    }

    async fn release(&self, held: &Lease, final_checkpoint: Option<&Checkpoint>) -> Result<Lease> {
        ensure_holder(held, &self.settings)?;
        let mut values = self.holder_values(held);
        let set = "SET lease_counter = lease_counter + :one";
        let remove = "lease_owner, lease_expiry, handoff_to";
        let expression = match final_checkpoint {
            Some(checkpoint) => checkpoint_expression(set, remove, checkpoint, &mut values),
            None => format!("{set} REMOVE {remove}"),
        };
        let update = Update { operation: "release", expression, condition: HOLDER_CONDITION, values };
        self.update(&held.key, update).await
    }

    async fn release_to(&self, held: &Lease, to: &str, final_checkpoint: Option<&Checkpoint>) -> Result<Lease> {
        ensure_holder(held, &self.settings)?;
        let mut values = self.holder_values(held);
        values.push((":to", AttributeValue::S(to.into())));
        values.push((":expiry", AttributeValue::N(self.settings.expiry_ms().to_string())));
        let set = "SET lease_owner = :to, lease_expiry = :expiry, lease_counter = lease_counter + :one";
        let expression = match final_checkpoint {
            Some(checkpoint) => checkpoint_expression(set, "handoff_to", checkpoint, &mut values),
            None => format!("{set} REMOVE handoff_to"),
        };
        let update = Update { operation: "release to", expression, condition: HOLDER_CONDITION, values };
        self.update(&held.key, update).await
    }

    async fn request_handoff(&self, seen: &Lease) -> Result<Lease> {
        let Some(holder) = &seen.owner else {
            return Err(LeaseError::ConditionFailed { key: seen.key.clone(), operation: "request handoff" });
        };
        let mut values = vec![
            (":me", AttributeValue::S(self.settings.owner.clone())),
            (":counter", AttributeValue::N(seen.counter.to_string())),
            (":holder", AttributeValue::S(holder.clone())),
        ];
        let condition = match &seen.handoff_to {
            None => "lease_counter = :counter AND lease_owner = :holder AND attribute_not_exists(handoff_to)",
            Some(previous) => {
                values.push((":previous", AttributeValue::S(previous.clone())));
                "lease_counter = :counter AND lease_owner = :holder AND handoff_to = :previous"
            }
        };
        let update =
            Update { operation: "request handoff", expression: "SET handoff_to = :me".into(), condition, values };
        self.update(&seen.key, update).await
    }

    async fn withdraw_handoff(&self, seen: &Lease) -> Result<bool> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::LEASE_KEY, Self::key_value(&seen.key))
            .update_expression(format!("REMOVE {}", attr::HANDOFF_TO))
            .condition_expression(format!("{} = :counter AND {} = :me", attr::LEASE_COUNTER, attr::HANDOFF_TO))
            .expression_attribute_values(":counter", AttributeValue::N(seen.counter.to_string()))
            .expression_attribute_values(":me", AttributeValue::S(self.settings.owner.clone()))
            .send()
            .await;
        refused_as_false(result.map_err(|e| classify(e, self.request(Some(&seen.key), "withdraw handoff"))))
    }

    async fn delete(&self, seen: &Lease) -> Result<()> {
        self.delete_if_unchanged(&seen.key, seen.counter, "delete").await
    }
}

/// A conditional write's outcome as "did it write": a refused condition is `false`, not an error.
fn refused_as_false<T>(result: Result<T>) -> Result<bool> {
    match result {
        Ok(_) => Ok(true),
        Err(LeaseError::ConditionFailed { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

#[async_trait]
impl ProgressRows for DynamoLeaseStore {
    async fn read_progress(&self, key: &LeaseKey) -> Result<Progress> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(attr::LEASE_KEY, Self::key_value(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify(e, self.request(Some(key), "read progress")))?;
        match out.item {
            None => Ok(Progress::default()),
            Some(item) => Ok(decode_progress(&from_item(&item))?),
        }
    }

    async fn write_progress(&self, key: &LeaseKey, progress: &Progress) -> Result<u64> {
        let next = progress.counter.map_or(1, |c| c + 1);
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(to_item(&encode_progress(key, progress, next))));
        let put = match progress.counter {
            None => {
                put.condition_expression("attribute_not_exists(#k)").expression_attribute_names("#k", attr::LEASE_KEY)
            }
            Some(counter) => put
                .condition_expression("#c = :c")
                .expression_attribute_names("#c", attr::LEASE_COUNTER)
                .expression_attribute_values(":c", AttributeValue::N(counter.to_string())),
        };
        put.send().await.map_err(|e| classify(e, self.request(Some(key), "write progress")))?;
        Ok(next)
    }
}

#[async_trait]
impl GroupRows for DynamoLeaseStore {
    async fn heartbeat(&self) -> Result<()> {
        let mut update =
            "SET lease_owner = :me, lease_expiry = :expiry, lease_counter = if_not_exists(lease_counter, :zero) + :one"
                .to_string();
        let mut request = self.client.update_item();
        if let Some(address) = &self.settings.address {
            update.push_str(", member_address = :address");
            request = request.expression_attribute_values(":address", AttributeValue::S(address.clone()));
        }
        request
            .table_name(&self.table)
            .key(attr::LEASE_KEY, Self::member_key_value(&self.settings.owner))
            .update_expression(update)
            .condition_expression("attribute_not_exists(lease_key) OR lease_owner = :me")
            .expression_attribute_values(":me", AttributeValue::S(self.settings.owner.clone()))
            .expression_attribute_values(":expiry", AttributeValue::N(self.settings.expiry_ms().to_string()))
            .expression_attribute_values(":zero", AttributeValue::N("0".into()))
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .send()
            .await
            .map_err(|e| classify(e, self.request(Some(&member_key(&self.settings.owner)), "heartbeat")))?;
        Ok(())
    }

    async fn leave(&self) -> Result<()> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .key(attr::LEASE_KEY, Self::member_key_value(&self.settings.owner))
            .send()
            .await
            .map_err(|e| classify(e, self.request(None, "leave")))?;
        Ok(())
    }

    async fn announce(&self) -> Result<()> {
        let key = changes_key();
        self.client
            .update_item()
            .table_name(&self.table)
            .key(attr::LEASE_KEY, Self::key_value(&key))
            .update_expression(
                "SET lease_counter = if_not_exists(lease_counter, :zero) + :one, checkpoint = if_not_exists(checkpoint, :start)",
            )
            .expression_attribute_values(":zero", AttributeValue::N("0".into()))
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .expression_attribute_values(":start", AttributeValue::S(Checkpoint::TrimHorizon.to_string()))
            .send()
            .await
            .map_err(|e| classify(e, self.request(Some(&key), "announce")))?;
        Ok(())
    }

    async fn changes(&self) -> Result<u64> {
        let key = changes_key();
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(attr::LEASE_KEY, Self::key_value(&key))
            .consistent_read(false)
            .send()
            .await
            .map_err(|e| classify(e, self.request(Some(&key), "read changes")))?;
        let Some(item) = out.item else { return Ok(0) };
        Ok(decode(&from_item(&item))?.counter)
    }

    async fn remove_member(&self, member: &Member) -> Result<()> {
        self.delete_if_unchanged(&member_key(&member.owner), member.counter, "remove member").await
    }

    async fn mark_draining(&self, worker: &str) -> Result<bool> {
        let key = member_key(worker);
        let out = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::LEASE_KEY, Self::member_key_value(worker))
            .update_expression("SET #draining = if_not_exists(#draining, :since)")
            .condition_expression("#owner = :worker")
            .expression_attribute_names("#draining", attr::MEMBER_DRAINING)
            .expression_attribute_names("#owner", attr::LEASE_OWNER)
            .expression_attribute_values(":since", AttributeValue::N(self.settings.clock.wall_ms().to_string()))
            .expression_attribute_values(":worker", AttributeValue::S(worker.to_string()))
            .return_values(ReturnValue::UpdatedOld)
            .send()
            .await
            .map_err(|e| classify(e, self.request(Some(&key), "mark draining")))?;
        // The old value, when there was one, says the mark was already there (its time is kept).
        Ok(out.attributes.is_none_or(|old| !old.contains_key(attr::MEMBER_DRAINING)))
    }

    async fn unmark_draining(&self, worker: &str) -> Result<bool> {
        let key = member_key(worker);
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::LEASE_KEY, Self::member_key_value(worker))
            .update_expression("REMOVE #draining")
            .condition_expression("attribute_exists(#draining)")
            .expression_attribute_names("#draining", attr::MEMBER_DRAINING)
            .send()
            .await;
        refused_as_false(result.map_err(|e| classify(e, self.request(Some(&key), "remove draining mark"))))
    }

    async fn requeue_secret(&self) -> Result<String> {
        let key = requeue_key_row();
        // Read; if absent, create it unless another worker just did, then read theirs.
        for _ in 0..2 {
            let out = self
                .client
                .get_item()
                .table_name(&self.table)
                .key(attr::LEASE_KEY, Self::key_value(&key))
                .consistent_read(true)
                .send()
                .await
                .map_err(|e| classify(e, self.request(Some(&key), "read requeue key")))?;
            if let Some(item) = out.item {
                return Ok(decode_requeue_secret(&from_item(&item))?);
            }
            let secret = crate::row::new_requeue_secret();
            let put = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(to_item(&encode_requeue_row(&secret))))
                .condition_expression("attribute_not_exists(lease_key)")
                .send()
                .await;
            match put {
                Ok(_) => return Ok(secret),
                Err(e) => match classify(e, self.request(Some(&key), "create requeue key")) {
                    LeaseError::ConditionFailed { .. } => continue,
                    other => return Err(other),
                },
            }
        }
        Err(LeaseError::ConditionFailed { key, operation: "create requeue key" })
    }
}

#[async_trait]
impl LeaseStore for DynamoLeaseStore {
    async fn list_segment_page(
        &self,
        segment: u32,
        total: u32,
        start: Option<&PageToken>,
        limit: i32,
    ) -> Result<LeasePage> {
        // One segment of one is the whole table: a plain Scan (TotalSegments 1 is legal, but pointless).
        let segments = (total > 1).then_some((segment, total));
        self.scan_page(segments, start, limit).await
    }
}
