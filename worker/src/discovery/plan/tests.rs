//! The planner's rules on every lineage shape, and a simulation of syncs and workers over random
//! histories.

use super::*;

fn shard(id: &str, parents: &[&str], closed: bool) -> ShardInfo {
    ShardInfo { id: id.into(), parents: parents.iter().map(|p| p.to_string()).collect(), closed, hash_keys: None }
}

fn row(shard: &str, checkpoint: Checkpoint, counter: u64, parents: &[&str]) -> Lease {
    crate::test_rows::row(shard).checkpoint(checkpoint).counter(counter).parents(parents).lease()
}

fn created(plan: &SyncPlan) -> Vec<(String, Checkpoint)> {
    plan.create.iter().map(|n| (n.key.shard_id().to_string(), n.checkpoint.clone())).collect()
}

#[test]
fn a_new_stream_starts_every_shard_of_the_lineage_at_the_start_position() {
    let listing =
        vec![("s".to_string(), vec![shard("0", &[], true), shard("1", &["0"], false), shard("2", &["0"], false)])];
    let from =
        |start: Checkpoint| vec![("0".to_string(), start.clone()), ("1".into(), start.clone()), ("2".into(), start)];
    let horizon = plan(&listing, &[], &Checkpoint::TrimHorizon);
    assert_eq!(created(&horizon), from(Checkpoint::TrimHorizon));
    assert_eq!(horizon.create[1].parent_shard_ids, vec!["0"]);
    // Children inherit the timestamp: records in them written before it are not wanted either.
    assert_eq!(created(&plan(&listing, &[], &Checkpoint::AtTimestamp(7))), from(Checkpoint::AtTimestamp(7)));
    // LATEST: nothing will be written to a closed shard again, so only open shards get rows, at the tip.
    assert_eq!(
        created(&plan(&listing, &[], &Checkpoint::Latest)),
        vec![("1".into(), Checkpoint::Latest), ("2".into(), Checkpoint::Latest)]
    );
}

#[test]
fn children_of_a_tracked_shard_start_at_trim_horizon_whatever_the_start_position() {
    let listing =
        vec![("s".to_string(), vec![shard("0", &[], true), shard("1", &["0"], false), shard("2", &["0"], false)])];
    let rows = vec![row("0", Checkpoint::Sequence("5".into()), 3, &[])];
    for start in [Checkpoint::Latest, Checkpoint::TrimHorizon, Checkpoint::AtTimestamp(7)] {
        assert_eq!(
            created(&plan(&listing, &rows, &start)),
            vec![("1".into(), Checkpoint::TrimHorizon), ("2".into(), Checkpoint::TrimHorizon)]
        );
    }
}

#[test]
fn rows_are_planned_parents_first_whatever_the_listing_order() {
    // 0 -> 1 + 2; 2 + 3 -> 4; 4 -> 5 + 6, listed newest first.
    let mut shards = vec![
        shard("6", &["4"], false),
        shard("5", &["4"], false),
        shard("4", &["2", "3"], true),
        shard("3", &[], true),
        shard("2", &["0"], true),
        shard("1", &["0"], false),
        shard("0", &[], true),
    ];
    let plan_of = |shards: &[ShardInfo]| plan(&[("s".to_string(), shards.to_vec())], &[], &Checkpoint::TrimHorizon);
    let order: Vec<String> = plan_of(&shards).create.iter().map(|n| n.key.shard_id().to_string()).collect();
    let position = |id: &str| order.iter().position(|o| o == id).unwrap();
    for s in &shards {
        for p in &s.parents {
            assert!(position(p) < position(&s.id), "{p} must come before {} in {order:?}", s.id);
        }
    }
    shards.reverse();
    assert_eq!(plan_of(&shards).create.len(), 7);
}

#[test]
fn a_child_whose_parents_are_long_gone_is_a_root() {
    let listing = vec![("s".to_string(), vec![shard("5", &["1", "2"], false)])];
    assert_eq!(plan(&listing, &[], &Checkpoint::Latest).create[0].checkpoint, Checkpoint::Latest);
}

#[test]
fn existing_rows_are_left_alone_and_finished_parents_are_not_recreated() {
    let listing = vec![("s".to_string(), vec![shard("0", &[], true), shard("1", &["0"], false)])];
    let rows = vec![row("1", Checkpoint::Sequence("5".into()), 3, &["0"])];
    assert_eq!(plan(&listing, &rows, &Checkpoint::Latest), SyncPlan::default());
}

