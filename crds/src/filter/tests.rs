//! The rules of Lambda's "Filter rule syntax" table, each with the example it documents, a record that
//! matches it and one that does not; then Lambda's Kinesis examples, partition keys, non-JSON data and
//! refused patterns.

use serde_json::{Value, json};

use super::*;

/// (pattern over `data`, data, expected verdict).
fn table() -> Vec<(Value, Value, bool)> {
    vec![
        // Null
        (json!({"UserID": [null]}), json!({"UserID": null}), true),
        (json!({"UserID": [null]}), json!({"UserID": "u-1"}), false),
        (json!({"UserID": [null]}), json!({}), false),
        // Empty
        (json!({"LastName": [""]}), json!({"LastName": ""}), true),
        (json!({"LastName": [""]}), json!({"LastName": "Doe"}), false),
        // Equals
        (json!({"Name": ["Alice"]}), json!({"Name": "Alice"}), true),
        (json!({"Name": ["Alice"]}), json!({"Name": "alice"}), false),
        // Equals (ignore case)
        (json!({"Name": [{"equals-ignore-case": "alice"}]}), json!({"Name": "ALICE"}), true),
        (json!({"Name": [{"equals-ignore-case": "alice"}]}), json!({"Name": "Bob"}), false),
        // And
        (json!({"Location": ["New York"], "Day": ["Monday"]}), json!({"Location": "New York", "Day": "Monday"}), true),
        (json!({"Location": ["New York"], "Day": ["Monday"]}), json!({"Location": "New York", "Day": "Sunday"}), false),
        // Or
        (json!({"PaymentType": ["Credit", "Debit"]}), json!({"PaymentType": "Debit"}), true),
        (json!({"PaymentType": ["Credit", "Debit"]}), json!({"PaymentType": "Cash"}), false),
        // Or (multiple fields)
        (
            json!({"$or": [{"Location": ["New York"]}, {"Day": ["Monday"]}]}),
            json!({"Location": "Paris", "Day": "Monday"}),
            true,
        ),
        (json!({"$or": [{"Location": ["New York"]}, {"Day": ["Monday"]}]}), json!({"Location": "New York"}), true),
        (
            json!({"$or": [{"Location": ["New York"]}, {"Day": ["Monday"]}]}),
            json!({"Location": "Paris", "Day": "Friday"}),
            false,
        ),
        // Not
        (json!({"Weather": [{"anything-but": ["Raining"]}]}), json!({"Weather": "Sunny"}), true),
        (json!({"Weather": [{"anything-but": ["Raining"]}]}), json!({"Weather": "Raining"}), false),
        (json!({"Weather": [{"anything-but": ["Raining"]}]}), json!({}), false),
        (json!({"Weather": [{"anything-but": {"prefix": "Rain"}}]}), json!({"Weather": "Rainy"}), false),
        (json!({"Weather": [{"anything-but": {"prefix": "Rain"}}]}), json!({"Weather": "Snow"}), true),
        // Numeric (equals)
        (json!({"Price": [{"numeric": ["=", 100]}]}), json!({"Price": 100}), true),
        (json!({"Price": [{"numeric": ["=", 100]}]}), json!({"Price": 100.0}), true),
        (json!({"Price": [{"numeric": ["=", 100]}]}), json!({"Price": "100"}), false),
        (json!({"Price": [100]}), json!({"Price": 100.0}), true),
        // Numeric (range)
        (json!({"Price": [{"numeric": [">", 10, "<=", 20]}]}), json!({"Price": 20}), true),
        (json!({"Price": [{"numeric": [">", 10, "<=", 20]}]}), json!({"Price": 10}), false),
        (json!({"Price": [{"numeric": [">", 10, "<=", 20]}]}), json!({"Price": 20.5}), false),
        (json!({"Price": [{"numeric": ["<", 0]}]}), json!({"Price": -3.5}), true),
        // Exists
        (json!({"ProductName": [{"exists": true}]}), json!({"ProductName": "Widget"}), true),
        (json!({"ProductName": [{"exists": true}]}), json!({"Other": 1}), false),
        // Does not exist
        (json!({"ProductName": [{"exists": false}]}), json!({"Other": 1}), true),
        (json!({"ProductName": [{"exists": false}]}), json!({"ProductName": "Widget"}), false),
        // Begins with
        (json!({"Region": [{"prefix": "us-"}]}), json!({"Region": "us-east-1"}), true),
        (json!({"Region": [{"prefix": "us-"}]}), json!({"Region": "eu-west-1"}), false),
        // Ends with
        (json!({"FileName": [{"suffix": ".png"}]}), json!({"FileName": "photo.png"}), true),
        (json!({"FileName": [{"suffix": ".png"}]}), json!({"FileName": "photo.jpg"}), false),
        // A field holding a list matches when one element does.
        (json!({"Tags": ["urgent"]}), json!({"Tags": ["low", "urgent"]}), true),
        (json!({"Tags": ["urgent"]}), json!({"Tags": ["low"]}), false),
        // Lambda's Kinesis example: orders of type "buy".
        (
            json!({"order": {"type": ["buy"]}}),
            json!({"record": 12345, "order": {"type": "buy", "stock": "ANYCO", "quantity": 1000}}),
            true,
        ),
        (json!({"order": {"type": ["buy"]}}), json!({"record": 12346, "order": {"type": "sell"}}), false),
        (json!({"order": {"type": ["buy"]}}), json!({"record": 12347}), false),
        // Lambda's metadata-and-data example.
        (
            json!({"City": ["Seattle"], "Temperature": [{"numeric": ["<", 50]}]}),
            json!({"City": "Seattle", "State": "WA", "Temperature": 46, "Month": "December"}),
            true,
        ),
        // Rules on a nested object that is absent: only `exists: false` holds.
        (json!({"order": {"type": [{"exists": false}]}}), json!({"record": 1}), true),
    ]
}

