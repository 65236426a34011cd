//! Fair shares and who should take, ask for, or give which lease. Pure: every worker computes the same
//! targets from the same view, so they agree without talking.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::discovery::parents_done;
use crate::lease::{Lease, LeaseKey, Member};

/// One worker's view of the table at a scan.
#[derive(Debug)]
pub struct View<'a> {
    /// This worker's owner id.
    pub me: &'a str,
    /// Every lease row.
    pub leases: &'a [Lease],
    /// Every membership row, with liveness as judged by this worker.
    pub members: &'a [Member],
    /// Leases this worker is running now.
    pub running: &'a HashSet<LeaseKey>,
    /// Leases this worker asked to be handed over, still pending.
    pub requested: &'a HashSet<LeaseKey>,
}

/// What this worker should do after a scan.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Moves {
    /// This worker's fair share of the active leases.
    pub target: usize,
    /// The live workers the shares were computed over, this one included.
    pub workers: usize,
    /// Leases to acquire: own rows not running, then free rows up to the deficit.
    pub take: Vec<Lease>,
    /// Other workers' leases, to take if `acquire` finds them expired (their counter unchanged for a
    /// lease duration): an expired lease needs a home at once, whatever the shares say; balance is
    /// restored afterwards by handoff. Rows of workers no longer alive come first.
    pub expired_candidates: Vec<Lease>,
    /// Leases to ask their holders for.
    pub ask: Vec<Lease>,
    /// Running leases to hand over, with the asker.
    pub give: Vec<(LeaseKey, String)>,
    /// True while this worker is draining: its share is 0 and it takes no lease but its own rows.
    pub draining: bool,
}

/// Leases that should be running somewhere: not finished, and every parent finished.
pub fn active(leases: &[Lease]) -> Vec<&Lease> {
    let by_key: HashMap<LeaseKey, &Lease> = leases.iter().map(|l| (l.key.clone(), l)).collect();
    leases.iter().filter(|l| !l.checkpoint.is_shard_end() && parents_done(l, &by_key)).collect()
}

/// Each live worker's fair share of `total` leases: the total split evenly, the remainder going one
/// each to the first workers in id order.
pub fn targets(total: usize, workers: &[String]) -> BTreeMap<String, usize> {
    let n = workers.len().max(1);
    let (base, extra) = (total / n, total % n);
    workers.iter().enumerate().map(|(i, w)| (w.clone(), base + usize::from(i < extra))).collect()
}

/// The live workers, this one included, in id order: `(every one, those that share the leases)`. A
/// draining member ([`Member::draining`]) shares nothing, unless every live worker is draining: then
/// the marks are ignored, so the shards keep a reader.
pub fn sharing(me: &str, members: &[Member]) -> (Vec<String>, Vec<String>) {
    let me_draining = members.iter().any(|m| m.owner == me && m.draining);
    let mut live: Vec<(&str, bool)> =
        members.iter().filter(|m| m.alive && m.owner != me).map(|m| (m.owner.as_str(), m.draining)).collect();
    live.push((me, me_draining));
    live.sort();
    live.dedup();
    let staying: Vec<String> = live.iter().filter(|(_, draining)| !draining).map(|(w, _)| w.to_string()).collect();
    let all: Vec<String> = live.into_iter().map(|(w, _)| w.to_string()).collect();
    if staying.is_empty() { (all.clone(), all) } else { (all, staying) }
}

