//! The segmented scan's decisions, from rows as they would be read, on a paused clock: no store, no
//! process.

use super::*;
use crate::lease::Checkpoint;

fn lease(shard: &str, owner: Option<&str>, counter: u64) -> Lease {
    crate::test_rows::row(shard).owner(owner).counter(counter).lease()
}

#[test]
fn the_shape_changes_with_the_spread_and_the_group_but_not_with_renewals() {
    let page = |owners: &[Option<&str>], counter: u64, members: &[&str]| LeasePage {
        leases: owners.iter().enumerate().map(|(i, o)| lease(&format!("s{i}"), *o, counter)).collect(),
        members: members
            .iter()
            .map(|m| Member {
                owner: (*m).into(),
                counter,
                alive: true,
                address: None,
                draining: false,
                expiry_ms: None,
            })
            .collect(),
        ..LeasePage::default()
    };
    let shape = |page: &LeasePage| {
        let mut view = TableView::default();
        view.merge(page);
        GroupShape::of(&view, "w1")
    };
    let at_rest = shape(&page(&[Some("w1"), Some("w2")], 1, &["w2"]));
    assert_eq!(at_rest, shape(&page(&[Some("w1"), Some("w2")], 7, &["w2"])), "renewals move no share");
    assert_ne!(at_rest, shape(&page(&[Some("w2"), Some("w2")], 1, &["w2"])), "a lease moved");
    assert_ne!(at_rest, shape(&page(&[Some("w1"), None], 1, &["w2"])), "a lease freed");
    assert_ne!(at_rest, shape(&page(&[Some("w1"), Some("w2")], 1, &["w2", "w3"])), "a worker joined");
    assert_ne!(at_rest, shape(&page(&[Some("w1"), Some("w2"), None], 1, &["w2"])), "a shard appeared");
}

#[test]
fn a_partial_read_updates_only_the_rows_it_read() {
    let mut view = TableView::default();
    let whole = LeasePage {
        leases: vec![lease("a", Some("w1"), 1), lease("b", Some("w2"), 1)],
        members: vec![Member {
            owner: "w1".into(),
            counter: 1,
            alive: true,
            address: None,
            draining: false,
            expiry_ms: None,
        }],
        ..LeasePage::default()
    };
    view.merge(&whole);
    let part = LeasePage { leases: vec![lease("b", None, 2)], ..LeasePage::default() };
    view.merge(&part);
    assert_eq!(view.leases[&LeaseKey::new("s", "a")].owner.as_deref(), Some("w1"));
    assert_eq!(view.leases[&LeaseKey::new("s", "b")].owner, None);
    assert_eq!(view.live("w3"), vec!["w1".to_string(), "w3".to_string()]);
    assert_eq!(view.rows(), 3);
}

fn member(owner: &str, alive: bool) -> Member {
    Member { owner: owner.into(), counter: 1, alive, address: None, draining: false, expiry_ms: None }
}

fn settings() -> CoordinatorSettings {
    CoordinatorSettings {
        renew_interval: Duration::from_secs(3),
        scan_interval: Duration::from_millis(500),
        shard_sync_interval: Duration::from_secs(10),
        graceful_timeout: Duration::from_secs(5),
        handoff_timeout: Duration::from_secs(10),
        reader: crate::shard::ReaderSettings::default(),
        mode: super::super::Mode::Segmented { rows_per_segment: 2 },
        balance: super::super::Balance::Count,
    }
}

/// A scan that has read the whole table once: `w1` and `w2` alive, `a` held by w1, `b` by w2.
fn after_one_whole_read(now: Instant) -> SegmentedScan {
    let mut scan = SegmentedScan::new(now);
    let page = LeasePage {
        leases: vec![lease("a", Some("w1"), 1), lease("b", Some("w2"), 1)],
        members: vec![member("w1", true), member("w2", true)],
        ..LeasePage::default()
    };
    scan.note_whole(&page, "w1", Vec::new(), &settings(), now);
    scan
}

#[tokio::test(start_paused = true)]
async fn nothing_read_yet_means_a_whole_read_and_a_forming_group_is_read_again_a_renew_interval_later() {
    let now = Instant::now();
    let mut scan = SegmentedScan::new(now);
    assert_eq!(scan.segments_to_read("w1", 2, Duration::from_secs(10), now), None, "no view yet: read it all");
    let scan_now = after_one_whole_read(now);
    scan = scan_now;
    assert!(scan.segments_to_read("w1", 2, Duration::from_secs(10), now).is_some(), "segments until re-read");
    let later = now + Duration::from_secs(3);
    assert_eq!(scan.segments_to_read("w1", 2, Duration::from_secs(10), later), None, "first shape: re-read");
}