#[test]
fn every_documented_rule_gives_the_documented_verdict() {
    for (pattern, data, expected) in table() {
        let filter = RecordFilter::new(&[json!({ "data": pattern })]).expect("a valid pattern");
        let bytes = serde_json::to_vec(&data).unwrap();
        assert_eq!(filter.matches("pk", &bytes), expected, "pattern {pattern} on data {data}");
    }
}

#[test]
fn partition_keys_and_several_patterns() {
    let by_key = RecordFilter::new(&[json!({"partitionKey": [{"prefix": "customer-"}]})]).unwrap();
    assert!(by_key.matches("customer-7", b"{}"));
    assert!(by_key.matches("customer-7", b"not json"), "a pattern not looking inside data matches any data");
    assert!(!by_key.matches("vendor-7", b"{}"));
    // Patterns are OR-ed, as Lambda's Filters are.
    let either = RecordFilter::new(&[json!({"partitionKey": ["a"]}), json!({"data": {"n": [1]}})]).unwrap();
    assert!(either.matches("a", b"{\"n\": 2}"));
    assert!(either.matches("b", b"{\"n\": 1}"));
    assert!(!either.matches("b", b"{\"n\": 2}"));
    // Both in one pattern: AND.
    let both = RecordFilter::new(&[json!({"partitionKey": ["a"], "data": {"n": [1]}})]).unwrap();
    assert!(both.matches("a", b"{\"n\": 1}"));
    assert!(!both.matches("a", b"{\"n\": 2}"));
}

#[test]
fn data_that_is_not_json_matches_no_pattern_looking_inside_it() {
    for pattern in [
        json!({"data": {"n": [{"exists": false}]}}),
        json!({"data": {"n": [{"anything-but": ["x"]}]}}),
        json!({"$or": [{"data": {"n": [1]}}, {"data": {"m": [{"exists": false}]}}]}),
    ] {
        let filter = RecordFilter::new(std::slice::from_ref(&pattern)).unwrap();
        assert!(!filter.matches("k", b"\x00\x01 binary"), "{pattern}");
        assert!(!filter.matches("k", b"{not json"), "{pattern}");
    }
    let filter = RecordFilter::new(&[json!({"data": {"n": [{"exists": false}]}})]).unwrap();
    assert!(filter.matches("k", b"{}"), "JSON data without the field");
}

#[test]
fn patterns_outside_the_grammar_are_refused() {
    for (pattern, says) in [
        (json!("text"), "JSON object"),
        (json!({}), "empty pattern"),
        (json!({"data": {"n": []}}), "non-empty list"),
        (json!({"data": {"n": "x"}}), "non-empty list"),
        (json!({"data": {"n": [{"regex": "x"}]}}), "unknown rule"),
        (json!({"data": {"n": [{"prefix": 1}]}}), "takes a string"),
        (json!({"data": {"n": [{"numeric": [">", "x"]}]}}), "numeric takes"),
        (json!({"data": {"n": [{"numeric": ["=", 1, "<", 2]}]}}), "stands alone"),
        (json!({"data": {"n": [{"exists": "yes"}]}}), "true or false"),
        (json!({"data": {"n": [{"prefix": "a", "suffix": "b"}]}}), "exactly one operator"),
        (json!({"$or": [{"a": [1]}]}), "two patterns"),
        (json!({"data": {"n": [{"anything-but": [{"x": 1}]}]}}), "anything-but takes"),
    ] {
        let error = RecordFilter::new(&[json!({"partitionKey": ["k"]}), pattern.clone()]).expect_err("refused");
        assert!(error.to_string().contains(says) && error.to_string().starts_with("pattern 1"), "{pattern}: {error}");
    }
}
