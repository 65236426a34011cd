//! Record filters in Lambda's filter-pattern grammar (the `FilterCriteria` of an event source mapping,
//! itself EventBridge's event-pattern grammar), over a record seen as the JSON object
//! `{"partitionKey": "<key>", "data": <the record's data parsed as JSON>}`.
//!
//! A pattern is a JSON object: each key names a field of the record; its value is either a nested
//! pattern (for an object field) or a list of rules, any one of which must match (OR). Every key of a
//! pattern must match (AND). `"$or": [pattern, ...]` matches when one of its patterns does. Rules:
//!
//! | rule | matches a field that |
//! |---|---|
//! | `"text"`, `42`, `true`, `null` | equals it (numbers compared as numbers) |
//! | `{"prefix": "us-"}` / `{"suffix": ".png"}` | is a string beginning / ending with it |
//! | `{"equals-ignore-case": "alice"}` | is a string equal to it, ignoring case |
//! | `{"numeric": [">", 10, "<=", 20]}` | is a number in the range (`=`, `<`, `<=`, `>`, `>=`; one or two comparisons) |
//! | `{"exists": true}` / `{"exists": false}` | is present / is absent |
//! | `{"anything-but": ["Raining"]}` (or one value, or `{"prefix": ...}`) | is present and none of them |
//!
//! A field holding a list matches when one of its elements does. A record whose data is not JSON has
//! no `data` field: it matches only patterns that do not look inside `data`.

use serde_json::{Map, Value};

/// A pattern that is not in the grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PatternError(String);

fn bad(message: impl Into<String>) -> PatternError {
    PatternError(message.into())
}

/// A compiled pattern.
#[derive(Debug, Clone, PartialEq)]
pub struct Pattern {
    fields: Vec<(String, Node)>,
    any_of: Vec<Vec<Pattern>>,
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Nested(Pattern),
    Rules(Vec<Rule>),
}

