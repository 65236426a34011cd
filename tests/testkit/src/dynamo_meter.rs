//! A counting DynamoDB endpoint: a [`FaultProxy`] in front of dynalite that counts every request per
//! operation (`X-Amz-Target`) and the capacity units real DynamoDB would bill for it.
//!
//! Billing as the DynamoDB developer guide states it ("Item sizes and formats", "Read/write capacity
//! mode"): a strongly consistent read costs 1 unit per 4 KB, an eventually consistent one half that; for
//! GetItem per item, for Scan and Query per page over the total size of the items read, rounded up; a
//! write costs 1 unit per 1 KB of the item, and a conditional write that fails still costs the write.
//! Approximations, said where they are made:
//! - UpdateItem is billed on the item after the update (DynamoDB bills the larger of before and after).
//!   The meter asks dynalite for `ReturnValues: ALL_NEW` when the client did not and removes the
//!   attributes from the answer, so the client sees what it asked for.
//! - A failed conditional write, and DeleteItem, are billed on the last size the meter saw for that
//!   key, else 1 unit.
//! - Scan and Query are billed on the items returned (the same as read while no filter is used).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::StatusCode;
use base64::Engine;
use serde_json::{Map, Value};

use crate::proxy::{FaultProxy, Tap};

/// Bytes per read unit (strongly consistent).
pub const READ_UNIT_BYTES: usize = 4096;
/// Bytes per write unit.
pub const WRITE_UNIT_BYTES: usize = 1024;

/// What one operation cost since the last reset.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OperationCost {
    /// Requests seen (successful or not).
    pub requests: u64,
    /// Read capacity units (eventually consistent reads count half).
    pub read_units: f64,
    /// Write capacity units.
    pub write_units: f64,
}

/// Per operation name (`Scan`, `UpdateItem`, ...), what it cost.
pub type MeterSnapshot = BTreeMap<String, OperationCost>;

/// Totals over every operation of a snapshot: (requests, read units, write units).
pub fn totals(snapshot: &MeterSnapshot) -> OperationCost {
    snapshot.values().fold(OperationCost::default(), |sum, c| OperationCost {
        requests: sum.requests + c.requests,
        read_units: sum.read_units + c.read_units,
        write_units: sum.write_units + c.write_units,
    })
}

/// `after - before`, per operation (operations with no request in between are left out).
pub fn difference(after: &MeterSnapshot, before: &MeterSnapshot) -> MeterSnapshot {
    after
        .iter()
        .filter_map(|(op, a)| {
            let b = before.get(op).copied().unwrap_or_default();
            let d = OperationCost {
                requests: a.requests - b.requests,
                read_units: a.read_units - b.read_units,
                write_units: a.write_units - b.write_units,
            };
            (d.requests > 0).then(|| (op.clone(), d))
        })
        .collect()
}

/// A running counting endpoint; stops when dropped.
pub struct DynamoMeter {
    proxy: FaultProxy,
    tap: Arc<MeterTap>,
}

impl DynamoMeter {
    /// Starts a meter in front of `upstream` (dynalite's `http://host:port`).
    pub async fn start(upstream: &str) -> Self {
        let tap = Arc::new(MeterTap::default());
        let proxy = FaultProxy::start_with_tap(upstream, Arc::new(|_, _| None), Some(tap.clone())).await;
        Self { proxy, tap }
    }

    /// The endpoint to give a DynamoDB client.
    pub fn endpoint(&self) -> String {
        self.proxy.endpoint()
    }

    /// What each operation cost since the start or the last [`reset`](Self::reset).
    pub fn snapshot(&self) -> MeterSnapshot {
        self.tap.costs.lock().expect("meter costs").clone()
    }

    /// Forgets every count (item sizes already seen are kept).
    pub fn reset(&self) {
        self.tap.costs.lock().expect("meter costs").clear();
    }
}

#[derive(Default)]
struct MeterTap {
    costs: Mutex<MeterSnapshot>,
    /// Last known size of each item, by table and key (as canonical JSON).
    sizes: Mutex<HashMap<String, usize>>,
}