#[test]
fn finished_parents_are_deleted_only_after_every_child_started() {
    let listing =
        vec![("s".to_string(), vec![shard("0", &[], true), shard("1", &["0"], false), shard("2", &["0"], false)])];
    let parent = row("0", Checkpoint::ShardEnd, 9, &[]);
    let started = row("1", Checkpoint::TrimHorizon, 1, &["0"]);
    let waiting = row("2", Checkpoint::TrimHorizon, 0, &["0"]);
    let rows = vec![parent.clone(), started.clone(), waiting];
    assert!(plan(&listing, &rows, &Checkpoint::Latest).delete.is_empty());
    let rows = vec![parent.clone(), started, row("2", Checkpoint::TrimHorizon, 1, &["0"])];
    assert_eq!(plan(&listing, &rows, &Checkpoint::Latest).delete, vec![parent.clone()]);
    // A held parent is never deleted; an unlisted finished shard is.
    let held = Lease { owner: Some("w".into()), ..parent.clone() };
    assert!(plan(&listing, &[held], &Checkpoint::Latest).delete.is_empty());
    assert_eq!(
        plan(&[("s".to_string(), vec![])], std::slice::from_ref(&parent), &Checkpoint::Latest).delete,
        vec![parent]
    );
}

#[test]
fn streams_not_listed_are_not_touched() {
    let rows = vec![row("0", Checkpoint::ShardEnd, 3, &[])];
    assert_eq!(plan(&[], &rows, &Checkpoint::Latest), SyncPlan::default());
}

#[test]
fn children_wait_for_every_parent() {
    let parent_a = row("0", Checkpoint::ShardEnd, 4, &[]);
    let parent_b = row("1", Checkpoint::Sequence("3".into()), 4, &[]);
    let child = row("2", Checkpoint::TrimHorizon, 0, &["0", "1"]);
    let rows = [parent_a.clone(), parent_b, child.clone()];
    let by_key: HashMap<LeaseKey, &Lease> = rows.iter().map(|r| (r.key.clone(), r)).collect();
    assert!(!parents_done(&child, &by_key));
    let done_b = row("1", Checkpoint::ShardEnd, 5, &[]);
    let rows = [parent_a, done_b, child.clone()];
    let by_key: HashMap<LeaseKey, &Lease> = rows.iter().map(|r| (r.key.clone(), r)).collect();
    assert!(parents_done(&child, &by_key));
    assert!(parents_done(&child, &HashMap::new()), "parents cleaned up means done");
}

/// A stream resharded under a table of rows that shard syncs and workers keep up to date: every
/// sync applies the plan, every worker pass takes each row whose parents are done and reads it (to
/// SHARD_END if the shard is closed). Records every row created, so a shard read twice shows up.
#[derive(Clone)]
struct Simulation {
    shards: Vec<ShardInfo>,
    /// Open shards in hash-key order (neighbours are adjacent, so they can merge).
    open: Vec<String>,
    rows: Vec<Lease>,
    created: Vec<(String, Checkpoint)>,
    root_start: Checkpoint,
    /// Shards ever created (ids are never reused, even after a trim).
    ever: usize,
}

impl Simulation {
    fn new(open_count: usize, root_start: Checkpoint) -> Self {
        let shards: Vec<ShardInfo> = (0..open_count).map(|n| shard(&n.to_string(), &[], false)).collect();
        let open = shards.iter().map(|s| s.id.clone()).collect();
        Self { shards, open, rows: Vec::new(), created: Vec::new(), root_start, ever: open_count }
    }

    fn next_id(&mut self) -> String {
        self.ever += 1;
        (self.ever - 1).to_string()
    }

    fn close(&mut self, id: &str) {
        self.shards.iter_mut().filter(|s| s.id == id).for_each(|s| s.closed = true);
    }

    /// Splits the open shard at `position` (in hash-key order).
    fn split(&mut self, position: usize) {
        let parent = self.open[position].clone();
        self.close(&parent);
        let lower = self.next_id();
        self.shards.push(shard(&lower, &[&parent], false));
        let upper = self.next_id();
        self.shards.push(shard(&upper, &[&parent], false));
        self.open.splice(position..=position, [lower, upper]);
    }

    /// Merges the open shards at `position` and `position + 1`.
    fn merge(&mut self, position: usize) {
        let (a, b) = (self.open[position].clone(), self.open[position + 1].clone());
        self.close(&a);
        self.close(&b);
        let child = self.next_id();
        self.shards.push(shard(&child, &[&a, &b], false));
        self.open.splice(position..=position + 1, [child]);
    }

    /// Drops up to `count` of the oldest closed shards from the listing, as Kinesis does after the
    /// retention period: a shard goes no earlier than its parents, and after its row was cleaned up.
    fn trim(&mut self, count: usize) {
        let rows: HashSet<String> = self.rows.iter().map(|r| r.key.shard_id().to_string()).collect();
        let listed: HashSet<String> = self.shards.iter().map(|s| s.id.clone()).collect();
        let mut drop: HashSet<String> = HashSet::new();
        for shard in &self.shards {
            let parents_gone = shard.parents.iter().all(|p| !listed.contains(p) || drop.contains(p));
            if drop.len() < count && shard.closed && !rows.contains(&shard.id) && parents_gone {
                drop.insert(shard.id.clone());
            }
        }
        self.shards.retain(|s| !drop.contains(&s.id));
    }

