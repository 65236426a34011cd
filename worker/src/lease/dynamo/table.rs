//! Creating a lease table and waiting for it to be usable.

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus, Tag,
};

use super::errors::{Request, classify};
use crate::lease::error::{LeaseError, Result};
use crate::lease::row::attr;

/// Creates the lease table (hash key `lease_key`, on-demand billing, with `tags`) unless it exists,
/// then waits up to `wait` for it to be ACTIVE. True when this call created it.
pub async fn ensure_table(client: &Client, table: &str, tags: &[(String, String)], wait: Duration) -> Result<bool> {
    let request = |operation| Request { table, key: None, operation };
    let created = match describe_status(client, table).await? {
        Some(_) => false,
        None => {
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
            let created = client
                .create_table()
                .table_name(table)
                .billing_mode(BillingMode::PayPerRequest)
                .attribute_definitions(definition)
                .key_schema(key)
                .set_tags((!tags.is_empty()).then_some(tags))
                .send()
                .await;
            match created {
                Ok(_) => true,
                // Another worker created it between our describe and our create.
                Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_in_use_exception()) => false,
                Err(e) => return Err(classify(e, request("create table"))),
            }
        }
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