/// Read units of `bytes` read at once (a GetItem item, or a Scan/Query page); at least 1 unit.
pub fn read_units(bytes: usize, consistent: bool) -> f64 {
    let units = bytes.div_ceil(READ_UNIT_BYTES).max(1) as f64;
    if consistent { units } else { units / 2.0 }
}

/// Write units of writing an item of `bytes`; at least 1 unit.
pub fn write_units(bytes: usize) -> f64 {
    bytes.div_ceil(WRITE_UNIT_BYTES).max(1) as f64
}

/// Size of an item (attribute name -> DynamoDB JSON value) as DynamoDB counts it: the sum of its
/// attribute names' and values' sizes.
pub fn item_size(item: &Map<String, Value>) -> usize {
    item.iter().map(|(name, value)| name.len() + value_size(value)).sum()
}

/// Size of one DynamoDB JSON value (`{"S": "..."}`, `{"N": "12"}`, ...), without its attribute name.
pub fn value_size(value: &Value) -> usize {
    let Some((kind, inner)) = value.as_object().and_then(|o| o.iter().next()) else { return 0 };
    let str_len = |v: &Value| v.as_str().map_or(0, str::len);
    let binary_len = |v: &Value| {
        v.as_str().and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok()).map_or(0, |b| b.len())
    };
    let each = |v: &Value, f: &dyn Fn(&Value) -> usize| v.as_array().map_or(0, |a| a.iter().map(f).sum());
    match kind.as_str() {
        "S" => str_len(inner),
        "N" => number_size(inner.as_str().unwrap_or("0")),
        "B" => binary_len(inner),
        "BOOL" | "NULL" => 1,
        "SS" => each(inner, &str_len),
        "NS" => each(inner, &|v| number_size(v.as_str().unwrap_or("0"))),
        "BS" => each(inner, &binary_len),
        // 3 bytes for the container, 1 per element.
        "L" => 3 + each(inner, &|v| 1 + value_size(v)),
        "M" => 3 + inner.as_object().map_or(0, |m| m.iter().map(|(k, v)| 1 + k.len() + value_size(v)).sum()),
        _ => 0,
    }
}

/// Size of an item as the SDK returns it, by the same rules as [`item_size`].
pub fn sdk_item_size(item: &HashMap<String, aws_sdk_dynamodb::types::AttributeValue>) -> usize {
    use aws_sdk_dynamodb::types::AttributeValue as A;
    fn size(value: &A) -> usize {
        match value {
            A::S(s) => s.len(),
            A::N(n) => number_size(n),
            A::B(b) => b.as_ref().len(),
            A::Bool(_) | A::Null(_) => 1,
            A::Ss(set) => set.iter().map(String::len).sum(),
            A::Ns(set) => set.iter().map(|n| number_size(n)).sum(),
            A::Bs(set) => set.iter().map(|b| b.as_ref().len()).sum(),
            A::L(list) => 3 + list.iter().map(|v| 1 + size(v)).sum::<usize>(),
            A::M(map) => 3 + map.iter().map(|(k, v)| 1 + k.len() + size(v)).sum::<usize>(),
            _ => 0,
        }
    }
    item.iter().map(|(name, value)| name.len() + size(value)).sum()
}

/// Size of a number: 1 byte per two significant digits (leading and trailing zeroes trimmed), plus 1.
pub fn number_size(text: &str) -> usize {
    let mantissa = text.split(['e', 'E']).next().unwrap_or("");
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0');
    significant.len().div_ceil(2) + 1
}

fn json(body: &[u8]) -> Map<String, Value> {
    serde_json::from_slice::<Value>(body).ok().and_then(|v| v.as_object().cloned()).unwrap_or_default()
}

fn item_key(request: &Map<String, Value>) -> String {
    let table = request.get("TableName").and_then(Value::as_str).unwrap_or("");
    let key = request.get("Key").map(Value::to_string).unwrap_or_default();
    format!("{table}\u{0}{key}")
}

fn items_size(items: Option<&Value>) -> usize {
    items.and_then(Value::as_array).map_or(0, |a| a.iter().filter_map(Value::as_object).map(item_size).sum())
}

