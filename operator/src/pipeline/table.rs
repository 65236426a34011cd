//! The lease table: created (on demand, tagged with its owner) unless it exists; deleted on the
//! resource's deletion only under `deletionPolicy: Delete` and only if its tags prove this resource
//! created it.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::TableStatus;
use kube::ResourceExt;
use leasehold_crds::{BillingMode as SpecBilling, LeaseTableSpec, StreamConsumer};
use leasehold_worker::lease::{TableBilling, create_table, not_a_lease_table};

use super::table_capacity::Capacity;
use crate::error::{Error, Result};

/// Tag keys proving which resource created a table.
pub const TAG_NAMESPACE: &str = "leasehold.io/namespace";
/// See [`TAG_NAMESPACE`].
pub const TAG_NAME: &str = "leasehold.io/name";
/// See [`TAG_NAMESPACE`].
pub const TAG_UID: &str = "leasehold.io/uid";

/// The resource a table belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Namespace of the StreamConsumer.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

impl Owner {
    /// The StreamConsumer `consumer` as a table's owner (its namespace, name and UID).
    pub fn of(consumer: &StreamConsumer) -> Result<Self> {
        Ok(Self {
            namespace: consumer.namespace().ok_or(Error::MissingMeta)?,
            name: consumer.name_any(),
            uid: consumer.uid().ok_or(Error::MissingMeta)?,
        })
    }

    fn tags(&self) -> Vec<(String, String)> {
        [(TAG_NAMESPACE, &self.namespace), (TAG_NAME, &self.name), (TAG_UID, &self.uid)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }
}

/// What the table looks like now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableState {
    /// Usable.
    Active,
    /// Being created (by us, just now, or by someone else).
    Creating,
    /// In another state (UPDATING, DELETING, ...).
    Other(String),
}

fn failed(table: &str, error: impl std::fmt::Display) -> Error {
    Error::Table { table: table.into(), message: error.to_string() }
}

/// Describes the table, creating it first if it does not exist (with `provisioned` capacity under
/// `billingMode: PROVISIONED`). Returns its state and whether this call created it.
pub async fn ensure(
    client: &Client,
    spec: &LeaseTableSpec,
    owner: &Owner,
    provisioned: Capacity,
) -> Result<(TableState, bool)> {
    let table = spec.name.as_str();
    match client.describe_table().table_name(table).send().await {
        Ok(out) => {
            let description = out.table.unwrap_or_else(|| aws_sdk_dynamodb::types::TableDescription::builder().build());
            if let Some(found) = not_a_lease_table(&description) {
                return Err(Error::NotLeaseTable { table: table.into(), found });
            }
            Ok((state(description.table_status), false))
        }
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => {
            let created = create(client, spec, owner, provisioned).await?;
            Ok((TableState::Creating, created))
        }
        Err(e) => Err(failed(table, crate::aws::error_message(&e))),
    }
}

fn state(status: Option<TableStatus>) -> TableState {
    match status {
        Some(TableStatus::Active) => TableState::Active,
        Some(TableStatus::Creating) | None => TableState::Creating,
        Some(other) => TableState::Other(other.as_str().to_string()),
    }
}

async fn create(client: &Client, spec: &LeaseTableSpec, owner: &Owner, provisioned: Capacity) -> Result<bool> {
    let billing = match spec.billing_mode.unwrap_or(SpecBilling::PayPerRequest) {
        SpecBilling::PayPerRequest => TableBilling::OnDemand,
        SpecBilling::Provisioned => TableBilling::Provisioned { read: provisioned.read, write: provisioned.write },
    };
    create_table(client, &spec.name, billing, &owner.tags()).await.map_err(|e| failed(&spec.name, e))
}

/// What a deletion did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deletion {
    /// The table was deleted.
    Deleted,
    /// The table was kept: its tags do not name this resource.
    KeptNotOurs,
    /// There was no table.
    Missing,
}

/// Deletes the table if its tags name `owner` (same namespace, name and UID).
pub async fn delete_if_ours(client: &Client, table: &str, owner: &Owner) -> Result<Deletion> {
    let arn = match client.describe_table().table_name(table).send().await {
        Ok(out) => out.table.and_then(|t| t.table_arn).unwrap_or_default(),
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => {
            return Ok(Deletion::Missing);
        }
        Err(e) => return Err(failed(table, crate::aws::error_message(&e))),
    };
    if !is_ours(client, table, &arn, owner).await? {
        return Ok(Deletion::KeptNotOurs);
    }
    match client.delete_table().table_name(table).send().await {
        Ok(_) => Ok(Deletion::Deleted),
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => Ok(Deletion::Missing),
        Err(e) => Err(failed(table, crate::aws::error_message(&e))),
    }
}

/// True when the tags of the table `table` (ARN `arn`) name `owner` (same namespace, name and UID).
pub async fn is_ours(client: &Client, table: &str, arn: &str, owner: &Owner) -> Result<bool> {
    let tags = client
        .list_tags_of_resource()
        .resource_arn(arn)
        .send()
        .await
        .map_err(|e| failed(table, crate::aws::error_message(&e)))?
        .tags
        .unwrap_or_default();
    Ok(owner.tags().iter().all(|(k, v)| tags.iter().any(|t| t.key == *k && t.value == *v)))
}
