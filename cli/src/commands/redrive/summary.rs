//! What a redrive did (or would do): counts per destination and per source shard, the first few
//! records; printed as columns or structured.

use std::collections::BTreeMap;

use serde::Serialize;

use super::Source;
use super::letter::Place;
use crate::shared::error::Result;
use crate::shared::output::{Format, columns, structured};

/// Counts of one destination.
#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceCounts {
    /// Letters read.
    pub read: usize,
    /// Already redriven by an earlier run (tagged, or recorded in the redrive row).
    pub already_redriven: usize,
    /// Letters of another consumer (another lease table): left alone.
    pub refused_other_consumer: usize,
    /// Letters naming no lease table (left alone without `--accept-unnamed`).
    pub refused_unnamed: usize,
    /// Cut letters without a readable whole record: cannot be redriven, left alone.
    pub cut_without_record: usize,
    /// Not a dead letter (not its JSON): left alone.
    pub malformed: usize,
    /// Left out by `--shard`, `--since` or `--limit`.
    pub left_out: usize,
    /// Copies of a record already read (from this or another destination).
    pub duplicates: usize,
    /// Letters chosen for redrive.
    pub selected: usize,
    /// Of these, marked redriven (deleted, tagged, recorded) after their put.
    pub marked: usize,
}

/// Letters of one source shard from one destination.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardCount {
    /// Source shard.
    pub shard_id: String,
    /// Destination read.
    pub destination: Source,
    /// Records chosen.
    pub letters: usize,
}

/// A letter shown in the summary.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shown {
    /// The record's place.
    #[serde(flatten)]
    pub place: Place,
    /// Its partition key.
    pub partition_key: String,
    /// Payload bytes.
    pub bytes: usize,
    /// The stream it is put on.
    pub to: String,
}

/// What `redrive` did (or would do).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// The consumer.
    pub consumer: String,
    /// False for a dry run.
    pub executed: bool,
    /// Counts per destination.
    pub destinations: BTreeMap<String, SourceCounts>,
    /// Records chosen per source shard and destination.
    pub shards: Vec<ShardCount>,
    /// Records chosen (each put once).
    pub records: usize,
    /// Records put back.
    pub put: usize,
    /// The first few records.
    pub first: Vec<Shown>,
}

/// Prints `outcome` (columns for people, or JSON/YAML).
pub(super) fn print_outcome(outcome: &Outcome, format: Format) -> Result<()> {
    if structured(format, outcome)? {
        return Ok(());
    }
    let rows: Vec<Vec<String>> = outcome
        .destinations
        .iter()
        .map(|(name, c)| {
            vec![
                name.clone(),
                c.read.to_string(),
                c.selected.to_string(),
                c.duplicates.to_string(),
                c.already_redriven.to_string(),
                (c.refused_other_consumer + c.refused_unnamed).to_string(),
                c.cut_without_record.to_string(),
                c.malformed.to_string(),
                c.left_out.to_string(),
                c.marked.to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        columns(
            &[
                "DESTINATION",
                "READ",
                "CHOSEN",
                "DUPLICATE",
                "DONE-BEFORE",
                "REFUSED",
                "CUT",
                "MALFORMED",
                "LEFT-OUT",
                "MARKED"
            ],
            &rows
        )
    );
    if !outcome.shards.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = outcome
            .shards
            .iter()
            .map(|s| vec![s.shard_id.clone(), s.destination.name().to_string(), s.letters.to_string()])
            .collect();
        print!("{}", columns(&["SHARD", "FROM", "RECORDS"], &rows));
    }
    if !outcome.first.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = outcome
            .first
            .iter()
            .map(|s| {
                vec![
                    format!("{}/{}", s.place.stream, s.place.shard_id),
                    s.place.sequence_number.clone(),
                    s.partition_key.clone(),
                    s.bytes.to_string(),
                    s.to.clone(),
                ]
            })
            .collect();
        print!("{}", columns(&["SOURCE", "SEQUENCE", "KEY", "BYTES", "TO"], &rows));
    }
    if outcome.executed {
        println!("\n{}: {} record(s) put back of {}", outcome.consumer, outcome.put, outcome.records);
    } else {
        println!("\n{}: {} record(s) to put back (dry run: --execute puts them)", outcome.consumer, outcome.records);
    }
    Ok(())
}