    fn sync(&mut self) -> bool {
        let plan = plan(&[("s".to_string(), self.shards.clone())], &self.rows, &self.root_start);
        let changed = !plan.create.is_empty() || !plan.delete.is_empty();
        for new in plan.create {
            self.created.push((new.key.shard_id().to_string(), new.checkpoint.clone()));
            let parents: Vec<&str> = new.parent_shard_ids.iter().map(String::as_str).collect();
            self.rows.push(row(new.key.shard_id(), new.checkpoint, 0, &parents));
        }
        self.rows.retain(|r| !plan.delete.iter().any(|d| d.key == r.key));
        changed
    }

    fn work(&mut self) -> bool {
        let closed: HashSet<String> = self.shards.iter().filter(|s| s.closed).map(|s| s.id.clone()).collect();
        let snapshot = self.rows.clone();
        let by_key: HashMap<LeaseKey, &Lease> = snapshot.iter().map(|r| (r.key.clone(), r)).collect();
        let mut changed = false;
        for row in &mut self.rows {
            let done = row.checkpoint.is_shard_end();
            let current = !done && !closed.contains(row.key.shard_id()) && row.counter > 0;
            if done || current || !parents_done(row, &by_key) {
                continue;
            }
            row.counter += 1;
            row.checkpoint = if closed.contains(row.key.shard_id()) {
                Checkpoint::ShardEnd
            } else {
                Checkpoint::Sequence("9".into())
            };
            changed = true;
        }
        changed
    }

    /// Syncs and works until nothing changes: every finished row is cleaned up.
    fn settle(&mut self) {
        for _ in 0..1000 {
            let synced = self.sync();
            if !self.work() && !synced {
                self.assert_invariants();
                return;
            }
        }
        panic!("never settled: {:?}", self.rows);
    }

    fn assert_invariants(&self) {
        let mut seen = HashSet::new();
        for (id, _) in &self.created {
            assert!(seen.insert(id), "{id} got a row twice: {:?}", self.created);
        }
        let mut rows: Vec<&str> = self.rows.iter().map(|r| r.key.shard_id()).collect();
        let mut open: Vec<&str> = self.open.iter().map(String::as_str).collect();
        rows.sort();
        open.sort();
        assert_eq!(rows, open, "settled: only the open shards have rows\n{:?}\n{:?}", self.rows, self.shards);
    }

    /// Every shard ever listed got a row exactly once (with TRIM_HORIZON nothing is skipped).
    fn assert_every_shard_read_once(&self, total: usize) {
        let mut ids: Vec<usize> = self.created.iter().map(|(id, _)| id.parse().unwrap()).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..total).collect::<Vec<_>>(), "{:?}", self.created);
    }
}

#[test]
fn split_merge_split_with_cleanup_between_never_recreates_a_finished_shard() {
    for start in [Checkpoint::TrimHorizon, Checkpoint::Latest, Checkpoint::AtTimestamp(7)] {
        let mut sim = Simulation::new(2, start.clone());
        sim.settle();
        sim.split(0); // 0 -> 2 + 3
        sim.settle();
        sim.merge(0); // 2 + 3 -> 4
        sim.settle();
        sim.split(0); // 4 -> 5 + 6
        sim.settle();
        // Shard 0's row and its children's are long gone: later syncs still leave it alone.
        for _ in 0..3 {
            assert!(!sim.sync(), "{start}: {:?}", sim.created);
        }
        sim.assert_every_shard_read_once(7);
        let children: Vec<Checkpoint> = sim.created[2..].iter().map(|(_, c)| c.clone()).collect();
        assert!(children.iter().all(|c| *c == Checkpoint::TrimHorizon), "{start}: {children:?}");
    }
}

#[test]
fn a_deep_chain_of_splits_leaves_every_ancestor_finished() {
    let mut sim = Simulation::new(1, Checkpoint::TrimHorizon);
    sim.settle();
    for generation in 0..40 {
        sim.split(sim.open.len() - 1);
        if generation % 3 == 0 {
            sim.settle();
        }
    }
    sim.settle();
    sim.assert_every_shard_read_once(81);
}

#[test]
fn a_merge_of_children_of_different_parents_reads_each_shard_once() {
    let mut sim = Simulation::new(2, Checkpoint::TrimHorizon);
    sim.settle();
    sim.split(0); // 0 -> 2 + 3
    sim.split(2); // 1 -> 4 + 5
    sim.settle();
    sim.merge(1); // 3 + 4 -> 6: children of 0 and of 1
    sim.settle();
    sim.merge(0); // 2 + 6 -> 7
    sim.merge(0); // 7 + 5 -> 8: back to one shard
    sim.settle();
    sim.assert_every_shard_read_once(9);
    assert_eq!(sim.open, ["8"]);
}