#[tokio::test(start_paused = true)]
async fn a_group_at_rest_is_read_whole_rarely() {
    let now = Instant::now();
    let mut scan = after_one_whole_read(now);
    let page = LeasePage {
        leases: vec![lease("a", Some("w1"), 9), lease("b", Some("w2"), 9)],
        members: vec![member("w1", true), member("w2", true)],
        ..LeasePage::default()
    };
    let again = now + Duration::from_secs(3);
    scan.note_whole(&page, "w1", Vec::new(), &settings(), again);
    // The same shape twice: next whole read after max(shard sync 10 s, 4 x 500 ms x 2 workers).
    assert!(scan.segments_to_read("w1", 2, Duration::from_secs(10), again + Duration::from_secs(9)).is_some());
    assert_eq!(scan.segments_to_read("w1", 2, Duration::from_secs(10), again + Duration::from_secs(10)), None);
}

#[tokio::test(start_paused = true)]
async fn a_row_freed_by_its_holder_is_taken_from_the_segment_read_and_the_whole_read_follows() {
    let now = Instant::now();
    let mut scan = after_one_whole_read(now);
    let page = LeasePage { leases: vec![lease("b", None, 2)], ..LeasePage::default() };
    assert_eq!(scan.note_segments(&page, "w1", &[], now), AfterSegments::TakeFreedThenReadWhole);
    assert_eq!(scan.segments_to_read("w1", 2, Duration::from_secs(10), now), None, "whole read at the next scan");
    let orphans = scan.orphans(&page, &[], false, Duration::from_secs(6), now);
    assert_eq!(orphans, vec![Orphan::Freed(lease("b", None, 2))], "taken at once, whatever the shares");
    assert!(scan.orphans(&page, &[], false, Duration::from_secs(6), now).is_empty(), "freed is news once");
}

#[tokio::test(start_paused = true)]
async fn a_row_left_free_is_taken_only_after_the_patience_and_only_if_its_counter_stays() {
    let now = Instant::now();
    let mut scan = after_one_whole_read(now);
    let free = LeasePage { leases: vec![lease("c", None, 1)], ..LeasePage::default() };
    scan.note_segments(&free, "w1", &[], now);
    let patience = Duration::from_secs(6);
    assert!(scan.orphans(&free, &[], false, patience, now).is_empty(), "first seen free");
    assert!(scan.orphans(&free, &[], false, patience, now + Duration::from_secs(5)).is_empty(), "within the patience");
    let moved = LeasePage { leases: vec![lease("c", None, 2)], ..LeasePage::default() };
    assert!(scan.orphans(&moved, &[], false, patience, now + Duration::from_secs(7)).is_empty(), "its counter moved");
    let later = now + Duration::from_secs(14);
    assert_eq!(scan.orphans(&moved, &[], false, patience, later), vec![Orphan::Untaken(lease("c", None, 2))]);
    assert!(
        scan.orphans(&moved, &[lease("c", None, 2)], false, patience, later).is_empty(),
        "the plan takes it already"
    );
}

#[tokio::test(start_paused = true)]
async fn changes_that_move_the_shares_call_for_a_whole_read_and_renewals_do_not() {
    let now = Instant::now();
    let mut scan = after_one_whole_read(now);
    let renewed = LeasePage { leases: vec![lease("b", Some("w2"), 5)], ..LeasePage::default() };
    assert_eq!(scan.note_segments(&renewed, "w1", &[], now), AfterSegments::Plan);
    let mut ended = lease("b", Some("w2"), 6);
    ended.checkpoint = Checkpoint::ShardEnd;
    let page = LeasePage { leases: vec![ended], ..LeasePage::default() };
    assert_eq!(scan.note_segments(&page, "w1", &[], now), AfterSegments::ReadWhole, "a shard ended");
    let joined = LeasePage { members: vec![member("w3", true)], ..LeasePage::default() };
    assert_eq!(scan.note_segments(&joined, "w1", &[], now), AfterSegments::ReadWhole, "a worker joined");
    let silent = LeasePage { members: vec![member("w2", false)], ..LeasePage::default() };
    assert_eq!(scan.note_segments(&silent, "w1", &[], now), AfterSegments::ReadWhole, "a worker went silent");
    let mut fresh = after_one_whole_read(now);
    let stranger = ["w9".to_string()];
    assert_eq!(fresh.note_segments(&renewed, "w1", &stranger, now), AfterSegments::ReadWhole, "an unknown asker");
    fresh.note_whole(&renewed, "w1", stranger.to_vec(), &settings(), now);
    assert_eq!(fresh.note_segments(&renewed, "w1", &stranger, now), AfterSegments::Plan, "judged once");
}

