//! The counting DynamoDB endpoint against dynalite: what it bills for each operation, and that the
//! client sees the answers it would have seen without it.

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use leasehold_testkit::dynamo_meter::{DynamoMeter, OperationCost, totals};
use leasehold_testkit::{Service, create_lease_table, endpoint, sdk_config};

fn key(k: &str) -> AttributeValue {
    AttributeValue::S(k.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bills_reads_and_writes_as_dynamodb_would() {
    let meter = DynamoMeter::start(&endpoint(Service::DynamoDb)).await;
    let client = aws_sdk_dynamodb::Client::new(&sdk_config(meter.endpoint()).await);
    let table = create_lease_table(&client, "meter").await;
    meter.reset();

    // "lease_key" (9) + "a" (1) + "v" (1) + 2000 = 2011 bytes: 2 write units.
    let value = "x".repeat(2000);
    client
        .put_item()
        .table_name(&table)
        .item("lease_key", key("a"))
        .item("v", AttributeValue::S(value.clone()))
        .send()
        .await
        .expect("put");
    // Consistent: 1 unit; eventual: half.
    let got = client.get_item().table_name(&table).key("lease_key", key("a")).consistent_read(true).send().await;
    assert_eq!(got.expect("get").item.expect("item")["v"], AttributeValue::S(value.clone()));
    client.get_item().table_name(&table).key("lease_key", key("a")).send().await.expect("get");
    // Grows the item to 9 + 1 + 1 + 5000 = 5011 bytes: 5 units. The client asked for nothing back.
    let updated = client
        .update_item()
        .table_name(&table)
        .key("lease_key", key("a"))
        .update_expression("SET v = :v")
        .expression_attribute_values(":v", AttributeValue::S("y".repeat(5000)))
        .send()
        .await
        .expect("update");
    assert!(updated.attributes.is_none(), "the meter's ALL_NEW leaked to the client: {updated:?}");
    // A client that asks for the new item still gets it.
    let asked = client
        .update_item()
        .table_name(&table)
        .key("lease_key", key("b"))
        .update_expression("SET v = :v")
        .expression_attribute_values(":v", AttributeValue::S("z".repeat(100)))
        .return_values(ReturnValue::AllNew)
        .send()
        .await
        .expect("update b");
    assert_eq!(asked.attributes.expect("attributes")["v"], AttributeValue::S("z".repeat(100)));
    // A failed condition costs the write of the 5011-byte item: 5 units.
    let failed = client
        .update_item()
        .table_name(&table)
        .key("lease_key", key("a"))
        .update_expression("SET v = :v")
        .condition_expression("attribute_not_exists(lease_key)")
        .expression_attribute_values(":v", AttributeValue::S("w".into()))
        .send()
        .await;
    assert!(failed.is_err(), "the condition should have failed");
    // A consistent scan of 5011 + 111 bytes: 2 units.
    let scanned = client.scan().table_name(&table).consistent_read(true).send().await.expect("scan");
    assert_eq!(scanned.items.expect("items").len(), 2);

    let snapshot = meter.snapshot();
    let cost = |op: &str| snapshot.get(op).copied().unwrap_or_default();
    assert_eq!(cost("PutItem"), OperationCost { requests: 1, read_units: 0.0, write_units: 2.0 });
    assert_eq!(cost("GetItem"), OperationCost { requests: 2, read_units: 1.5, write_units: 0.0 });
    assert_eq!(cost("UpdateItem"), OperationCost { requests: 3, read_units: 0.0, write_units: 5.0 + 1.0 + 5.0 });
    assert_eq!(cost("Scan"), OperationCost { requests: 1, read_units: 2.0, write_units: 0.0 });
    assert_eq!(totals(&snapshot).requests, 7);

    meter.reset();
    assert!(meter.snapshot().is_empty(), "reset leaves counts: {:?}", meter.snapshot());
}
