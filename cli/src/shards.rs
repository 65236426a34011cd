//! A stream's shards as Kinesis lists them (parents, open or closed), and their family tree.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{CliError, Result, sdk_message};

/// One shard as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// Its id.
    pub id: String,
    /// Its parents (one after a split, two after a merge), as listed.
    pub parents: Vec<String>,
    /// True once it was split or merged away (it has an ending sequence number).
    pub closed: bool,
}

/// Lists every shard of `stream` still within retention.
pub async fn list(client: &aws_sdk_kinesis::Client, stream: &str) -> Result<Vec<Shard>> {
    let mut shards = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let request = match &next {
            Some(token) => client.list_shards().next_token(token),
            None => client.list_shards().stream_name(stream),
        };
        let out = request.send().await.map_err(|e| {
            let message = sdk_message(&e);
            if message.starts_with("ResourceNotFoundException") {
                CliError::NotFound(format!("stream {stream} does not exist ({message})"))
            } else {
                CliError::Service(format!("listing the shards of {stream}: {message}"))
            }
        })?;
        for shard in out.shards.unwrap_or_default() {
            let parents =
                [shard.parent_shard_id.clone(), shard.adjacent_parent_shard_id.clone()].into_iter().flatten().collect();
            let closed = shard.sequence_number_range.as_ref().is_some_and(|r| r.ending_sequence_number.is_some());
            shards.push(Shard { id: shard.shard_id, parents, closed });
        }
        match out.next_token {
            Some(token) if !token.is_empty() => next = Some(token),
            _ => return Ok(shards),
        }
    }
}

/// Every listed descendant of `shard` (children, their children, ...).
pub fn descendants(shards: &[Shard], shard: &str) -> BTreeSet<String> {
    let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for s in shards {
        for parent in &s.parents {
            children.entry(parent.as_str()).or_default().push(s.id.as_str());
        }
    }
    let mut out = BTreeSet::new();
    let mut todo = vec![shard];
    while let Some(next) = todo.pop() {
        for kid in children.get(next).map(Vec::as_slice).unwrap_or_default() {
            if out.insert(kid.to_string()) {
                todo.push(kid);
            }
        }
    }
    out
}

/// Listed shards, parents before children (a shard's listed parents always come first).
pub fn parents_first(shards: &[Shard]) -> Vec<&Shard> {
    let listed: BTreeSet<&str> = shards.iter().map(|s| s.id.as_str()).collect();
    let mut placed: BTreeSet<&str> = BTreeSet::new();
    let mut order = Vec::with_capacity(shards.len());
    while order.len() < shards.len() {
        let before = order.len();
        for shard in shards {
            let ready = shard.parents.iter().all(|p| !listed.contains(p.as_str()) || placed.contains(p.as_str()));
            if !placed.contains(shard.id.as_str()) && ready {
                placed.insert(shard.id.as_str());
                order.push(shard);
            }
        }
        if order.len() == before {
            // No cycle exists in Kinesis lineages; place the rest as listed rather than loop.
            order.extend(shards.iter().filter(|s| !placed.contains(s.id.as_str())));
            break;
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(id: &str, parents: &[&str], closed: bool) -> Shard {
        Shard { id: id.into(), parents: parents.iter().map(|p| p.to_string()).collect(), closed }
    }

    #[test]
    fn descendants_follow_splits_and_merges() {
        let shards = vec![
            shard("4", &["1", "2"], false),
            shard("0", &[], true),
            shard("1", &["0"], true),
            shard("2", &["0"], true),
            shard("3", &[], false),
        ];
        assert_eq!(descendants(&shards, "0"), ["1", "2", "4"].iter().map(|s| s.to_string()).collect());
        let order: Vec<&str> = parents_first(&shards).iter().map(|s| s.id.as_str()).collect();
        assert_eq!(order, ["0", "1", "2", "3", "4"]);
    }
}
