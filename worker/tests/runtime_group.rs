//! A consumer group of worker processes on kinesalite and dynalite: shards split exclusively, every
//! record processed, per-key order kept.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::wait_for;

async fn three_workers_share_four_shards_and_process_every_record_in_key_order(emulator: Emulator) {
    let kinesis = emulator.client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "group", 4).await;
    let table = leasehold_testkit::unique_name("group");
    let first = records(50, 0, 10);
    put_records(&kinesis, &stream, &first).await;

    let config = emulator.config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n");
    let mut workers = [spawn(&config, "w1"), spawn(&config, "w2"), spawn(&config, "w3")];
    let refs: Vec<_> = workers.iter().collect();
    wait_for("every shard held", Duration::from_secs(30), || {
        workers.iter().flat_map(|w| w.held_shards()).collect::<HashSet<_>>().len() == 4
    });
    let second = records(50, 10, 10);
    put_records(&kinesis, &stream, &second).await;
    let expected: Vec<_> = first.iter().chain(&second).cloned().collect();
    wait_for("every record delivered", Duration::from_secs(60), || {
        distinct(&all_deliveries(&refs)).len() >= expected.len()
    });
    // Give balancing time to settle, then check the spread: 4 shards over 3 workers, each holding 1 or 2,
    // never one shard in two workers.
    wait_for("shards spread 2/1/1", Duration::from_secs(20), || {
        let counts: Vec<usize> = workers.iter().map(|w| w.held_shards().len()).collect();
        counts.iter().sum::<usize>() == 4 && counts.iter().all(|c| (1..=2).contains(c))
    });
    let held: Vec<String> = workers.iter().flat_map(|w| w.held_shards()).collect();
    assert_eq!(held.iter().collect::<HashSet<_>>().len(), held.len(), "a shard held twice: {held:?}");

    let deliveries = all_deliveries(&refs);
    for w in &workers {
        println!("{} holds {:?}, delivered {}", w.owner, w.held_shards(), w.deliveries().len());
    }
    assert_exactly_once(&deliveries, &expected);
    assert_per_key_order(&refs);
    assert_eq!(check_handovers(&deliveries), 0, "cooperative handoffs must not redeliver");
    let [a, b, c] = &mut workers;
    assert_running(&mut [a, b, c]);
}

on_both_emulators!(three_workers_share_four_shards_and_process_every_record_in_key_order);