#[derive(Debug, Clone, PartialEq)]
enum Rule {
    Equals(Value),
    Prefix(String),
    Suffix(String),
    EqualsIgnoreCase(String),
    Numeric(Vec<(Comparison, f64)>),
    Exists(bool),
    AnythingBut(Vec<Value>),
    AnythingButPrefix(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Comparison {
    Eq,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Pattern {
    /// Compiles a pattern given as JSON.
    pub fn parse(value: &Value) -> Result<Self, PatternError> {
        let Value::Object(object) = value else { return Err(bad("a pattern must be a JSON object")) };
        Self::object(object, "")
    }

    fn object(object: &Map<String, Value>, path: &str) -> Result<Self, PatternError> {
        if object.is_empty() {
            return Err(bad(format!("{}: an empty pattern", show(path))));
        }
        let mut pattern = Pattern { fields: Vec::new(), any_of: Vec::new() };
        for (key, value) in object {
            let here = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
            if key == "$or" {
                let Value::Array(options) = value else {
                    return Err(bad(format!("{here}: $or takes a list of patterns")));
                };
                if options.len() < 2 {
                    return Err(bad(format!("{here}: $or needs two patterns or more")));
                }
                let options = options
                    .iter()
                    .map(|o| match o {
                        Value::Object(o) => Self::object(o, path),
                        _ => Err(bad(format!("{here}: each $or entry is a pattern (a JSON object)"))),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                pattern.any_of.push(options);
                continue;
            }
            let node = match value {
                Value::Object(nested) => Node::Nested(Self::object(nested, &here)?),
                Value::Array(rules) if !rules.is_empty() => {
                    Node::Rules(rules.iter().map(|r| rule(r, &here)).collect::<Result<_, _>>()?)
                }
                _ => return Err(bad(format!("{here}: a field takes a non-empty list of rules or a nested pattern"))),
            };
            pattern.fields.push((key.clone(), node));
        }
        Ok(pattern)
    }

    /// True when `event` (a JSON object) matches.
    pub fn matches(&self, event: &Map<String, Value>) -> bool {
        self.fields.iter().all(|(key, node)| node.matches(event.get(key)))
            && self.any_of.iter().all(|options| options.iter().any(|p| p.matches(event)))
    }

    /// True when the pattern names `key` at its top level (also inside a top-level `$or`).
    pub fn names(&self, key: &str) -> bool {
        self.fields.iter().any(|(k, _)| k == key) || self.any_of.iter().flatten().any(|p| p.names(key))
    }
}

fn show(path: &str) -> &str {
    if path.is_empty() { "the pattern" } else { path }
}

impl Node {
    fn matches(&self, value: Option<&Value>) -> bool {
        match self {
            Node::Nested(pattern) => match value {
                Some(Value::Object(object)) => pattern.matches(object),
                Some(Value::Array(items)) => {
                    items.iter().any(|item| matches!(item, Value::Object(o) if pattern.matches(o)))
                }
                // A missing object: only rules that accept missing fields can match inside it.
                _ => pattern.matches(&Map::new()),
            },
            Node::Rules(rules) => rules.iter().any(|rule| rule.matches(value)),
        }
    }
}

fn rule(value: &Value, path: &str) -> Result<Rule, PatternError> {
    let Value::Object(object) = value else { return Ok(Rule::Equals(value.clone())) };
    let [(name, operand)] = object.iter().collect::<Vec<_>>()[..] else {
        return Err(bad(format!("{path}: a rule object has exactly one operator")));
    };
    let text = |what: &str| match operand {
        Value::String(s) => Ok(s.clone()),
        _ => Err(bad(format!("{path}: {what} takes a string"))),
    };
    Ok(match name.as_str() {
        "prefix" => Rule::Prefix(text("prefix")?),
        "suffix" => Rule::Suffix(text("suffix")?),
        "equals-ignore-case" => Rule::EqualsIgnoreCase(text("equals-ignore-case")?),
        "exists" => match operand {
            Value::Bool(b) => Rule::Exists(*b),
            _ => return Err(bad(format!("{path}: exists takes true or false"))),
        },
        "numeric" => Rule::Numeric(numeric(operand, path)?),
        "anything-but" => match operand {
            Value::Array(values) if !values.is_empty() && values.iter().all(scalar) => {
                Rule::AnythingBut(values.clone())
            }
            Value::Object(inner) => match inner.get("prefix") {
                Some(Value::String(prefix)) if inner.len() == 1 => Rule::AnythingButPrefix(prefix.clone()),
                _ => return Err(bad(format!("{path}: anything-but takes values or {{\"prefix\": \"...\"}}"))),
            },
            v if scalar(v) => Rule::AnythingBut(vec![v.clone()]),
            _ => return Err(bad(format!("{path}: anything-but takes values or {{\"prefix\": \"...\"}}"))),
        },
        other => return Err(bad(format!("{path}: unknown rule {other:?}"))),
    })
}

fn scalar(value: &Value) -> bool {
    matches!(value, Value::String(_) | Value::Number(_) | Value::Bool(_) | Value::Null)
}

fn numeric(operand: &Value, path: &str) -> Result<Vec<(Comparison, f64)>, PatternError> {
    let wrong = || bad(format!("{path}: numeric takes [\"<op>\", n] or [\"<op>\", n, \"<op>\", n]"));
    let Value::Array(items) = operand else { return Err(wrong()) };
    if items.len() != 2 && items.len() != 4 {
        return Err(wrong());
    }
    let mut comparisons = Vec::new();
    for pair in items.chunks(2) {
        let op = match pair[0].as_str() {
            Some("=") => Comparison::Eq,
            Some("<") => Comparison::Lt,
            Some("<=") => Comparison::Le,
            Some(">") => Comparison::Gt,
            Some(">=") => Comparison::Ge,
            _ => return Err(wrong()),
        };
        let n = pair[1].as_f64().ok_or_else(wrong)?;
        comparisons.push((op, n));
    }
    if comparisons.len() == 2 && comparisons.iter().any(|(op, _)| *op == Comparison::Eq) {
        return Err(bad(format!("{path}: numeric \"=\" stands alone")));
    }
    Ok(comparisons)
}

impl Rule {
    fn matches(&self, value: Option<&Value>) -> bool {
        match (self, value) {
            (Rule::Exists(wanted), value) => value.is_some() == *wanted,
            (_, None) => false,
            (rule, Some(Value::Array(items))) => items.iter().any(|item| rule.matches_one(item)),
            (rule, Some(value)) => rule.matches_one(value),
        }
    }

    fn matches_one(&self, value: &Value) -> bool {
        match self {
            Rule::Equals(wanted) => same(wanted, value),
            Rule::Prefix(prefix) => value.as_str().is_some_and(|s| s.starts_with(prefix.as_str())),
            Rule::Suffix(suffix) => value.as_str().is_some_and(|s| s.ends_with(suffix.as_str())),
            Rule::EqualsIgnoreCase(text) => value.as_str().is_some_and(|s| s.to_lowercase() == text.to_lowercase()),
            Rule::Numeric(comparisons) => value.as_f64().is_some_and(|n| {
                comparisons.iter().all(|(op, bound)| match op {
                    Comparison::Eq => n == *bound,
                    Comparison::Lt => n < *bound,
                    Comparison::Le => n <= *bound,
                    Comparison::Gt => n > *bound,
                    Comparison::Ge => n >= *bound,
                })
            }),
            Rule::Exists(_) => true,
            Rule::AnythingBut(values) => !values.iter().any(|v| same(v, value)),
            Rule::AnythingButPrefix(prefix) => value.as_str().is_some_and(|s| !s.starts_with(prefix.as_str())),
        }
    }
}

/// Equality of JSON scalars, numbers compared by value (`100` equals `100.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// A record filter: the record passes when one of its patterns matches (Lambda's `Filters`, OR-ed).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordFilter {
    patterns: Vec<Pattern>,
}

impl RecordFilter {
    /// Compiles `patterns`; the error names the pattern's place in the list.
    pub fn new(patterns: &[Value]) -> Result<Self, PatternError> {
        let patterns = patterns
            .iter()
            .enumerate()
            .map(|(i, p)| Pattern::parse(p).map_err(|e| bad(format!("pattern {i}: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { patterns })
    }

    /// True when a record with `partition_key` and `data` passes. Data that is not JSON leaves the
    /// record without a `data` field, and a pattern naming `data` does not match it.
    pub fn matches(&self, partition_key: &str, data: &[u8]) -> bool {
        let mut event = Map::new();
        event.insert("partitionKey".into(), Value::String(partition_key.into()));
        let data = serde_json::from_slice::<Value>(data).ok();
        let json = data.is_some();
        if let Some(data) = data {
            event.insert("data".into(), data);
        }
        self.patterns.iter().any(|p| (json || !p.names("data")) && p.matches(&event))
    }
}

#[cfg(test)]
mod tests;
