//! Conversion between DynamoDB's attribute values and the store-neutral [`AttrValue`].

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::row::{AttrValue, Attributes};

/// DynamoDB's item as the store-neutral attribute map.
pub fn from_item(item: &HashMap<String, AttributeValue>) -> Attributes {
    item.iter().map(|(name, value)| (name.clone(), from_value(value))).collect()
}

fn from_value(value: &AttributeValue) -> AttrValue {
    match value {
        AttributeValue::S(s) => AttrValue::S(s.clone()),
        AttributeValue::N(n) => AttrValue::N(n.clone()),
        AttributeValue::Ss(ss) => AttrValue::Ss(ss.clone()),
        AttributeValue::B(_) => AttrValue::Other("B"),
        AttributeValue::Bool(_) => AttrValue::Other("BOOL"),
        AttributeValue::Bs(_) => AttrValue::Other("BS"),
        AttributeValue::L(_) => AttrValue::Other("L"),
        AttributeValue::M(_) => AttrValue::Other("M"),
        AttributeValue::Ns(_) => AttrValue::Other("NS"),
        AttributeValue::Null(_) => AttrValue::Other("NULL"),
        _ => AttrValue::Other("unknown"),
    }
}

/// The store-neutral attribute map as a DynamoDB item. `Other` values cannot be written back and are
/// written as NULL.
pub fn to_item(attrs: &Attributes) -> HashMap<String, AttributeValue> {
    attrs
        .iter()
        .map(|(name, value)| {
            let value = match value {
                AttrValue::S(s) => AttributeValue::S(s.clone()),
                AttrValue::N(n) => AttributeValue::N(n.clone()),
                AttrValue::Ss(ss) => AttributeValue::Ss(ss.clone()),
                AttrValue::Other(_) => AttributeValue::Null(true),
            };
            (name.clone(), value)
        })
        .collect()
}