/// Decides this worker's moves from `view`.
pub fn plan(view: &View<'_>) -> Moves {
    let active = active(view.leases);
    let (live, workers) = sharing(view.me, view.members);
    // A draining worker takes nothing new and gives every lease it runs to whoever asks.
    let draining = !workers.iter().any(|w| w == view.me);
    let alive: HashSet<&str> = workers.iter().map(String::as_str).collect();
    let targets = targets(active.len(), &workers);
    let target = targets.get(view.me).copied().unwrap_or(0);

    let mut by_owner: HashMap<&str, Vec<&Lease>> = HashMap::new();
    for lease in &active {
        if let Some(owner) = lease.owner.as_deref() {
            by_owner.entry(owner).or_default().push(lease);
        }
    }
    let mine = active.iter().filter(|l| view.running.contains(&l.key)).count();
    let mut moves = Moves { target, workers: workers.len(), draining, ..Moves::default() };

    // Own rows not running (handed to us, or ours before a restart under a stable id): always take.
    moves.take.extend(
        active.iter().filter(|l| l.is_held_by(view.me) && !view.running.contains(&l.key)).map(|l| (*l).clone()),
    );
    let mut deficit = target.saturating_sub(mine + moves.take.len() + view.requested.len());
    // The rows the group's matching deals this worker: free ones to take, others' surplus to ask for.
    let share = dealt(&active, &live, &workers, &alive, &targets, &by_owner, view);
    let (dealt_free, dealt_held): (Vec<&Lease>, Vec<&Lease>) = share.into_iter().partition(|l| l.owner.is_none());
    for lease in dealt_free.iter().take(deficit) {
        moves.take.push((*lease).clone());
        deficit -= 1;
    }
    moves.ask = dealt_held.into_iter().take(deficit).cloned().collect();
    deficit -= moves.ask.len();
    // Still short (the views disagree): any other free row, as a race the conditional write settles.
    for lease in active.iter().filter(|l| l.owner.is_none() && !dealt_free.iter().any(|d| d.key == l.key)).take(deficit)
    {
        moves.take.push((*lease).clone());
    }
    let mut others: Vec<&Lease> = active
        .iter()
        .filter(|l| l.owner.as_deref().is_some_and(|o| o != view.me) && !view.requested.contains(&l.key))
        .copied()
        .collect();
    others.sort_by_key(|l| l.owner.as_deref().is_some_and(|o| alive.contains(o)));
    if !draining {
        moves.expired_candidates = others.into_iter().cloned().collect();
    }

    // Requests for our leases: honour them while we hold more than our share, and only for live askers.
    let mut surplus = mine.saturating_sub(target);
    for lease in active.iter().filter(|l| view.running.contains(&l.key)) {
        if surplus == 0 {
            break;
        }
        if let Some(asker) = lease.handoff_to.as_deref()
            && asker != view.me
            && alive.contains(asker)
        {
            moves.give.push((lease.key.clone(), asker.to_string()));
            surplus -= 1;
        }
    }
    moves
}

/// This worker's share of the rows to move, by one matching every worker computes alike from the same
/// view: the pool (free rows in key order, then each live donor's surplus in id and key order; all of a
/// draining donor's leases are surplus) is dealt to the short workers in id order, each up to its
/// deficit. Short workers thus take different free rows and ask different donors for different leases,
/// instead of all racing for the first free rows and all asking the most loaded worker, all but one
/// losing until their next read.
fn dealt<'a>(
    active: &[&'a Lease],
    donors: &[String],
    workers: &[String],
    alive: &HashSet<&str>,
    targets: &BTreeMap<String, usize>,
    by_owner: &HashMap<&str, Vec<&'a Lease>>,
    view: &View<'_>,
) -> Vec<&'a Lease> {
    let held = |w: &str| by_owner.get(w).map_or(0, Vec::len);
    // A request already on a row blocks no one when its asker is gone or holds its share by now (it was
    // refused, or the asker was served elsewhere): it may be replaced.
    let stale = |asker: &str| asker != view.me && (!alive.contains(asker) || held(asker) >= targets[asker]);
    // This worker's own request counts only while it waits for it: once given up on (refused for a
    // handoff timeout), the row may be asked for again.
    let pending = |lease: &Lease| {
        view.requested.contains(&lease.key)
            || lease
                .handoff_to
                .as_deref()
                .is_some_and(|asker| asker != view.me && !stale(asker) && lease.owner.as_deref() != Some(asker))
    };
    let mut pending_for: HashMap<&str, usize> = HashMap::new();
    for lease in active.iter().filter(|l| l.owner.is_some() && pending(l)) {
        let asker =
            if view.requested.contains(&lease.key) { view.me } else { lease.handoff_to.as_deref().unwrap_or("") };
        *pending_for.entry(asker).or_default() += 1;
    }
    let mut pool: Vec<&'a Lease> = active.iter().filter(|l| l.owner.is_none()).copied().collect();
    pool.sort_by(|a, b| a.key.cmp(&b.key));
    for donor in donors {
        let surplus = held(donor).saturating_sub(targets.get(donor).copied().unwrap_or(0));
        if surplus == 0 {
            continue;
        }
        let mut mine: Vec<&'a Lease> = by_owner.get(donor.as_str()).cloned().unwrap_or_default();
        mine.sort_by(|a, b| a.key.cmp(&b.key));
        let already = mine.iter().filter(|l| pending(l)).count();
        pool.extend(mine.into_iter().filter(|l| !pending(l)).take(surplus.saturating_sub(already)));
    }
    let mut deck = pool.into_iter();
    for worker in workers {
        let deficit = targets[worker]
            .saturating_sub(held(worker))
            .saturating_sub(pending_for.get(worker.as_str()).copied().unwrap_or(0));
        let share: Vec<&'a Lease> = deck.by_ref().take(deficit).collect();
        if worker == view.me {
            return share;
        }
    }
    Vec::new()
}