#[test]
fn update_shard_count_generations_between_two_syncs_read_each_shard_once() {
    // UpdateShardCount reshards many shards at once; a sync may see several generations at a time.
    let mut sim = Simulation::new(4, Checkpoint::TrimHorizon);
    sim.settle();
    for position in [0, 2, 4, 6] {
        sim.split(position); // 4 -> 8
    }
    sim.merge(0);
    sim.merge(1);
    sim.merge(2); // 8 -> 5
    sim.settle();
    for position in [0, 1, 0] {
        sim.merge(position); // 5 -> 2
    }
    sim.split(0);
    sim.settle();
    sim.assert_every_shard_read_once(sim.ever);
}

#[test]
fn trimmed_ancestors_and_children_whose_parents_were_trimmed_are_not_read_again() {
    let mut sim = Simulation::new(2, Checkpoint::TrimHorizon);
    sim.settle();
    sim.split(0);
    sim.settle();
    sim.merge(1); // 3 + 1 -> 4
    sim.settle();
    sim.split(0); // 2 -> 5 + 6
    sim.settle();
    let total = sim.shards.len();
    // Retention drops the oldest closed shards: the rest have children with rows but no parents.
    sim.trim(2);
    assert_eq!(sim.shards.len(), total - 2);
    assert!(!sim.sync(), "{:?}", sim.created);
    sim.trim(0);
    assert!(!sim.sync(), "{:?}", sim.created);
    sim.split(0);
    sim.settle();
    sim.assert_every_shard_read_once(total + 2);
}

#[test]
fn a_first_start_on_a_resharded_stream_follows_the_start_position() {
    let mut history = Simulation::new(2, Checkpoint::TrimHorizon);
    history.split(0);
    history.merge(1);
    history.split(0); // open: 5, 6, 4
    for start in [Checkpoint::TrimHorizon, Checkpoint::AtTimestamp(7), Checkpoint::Latest] {
        let mut sim =
            Simulation { created: Vec::new(), rows: Vec::new(), root_start: start.clone(), ..history.clone() };
        sim.settle();
        let mut got: Vec<(String, Checkpoint)> = sim.created.clone();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        if start == Checkpoint::Latest {
            let mut expected: Vec<(String, Checkpoint)> =
                sim.open.iter().map(|id| (id.clone(), Checkpoint::Latest)).collect();
            expected.sort_by(|a, b| a.0.cmp(&b.0));
            assert_eq!(got, expected, "LATEST: the open shards only, at the tip");
        } else {
            assert_eq!(got.len(), 7, "{start}: the whole retained lineage");
            assert!(got.iter().all(|(_, c)| *c == start), "{start}: {got:?}");
        }
    }
}

#[test]
fn a_stream_whose_rows_are_all_gone_is_new_to_the_table() {
    // Nothing in the table says the lineage was ever read (the table was emptied or replaced): it is
    // read again from the start position, like a new consumer.
    let mut sim = Simulation::new(1, Checkpoint::TrimHorizon);
    sim.settle();
    sim.split(0);
    sim.settle();
    sim.rows.clear();
    sim.created.clear();
    sim.settle();
    assert_eq!(sim.created.len(), 3);
}

#[test]
fn random_reshards_never_read_a_shard_twice() {
    // xorshift: a fixed sequence of reshards per seed, no dependency needed.
    for seed in 1..=40u64 {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut next = move |bound: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            usize::try_from(state % bound as u64).unwrap()
        };
        let starts = [Checkpoint::TrimHorizon, Checkpoint::Latest, Checkpoint::AtTimestamp(7)];
        let start = starts[usize::try_from(seed).unwrap() % 3].clone();
        let mut sim = Simulation::new(1 + next(3), start.clone());
        sim.settle();
        for _ in 0..60 {
            match next(10) {
                0..=3 => sim.split(next(sim.open.len())),
                4..=6 if sim.open.len() > 1 => sim.merge(next(sim.open.len() - 1)),
                7 => sim.settle(),
                8 => sim.trim(next(4)),
                _ => {
                    sim.sync();
                    sim.work();
                }
            }
        }
        sim.settle();
        let mut seen = HashSet::new();
        assert!(sim.created.iter().all(|(id, _)| seen.insert(id)), "seed {seed}: {:?}", sim.created);
        if start == Checkpoint::TrimHorizon {
            // Every shard still listed was read, each once; trimmed ones were read before going.
            let listed: HashSet<&String> = sim.shards.iter().map(|s| &s.id).collect();
            assert!(listed.iter().all(|id| seen.contains(id)), "seed {seed}: {:?}", sim.created);
        }
    }
}