fn consistent(request: &Map<String, Value>) -> bool {
    request.get("ConsistentRead").and_then(Value::as_bool).unwrap_or(false)
}

impl MeterTap {
    fn cost(&self, operation: &str, request: &[u8], status: StatusCode, response: &Map<String, Value>) -> (f64, f64) {
        let request = json(request);
        let failed = !status.is_success();
        let known_size = |key: &str| self.sizes.lock().expect("meter sizes").get(key).copied().unwrap_or(0);
        let remember = |key: String, size: usize| {
            self.sizes.lock().expect("meter sizes").insert(key, size);
        };
        // A PutItem's size is remembered under its key attributes, which the meter does not know;
        // UpdateItem and GetItem teach it the sizes that matter for lease rows.
        let conditional_failure = response
            .get("__type")
            .and_then(Value::as_str)
            .is_some_and(|t| t.ends_with("ConditionalCheckFailedException"));
        match operation {
            "GetItem" if !failed => {
                let size = response.get("Item").and_then(Value::as_object).map_or(0, item_size);
                if size > 0 {
                    remember(item_key(&request), size);
                }
                (read_units(size, consistent(&request)), 0.0)
            }
            "Scan" | "Query" if !failed => (read_units(items_size(response.get("Items")), consistent(&request)), 0.0),
            "BatchGetItem" if !failed => {
                let consistent_tables: HashMap<&str, bool> = request
                    .get("RequestItems")
                    .and_then(Value::as_object)
                    .map(|m| m.iter().map(|(t, r)| (t.as_str(), r.as_object().is_some_and(consistent))).collect())
                    .unwrap_or_default();
                let units = response.get("Responses").and_then(Value::as_object).map_or(0.0, |tables| {
                    tables
                        .iter()
                        .flat_map(|(table, items)| {
                            let consistent = consistent_tables.get(table.as_str()).copied().unwrap_or(false);
                            items
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter_map(Value::as_object)
                                .map(move |item| read_units(item_size(item), consistent))
                        })
                        .sum()
                });
                (units, 0.0)
            }
            "PutItem" if !failed || conditional_failure => {
                let size = request.get("Item").and_then(Value::as_object).map_or(0, item_size);
                (0.0, write_units(size))
            }
            "UpdateItem" if !failed => {
                let key = item_key(&request);
                let size = response.get("Attributes").and_then(Value::as_object).map_or(0, item_size);
                remember(key, size);
                (0.0, write_units(size))
            }
            "UpdateItem" | "DeleteItem" if !failed || conditional_failure => {
                (0.0, write_units(known_size(&item_key(&request))))
            }
            "BatchWriteItem" if !failed => {
                let units = request.get("RequestItems").and_then(Value::as_object).map_or(0.0, |tables| {
                    tables
                        .values()
                        .flat_map(|writes| writes.as_array().into_iter().flatten())
                        .map(|write| {
                            let put = write.pointer("/PutRequest/Item").and_then(Value::as_object);
                            write_units(put.map_or(0, item_size))
                        })
                        .sum()
                });
                (0.0, units)
            }
            _ => (0.0, 0.0),
        }
    }
}

impl Tap for MeterTap {
    fn request(&self, operation: &str, body: Bytes) -> Bytes {
        // Learn the size after an update without a second request: ask for the new item.
        if operation == "UpdateItem" {
            let mut request = json(&body);
            if returns(&request) == "NONE" {
                request.insert("ReturnValues".into(), Value::String("ALL_NEW".into()));
                return Bytes::from(Value::Object(request).to_string());
            }
        }
        body
    }

    fn response(&self, operation: &str, original: &[u8], sent: &[u8], status: StatusCode, response: Bytes) -> Bytes {
        let mut answer = json(&response);
        let (read, write) = self.cost(operation, sent, status, &answer);
        {
            let mut costs = self.costs.lock().expect("meter costs");
            let cost = costs.entry(operation.to_string()).or_default();
            cost.requests += 1;
            cost.read_units += read;
            cost.write_units += write;
        }
        // Take out what the meter asked for and the client did not.
        if operation == "UpdateItem" && status.is_success() && returns(&json(original)) == "NONE" {
            answer.remove("Attributes");
            return Bytes::from(Value::Object(answer).to_string());
        }
        response
    }
}