#[tokio::test(start_paused = true)]
async fn a_segment_given_up_is_read_on_for_a_lease_duration() {
    let now = Instant::now();
    let lease_duration = Duration::from_secs(10);
    let mut scan = after_one_whole_read(now);
    let alone = scan.segments_to_read("w1", 2, lease_duration, now).expect("segments");
    // A third worker joins: more segments, and w1 reads others; the old ones are read on for a lease.
    let page = LeasePage {
        leases: vec![lease("a", Some("w1"), 1), lease("b", Some("w2"), 1), lease("c", None, 1)],
        members: vec![member("w1", true), member("w2", true), member("w3", true)],
        ..LeasePage::default()
    };
    scan.note_whole(&page, "w1", Vec::new(), &settings(), now);
    let after_join = scan.segments_to_read("w1", 2, lease_duration, now).expect("segments");
    assert!(alone.iter().all(|s| after_join.contains(s)), "{alone:?} still read within {after_join:?}");
    let later = now + lease_duration;
    let at_rest = {
        scan.note_whole(&page, "w1", Vec::new(), &settings(), later);
        scan.segments_to_read("w1", 2, lease_duration, later).expect("segments")
    };
    assert!(at_rest.iter().all(|(_, total)| *total == at_rest[0].1), "only the new split after a lease: {at_rest:?}");
}

#[tokio::test(start_paused = true)]
async fn a_refused_request_brings_a_whole_read_forward_once() {
    let now = Instant::now();
    let renew = Duration::from_secs(3);
    let mut scan = after_one_whole_read(now);
    let key = LeaseKey::new("s", "a");
    let far = now + Duration::from_secs(60);
    let requests = || vec![(key.clone(), Some("w2".to_string()), false)];
    scan.whole_at = far;
    scan.judge_requests("w1", false, false, requests(), renew);
    assert_eq!(scan.whole_at, now + renew, "judged again a re-read interval after the last whole read");
    scan.judge_requests("w1", true, false, requests(), renew);
    scan.whole_at = far;
    scan.judge_requests("w1", false, false, requests(), renew);
    assert_eq!(scan.whole_at, far, "a request a whole read judged is not judged again");
    scan.judge_requests("w1", false, false, vec![(key.clone(), Some("w3".to_string()), true)], renew);
    assert_eq!(scan.whole_at, far, "being handed over: nothing refused");
}

#[tokio::test(start_paused = true)]
async fn the_plan_sees_this_workers_own_latest_writes_unless_a_newer_row_was_read() {
    let now = Instant::now();
    let scan = after_one_whole_read(now);
    let key = LeaseKey::new("s", "a");
    let mut asked = lease("a", Some("w1"), 4);
    asked.handoff_to = Some("w2".into());
    let (leases, _) = scan.view_for_plan(&HashSet::new(), std::iter::once((key.clone(), asked.clone())));
    assert_eq!(leases.iter().find(|l| l.key == key), Some(&asked), "the renewal's answer is newer");
    let fresh: HashSet<LeaseKey> = [key.clone()].into();
    let (leases, _) = scan.view_for_plan(&fresh, std::iter::once((key.clone(), lease("a", Some("w1"), 1))));
    assert_eq!(leases.iter().find(|l| l.key == key).map(|l| l.counter), Some(1), "same counter: the read row");
}

#[tokio::test(start_paused = true)]
async fn a_change_announced_by_another_worker_brings_the_whole_read_forward_and_ours_does_not() {
    let now = Instant::now();
    let mut scan = after_one_whole_read(now);
    scan.whole_at = now + Duration::from_secs(60);
    scan.announced();
    assert!(!scan.note_changes(1, now), "our own announcement");
    assert!(scan.note_changes(2, now), "another worker's");
    assert_eq!(scan.whole_at, now);
}

#[tokio::test(start_paused = true)]
async fn rows_freed_after_the_segment_read_are_still_taken_from_the_whole_read_that_follows() {
    let now = Instant::now();
    let mut scan = after_one_whole_read(now);
    // The holder w2 releases "b" and then "c" (also its): the segment read falls between the two.
    let seen = LeasePage {
        leases: vec![lease("b", None, 2), lease("c", Some("w2"), 1), lease("a", Some("w1"), 1)],
        ..LeasePage::default()
    };
    assert_eq!(scan.note_segments(&seen, "w1", &[], now), AfterSegments::TakeFreedThenReadWhole);
    assert_eq!(scan.orphans(&seen, &[], false, Duration::from_secs(6), now), vec![Orphan::Freed(lease("b", None, 2))]);
    let whole = LeasePage {
        leases: vec![lease("a", Some("w1"), 1), lease("b", Some("w1"), 3), lease("c", None, 2), lease("d", None, 1)],
        members: vec![member("w1", true)],
        ..LeasePage::default()
    };
    let later = now + Duration::from_millis(500);
    scan.note_whole(&whole, "w1", Vec::new(), &settings(), later);
    let orphans = scan.orphans(&whole, &[], true, Duration::from_secs(6), later);
    assert_eq!(orphans, vec![Orphan::Freed(lease("c", None, 2))], "c was in w1's segment; d was never held");
}