/// A free-standing row of stream `s` for the coordinator's unit tests.
#[cfg(test)]
pub(super) fn test_lease(shard: usize, owner: Option<&str>) -> Lease {
    crate::test_rows::row(&format!("shardId-{shard:012}")).owner(owner).counter(1).lease()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Checkpoint;

    fn lease(shard: usize, owner: Option<&str>) -> Lease {
        test_lease(shard, owner)
    }

    fn member(owner: &str, alive: bool) -> Member {
        Member { owner: owner.into(), counter: 1, alive, address: None, draining: false, expiry_ms: None }
    }

    fn running(leases: &[Lease], me: &str) -> HashSet<LeaseKey> {
        leases.iter().filter(|l| l.is_held_by(me)).map(|l| l.key.clone()).collect()
    }

    #[test]
    fn targets_split_evenly_with_the_remainder_to_the_first_ids() {
        let workers: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let t = targets(16, &workers);
        assert_eq!((t["a"], t["b"], t["c"]), (6, 5, 5));
        assert_eq!(t.values().sum::<usize>(), 16);
    }

    #[test]
    fn a_lone_worker_takes_every_free_lease() {
        let leases: Vec<Lease> = (0..4).map(|i| lease(i, None)).collect();
        let empty = HashSet::new();
        let moves = plan(&View { me: "a", leases: &leases, members: &[], running: &empty, requested: &empty });
        assert_eq!(moves.target, 4);
        assert_eq!(moves.take.len(), 4);
    }

    #[test]
    fn a_new_worker_asks_the_loaded_one_for_several_leases_at_once() {
        let leases: Vec<Lease> = (0..16).map(|i| lease(i, Some("a"))).collect();
        let members = [member("a", true), member("b", true), member("c", true), member("d", true)];
        let empty = HashSet::new();
        let moves = plan(&View { me: "d", leases: &leases, members: &members, running: &empty, requested: &empty });
        assert_eq!(moves.target, 4);
        assert!(moves.take.is_empty());
        assert_eq!(moves.ask.len(), 4, "one round asks for the whole deficit");
        // The holder gives up to its surplus once asked.
        let mut asked = leases.clone();
        for l in asked.iter_mut().take(14) {
            l.handoff_to = Some(if l.key.shard_id().ends_with('0') { "zombie".into() } else { "b".into() });
        }
        let run = running(&asked, "a");
        let moves = plan(&View { me: "a", leases: &asked, members: &members, running: &run, requested: &empty });
        assert_eq!(moves.give.len(), 12, "a keeps exactly its share of 4 and ignores dead askers");
        assert!(moves.give.iter().all(|(_, to)| to == "b"));
    }

    #[test]
    fn short_workers_ask_for_different_leases_of_every_donor() {
        let mut leases: Vec<Lease> = (0..10).map(|i| lease(i, Some("a"))).collect();
        leases.extend((10..16).map(|i| lease(i, Some("b"))));
        let members = [member("a", true), member("b", true), member("c", true), member("d", true)];
        let empty = HashSet::new();
        let asks = |me: &str| -> Vec<usize> {
            let moves = plan(&View { me, leases: &leases, members: &members, running: &empty, requested: &empty });
            moves.ask.iter().map(|l| l.key.shard_id().trim_start_matches("shardId-").parse().unwrap()).collect()
        };
        // a holds 6 over its 4, b 2 over: c (first short id) gets a's first four, d a's last two and b's two.
        assert_eq!(asks("c"), vec![0, 1, 2, 3]);
        assert_eq!(asks("d"), vec![4, 5, 10, 11]);
        assert!(asks("a").is_empty() && asks("b").is_empty(), "donors ask for nothing");
    }

    #[test]
    fn workers_starting_together_take_different_free_rows() {
        let leases: Vec<Lease> = (0..10).map(|i| lease(i, None)).collect();
        let members = [member("a", true), member("b", true), member("c", true)];
        let empty = HashSet::new();
        let taken = |me: &str| -> Vec<usize> {
            let moves = plan(&View { me, leases: &leases, members: &members, running: &empty, requested: &empty });
            moves.take.iter().map(|l| l.key.shard_id().trim_start_matches("shardId-").parse().unwrap()).collect()
        };
        assert_eq!((taken("a"), taken("b"), taken("c")), (vec![0, 1, 2, 3], vec![4, 5, 6], vec![7, 8, 9]));
    }

    #[test]
    fn a_shortfall_that_free_rows_cover_asks_for_nothing() {
        let mut leases: Vec<Lease> = (0..4).map(|i| lease(i, Some("a"))).collect();
        leases.extend((4..8).map(|i| lease(i, None)));
        let members = [member("a", true), member("b", true)];
        let empty = HashSet::new();
        let moves = plan(&View { me: "b", leases: &leases, members: &members, running: &empty, requested: &empty });
        assert_eq!(moves.take.len(), 4);
        assert!(moves.ask.is_empty());
    }

    #[test]
    fn leases_of_dead_workers_are_the_first_expiry_candidates() {
        let mut leases: Vec<Lease> = (4..8).map(|i| lease(i, Some("b"))).collect();
        leases.extend((0..4).map(|i| lease(i, Some("dead"))));
        let members = [member("b", true), member("dead", false)];
        let empty = HashSet::new();
        let moves = plan(&View { me: "a", leases: &leases, members: &members, running: &empty, requested: &empty });
        assert_eq!(moves.target, 4);
        assert!(moves.take.is_empty());
        assert_eq!(moves.expired_candidates.len(), 8);
        assert!(moves.expired_candidates[..4].iter().all(|l| l.is_held_by("dead")));
    }

    #[test]
    fn own_rows_are_always_taken_back_and_finished_or_waiting_shards_ignored() {
        let mut leases = vec![lease(0, Some("a")), lease(1, None), lease(2, None)];
        leases[1].checkpoint = Checkpoint::Sequence("1".into());
        leases[2].parent_shard_ids = vec!["shardId-000000000001".into()];
        let mut done = lease(3, None);
        done.checkpoint = Checkpoint::ShardEnd;
        leases.push(done);
        let empty = HashSet::new();
        let moves =
            plan(&View { me: "a", leases: &leases, members: &[member("b", true)], running: &empty, requested: &empty });
        assert_eq!(moves.target, 1, "two active leases (0 and 1) over two workers");
        assert_eq!(
            moves.take.iter().map(|l| l.key.shard_id().to_string()).collect::<Vec<_>>(),
            vec!["shardId-000000000000"]
        );
    }

    #[test]
    fn a_request_of_a_worker_gone_or_served_is_replaced_and_a_live_short_ones_is_not() {
        let mut leases: Vec<Lease> = (0..8).map(|i| lease(i, Some("a"))).collect();
        leases.extend((8..12).map(|i| lease(i, Some("b"))));
        leases[0].handoff_to = Some("gone".into());
        leases[1].handoff_to = Some("b".into());
        leases[2].handoff_to = Some("d".into());
        let members = [member("a", true), member("b", true), member("c", true), member("d", true)];
        let empty = HashSet::new();
        let moves = plan(&View { me: "c", leases: &leases, members: &members, running: &empty, requested: &empty });
        assert_eq!(moves.target, 3);
        let asked: Vec<usize> =
            moves.ask.iter().map(|l| l.key.shard_id().trim_start_matches("shardId-").parse().unwrap()).collect();
        assert_eq!(asked, vec![0, 1, 3], "gone's and b's requests (b holds its 3) are replaced, d's (0 of 3) kept");
    }

    #[test]
    fn pending_requests_count_against_the_deficit() {
        let leases: Vec<Lease> = (0..8).map(|i| lease(i, Some("a"))).collect();
        let members = [member("a", true), member("b", true)];
        let requested: HashSet<LeaseKey> = leases.iter().take(3).map(|l| l.key.clone()).collect();
        let empty = HashSet::new();
        let moves = plan(&View { me: "b", leases: &leases, members: &members, running: &empty, requested: &requested });
        assert_eq!(moves.ask.len(), 1);
    }

    fn draining(owner: &str) -> Member {
        Member { draining: true, ..member(owner, true) }
    }

    fn shard_numbers(leases: &[Lease]) -> Vec<usize> {
        leases.iter().map(|l| l.key.shard_id().trim_start_matches("shardId-").parse().unwrap()).collect()
    }

    #[test]
    fn draining_members_share_nothing_unless_every_live_worker_drains() {
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let members = [member("a", true), draining("b"), member("c", false), draining("d")];
        assert_eq!(sharing("a", &members), (names(&["a", "b", "d"]), names(&["a"])), "c is silent");
        assert_eq!(sharing("b", &members), (names(&["a", "b", "d"]), names(&["a"])));
        let all_draining = [draining("a"), draining("b")];
        assert_eq!(sharing("a", &all_draining), (names(&["a", "b"]), names(&["a", "b"])), "marks ignored");
    }

    #[test]
    fn a_draining_worker_gives_every_lease_to_live_askers_and_takes_none() {
        let mut leases: Vec<Lease> = (0..3).map(|i| lease(i, Some("a"))).collect();
        leases.extend((3..6).map(|i| lease(i, Some("b"))));
        leases.push(lease(6, None));
        leases.push(lease(7, Some("dead")));
        leases[0].handoff_to = Some("b".into());
        leases[1].handoff_to = Some("c".into());
        leases[2].handoff_to = Some("dead".into());
        let members = [draining("a"), member("b", true), draining("c"), member("dead", false)];
        let run = running(&leases, "a");
        let empty = HashSet::new();
        let moves = plan(&View { me: "a", leases: &leases, members: &members, running: &run, requested: &empty });
        assert!(moves.draining);
        assert_eq!(moves.target, 0);
        assert!(moves.take.is_empty() && moves.ask.is_empty(), "no free row taken, nothing asked: {moves:?}");
        assert!(moves.expired_candidates.is_empty(), "not even a dead worker's lease");
        let given: Vec<(usize, &str)> = moves
            .give
            .iter()
            .map(|(key, to)| (key.shard_id().trim_start_matches("shardId-").parse().unwrap(), to.as_str()))
            .collect();
        assert_eq!(given, vec![(0, "b")], "below its share of 0 it gives all, but only to a live, staying asker");
    }

    #[test]
    fn a_lease_handed_to_a_worker_as_it_starts_draining_is_taken_to_be_handed_on() {
        let leases = vec![lease(0, Some("a")), lease(1, Some("b"))];
        let members = [draining("a"), member("b", true)];
        let empty = HashSet::new();
        let moves = plan(&View { me: "a", leases: &leases, members: &members, running: &empty, requested: &empty });
        assert_eq!(shard_numbers(&moves.take), vec![0], "its own row, not running: a reader must finish it");
    }

    #[test]
    fn peers_leave_a_draining_worker_out_and_deal_all_its_leases_among_themselves() {
        let mut leases: Vec<Lease> = (0..2).map(|i| lease(i, Some("a"))).collect();
        leases.extend((2..4).map(|i| lease(i, Some("b"))));
        leases.extend((4..6).map(|i| lease(i, Some("c"))));
        let members = [member("a", true), member("b", true), draining("c")];
        let empty = HashSet::new();
        let asks = |me: &str| {
            let moves = plan(&View { me, leases: &leases, members: &members, running: &empty, requested: &empty });
            assert_eq!((moves.target, moves.workers), (3, 2), "{me}: 6 leases over the 2 staying workers");
            shard_numbers(&moves.ask)
        };
        assert_eq!((asks("a"), asks("b")), (vec![4], vec![5]), "c's two leases, one each");
        // Once handed over, nobody moves anything: c's share is 0.
        for lease in leases.iter_mut().filter(|l| l.is_held_by("c")) {
            let to = if lease.key.shard_id().ends_with('4') { "a" } else { "b" };
            lease.owner = Some(to.into());
        }
        for me in ["a", "b", "c"] {
            let run = running(&leases, me);
            let moves = plan(&View { me, leases: &leases, members: &members, running: &run, requested: &empty });
            assert!(moves.take.is_empty() && moves.ask.is_empty() && moves.give.is_empty(), "{me}: {moves:?}");
        }
    }
}
