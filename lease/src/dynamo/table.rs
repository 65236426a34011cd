//! Creating a lease table and waiting for it to be usable.

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ProvisionedThroughput, ScalarAttributeType,
    TableDescription, TableStatus, Tag,
};

use super::errors::{Request, classify};
use crate::error::{LeaseError, Result};
use crate::row::attr;

/// How a new lease table is billed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableBilling {
    /// On-demand (PAY_PER_REQUEST).
    OnDemand,
    /// Provisioned with this many read and write capacity units.
    Provisioned {
        /// Read capacity units.
        read: i64,
        /// Write capacity units.
        write: i64,
    },
}

/// Creates the lease table (hash key `lease_key`) with `tags`, without waiting for it. False when it
/// already existed (created meanwhile by someone else).
pub async fn create_table(
    client: &Client,
    table: &str,
    billing: TableBilling,
    tags: &[(String, String)],
) -> Result<bool> {
    let definition = AttributeDefinition::builder()
        .attribute_name(attr::LEASE_KEY)
        .attribute_type(ScalarAttributeType::S)
        .build()
        .map_err(|e| invalid(table, e))?;
    let key = KeySchemaElement::builder()
        .attribute_name(attr::LEASE_KEY)
        .key_type(KeyType::Hash)
        .build()
        .map_err(|e| invalid(table, e))?;
    let tags = tags
        .iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build().map_err(|e| invalid(table, e)))
        .collect::<Result<Vec<_>>>()?;
    let request = client
        .create_table()
        .table_name(table)
        .attribute_definitions(definition)
        .key_schema(key)
        .set_tags((!tags.is_empty()).then(|| tags.clone()));
    let request = match billing {
        TableBilling::OnDemand => request.billing_mode(BillingMode::PayPerRequest),
        TableBilling::Provisioned { read, write } => {
            request.billing_mode(BillingMode::Provisioned).provisioned_throughput(
                ProvisionedThroughput::builder()
                    .read_capacity_units(read)
                    .write_capacity_units(write)
                    .build()
                    .map_err(|e| invalid(table, e))?,
            )
        }
    };
    match request.send().await {
        Ok(out) => {
            // Some implementations (dynalite among them) ignore tags given to CreateTable; tagging again
            // is harmless where they were kept, and the tags are what later proves whose table it is.
            if let Some(arn) = out.table_description.and_then(|t| t.table_arn).filter(|_| !tags.is_empty())
                && let Err(e) = client.tag_resource().resource_arn(arn).set_tags(Some(tags)).send().await
            {
                let error = aws_sdk_dynamodb::error::DisplayErrorContext(e);
                tracing::warn!(table, error = %error, "could not tag the new lease table");
            }
            Ok(true)
        }
        // Another worker or operator created it between a describe and this create.
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_in_use_exception()) => Ok(false),
        Err(e) => Err(classify(e, Request { table, key: None, operation: "create table" })),
    }
}

/// Creates the lease table (on-demand, with `tags`) unless it exists, then waits up to `wait` for it to
/// be ACTIVE. True when this call created it.
pub async fn ensure_table(client: &Client, table: &str, tags: &[(String, String)], wait: Duration) -> Result<bool> {
    let created = match describe_status(client, table).await? {
        Some(_) => false,
        None => create_table(client, table, TableBilling::OnDemand, tags).await?,
    };
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if describe_status(client, table).await? == Some(TableStatus::Active) {
            return Ok(created);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(LeaseError::Service {
                table: table.into(),
                code: "TableNotActive".into(),
                message: format!("table did not become ACTIVE within {wait:?}"),
                retryable: true,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Why an existing table is not a lease table, if it is not: a lease table's key is one string hash key
/// named `lease_key` (what [`create_table`] creates). Reading or writing rows of any other table is
/// refused.
pub fn not_a_lease_table(table: &TableDescription) -> Option<String> {
    let keys: Vec<String> =
        table.key_schema().iter().map(|k| format!("{} ({})", k.attribute_name(), k.key_type().as_str())).collect();
    let hash_is_lease_key = matches!(table.key_schema(), [only] if only.attribute_name() == attr::LEASE_KEY
        && *only.key_type() == KeyType::Hash);
    let lease_key_is_string = table
        .attribute_definitions()
        .iter()
        .any(|a| a.attribute_name() == attr::LEASE_KEY && *a.attribute_type() == ScalarAttributeType::S);
    (!(hash_is_lease_key && lease_key_is_string))
        .then(|| if keys.is_empty() { "no key schema".to_string() } else { format!("key {}", keys.join(", ")) })
}

async fn describe_status(client: &Client, table: &str) -> Result<Option<TableStatus>> {
    match client.describe_table().table_name(table).send().await {
        Ok(out) => Ok(out.table.and_then(|t| t.table_status).or(Some(TableStatus::Creating))),
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => Ok(None),
        Err(e) => Err(classify(e, Request { table, key: None, operation: "describe table" })),
    }
}

fn invalid(table: &str, error: impl std::fmt::Display) -> LeaseError {
    LeaseError::Service {
        table: table.into(),
        code: "InvalidRequest".into(),
        message: error.to_string(),
        retryable: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(keys: &[(&str, KeyType)], types: &[(&str, ScalarAttributeType)]) -> TableDescription {
        let schema = keys
            .iter()
            .map(|(name, kind)| KeySchemaElement::builder().attribute_name(*name).key_type(kind.clone()).build())
            .collect::<std::result::Result<Vec<_>, _>>()
            .expect("key schema");
        let definitions = types
            .iter()
            .map(|(name, kind)| {
                AttributeDefinition::builder().attribute_name(*name).attribute_type(kind.clone()).build()
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .expect("attribute definitions");
        TableDescription::builder().set_key_schema(Some(schema)).set_attribute_definitions(Some(definitions)).build()
    }

    #[test]
    fn only_a_string_hash_key_named_lease_key_is_a_lease_table() {
        let lease = table(&[("lease_key", KeyType::Hash)], &[("lease_key", ScalarAttributeType::S)]);
        assert_eq!(not_a_lease_table(&lease), None);
        let other = table(&[("id", KeyType::Hash)], &[("id", ScalarAttributeType::S)]);
        assert_eq!(not_a_lease_table(&other).as_deref(), Some("key id (HASH)"));
        let numbered = table(&[("lease_key", KeyType::Hash)], &[("lease_key", ScalarAttributeType::N)]);
        assert!(not_a_lease_table(&numbered).is_some());
        let ranged = table(
            &[("lease_key", KeyType::Hash), ("at", KeyType::Range)],
            &[("lease_key", ScalarAttributeType::S), ("at", ScalarAttributeType::N)],
        );
        assert_eq!(not_a_lease_table(&ranged).as_deref(), Some("key lease_key (HASH), at (RANGE)"));
        assert_eq!(not_a_lease_table(&TableDescription::builder().build()).as_deref(), Some("no key schema"));
    }
}
