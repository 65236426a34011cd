//! A stream's shards as Kinesis lists them (parents, open or closed), and their family tree.

use std::collections::{BTreeMap, BTreeSet};

use leasehold_worker::aws::kinesis::{self, KinesisError, StreamRef};

use crate::shared::error::{CliError, Result};

/// One shard as listed (the shared listing's type: id, parents, closed, hash keys).
pub use kinesis::ShardInfo as Shard;

/// Lists every shard of `stream` still within retention (every page; a throttled page is asked again).
pub async fn list(client: &aws_sdk_kinesis::Client, stream: &str) -> Result<Vec<Shard>> {
    kinesis::list_shards(client, StreamRef::named(stream)).await.map_err(|e| match e {
        KinesisError::StreamNotFound { message, .. } => {
            CliError::NotFound(format!("stream {stream} does not exist ({message})"))
        }
        other => CliError::Service(format!("listing the shards of {stream}: {other}")),
    })
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
        Shard { id: id.into(), parents: parents.iter().map(|p| p.to_string()).collect(), closed, hash_keys: None }
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