fn returns(request: &Map<String, Value>) -> &str {
    request.get("ReturnValues").and_then(Value::as_str).unwrap_or("NONE")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("object")
    }

    #[test]
    fn strings_and_binaries_count_their_bytes_and_names() {
        // "name" (4) + "héllo" (6 bytes in UTF-8); "b" (1) + 3 raw bytes (base64 "AQID").
        assert_eq!(item_size(&item(json!({"name": {"S": "héllo"}, "b": {"B": "AQID"}}))), 4 + 6 + 1 + 3);
    }

    #[test]
    fn numbers_count_one_byte_per_two_significant_digits_plus_one() {
        assert_eq!(number_size("0"), 1);
        assert_eq!(number_size("7"), 2);
        assert_eq!(number_size("12"), 2);
        assert_eq!(number_size("123"), 3);
        // Leading and trailing zeroes are trimmed, sign and point do not count.
        assert_eq!(number_size("-00120.0500"), 1 + 3);
        assert_eq!(number_size("1700000000000"), 2);
        assert_eq!(number_size("1764590000123"), 1 + 7);
        assert_eq!(item_size(&item(json!({"n": {"N": "1234"}}))), 1 + 3);
    }

    #[test]
    fn bool_null_sets_lists_and_maps() {
        assert_eq!(value_size(&json!({"BOOL": true})), 1);
        assert_eq!(value_size(&json!({"NULL": true})), 1);
        assert_eq!(value_size(&json!({"SS": ["ab", "cde"]})), 5);
        assert_eq!(value_size(&json!({"NS": ["1", "22"]})), 2 + 2);
        // List: 3 + per element (1 + size).
        assert_eq!(value_size(&json!({"L": [{"S": "ab"}, {"BOOL": false}]})), 3 + (1 + 2) + (1 + 1));
        assert_eq!(value_size(&json!({"L": []})), 3);
        // Map: 3 + per entry (1 + name + size).
        assert_eq!(value_size(&json!({"M": {"k": {"S": "abc"}}})), 3 + 1 + 1 + 3);
    }

    #[test]
    fn reads_round_up_to_4_kb_and_writes_to_1_kb_with_a_minimum_of_one() {
        assert_eq!(read_units(0, true), 1.0);
        assert_eq!(read_units(4096, true), 1.0);
        assert_eq!(read_units(4097, true), 2.0);
        assert_eq!(read_units(4097, false), 1.0);
        assert_eq!(read_units(100, false), 0.5);
        assert_eq!(write_units(0), 1.0);
        assert_eq!(write_units(1024), 1.0);
        assert_eq!(write_units(1025), 2.0);
    }

    #[test]
    fn a_failed_conditional_update_costs_the_known_item_size() {
        let tap = MeterTap::default();
        let request = br#"{"TableName":"t","Key":{"k":{"S":"a"}},"ReturnValues":"ALL_NEW"}"#;
        let big = "x".repeat(3000);
        let answer = format!(r#"{{"Attributes":{{"k":{{"S":"a"}},"v":{{"S":"{big}"}}}}}}"#);
        tap.response("UpdateItem", request, request, StatusCode::OK, Bytes::from(answer));
        let failed = r#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException"}"#;
        tap.response("UpdateItem", request, request, StatusCode::BAD_REQUEST, Bytes::from(failed));
        let other = br#"{"TableName":"t","Key":{"k":{"S":"b"}}}"#;
        tap.response("UpdateItem", other, other, StatusCode::BAD_REQUEST, Bytes::from(failed));
        let cost = tap.costs.lock().expect("costs")["UpdateItem"];
        // 3 KB + the key: 3 units, twice; an unknown item: 1 unit.
        assert_eq!(cost, OperationCost { requests: 3, read_units: 0.0, write_units: 3.0 + 3.0 + 1.0 });
    }
}
