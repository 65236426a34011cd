//! Which segments of the lease table each worker reads (`lease.scan: segmented`). Pure: every worker
//! computes the same assignment from the same member list, so every segment is read by two workers
//! (one when the group has one) without anyone deciding.

/// How many segments a table of `rows` rows is split into for `members` live workers: about
/// `rows_per_segment` rows each, never more segments than workers, at least one.
pub fn segment_count(rows: usize, members: usize, rows_per_segment: usize) -> u32 {
    let wanted = rows.div_ceil(rows_per_segment.max(1)).max(1);
    u32::try_from(wanted.min(members.max(1))).unwrap_or(u32::MAX)
}

/// The positions (in `0..members`) of the workers that read `segment` of `total`: the worker at
/// `segment` and the one `total` places further round the ring (one place when `total` equals the
/// group), so the two differ whenever the group has two workers and nobody reads more than two.
pub fn watchers(segment: u32, total: u32, members: usize) -> Vec<usize> {
    if members == 0 {
        return Vec::new();
    }
    let segment = segment as usize;
    let total = total as usize;
    let first = segment % members;
    let offset = if total < members { total } else { 1 };
    let second = (segment + offset) % members;
    if second == first { vec![first] } else { vec![first, second] }
}

/// The segments, of `total`, that `me` reads among `members` (the live workers' ids, sorted and
/// deduplicated, `me` among them).
pub fn watched(members: &[String], total: u32, me: &str) -> Vec<u32> {
    let Some(position) = members.iter().position(|m| m == me) else { return Vec::new() };
    (0..total).filter(|&segment| watchers(segment, total, members.len()).contains(&position)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("w{i:03}")).collect()
    }

    #[test]
    fn segments_hold_about_the_rows_asked_and_never_outnumber_the_workers() {
        assert_eq!(segment_count(1_101, 100, 80), 14);
        assert_eq!(segment_count(551, 50, 80), 7);
        assert_eq!(segment_count(111, 10, 80), 2);
        assert_eq!(segment_count(16, 3, 4), 3, "capped by the group");
        assert_eq!(segment_count(0, 0, 80), 1);
        assert_eq!(segment_count(5, 1, 1), 1, "a lone worker reads the whole table");
    }

    #[test]
    fn every_segment_is_read_by_two_different_workers_and_nobody_reads_more_than_two() {
        for members in 1..=40 {
            for rows_per_segment in [1, 3, 7, 80] {
                let group = ids(members);
                let total = segment_count(members * 10, members, rows_per_segment);
                let mut readers = vec![0usize; total as usize];
                for me in &group {
                    let mine = watched(&group, total, me);
                    assert!(mine.len() <= 2, "{me} reads {mine:?} of {total} in a group of {members}");
                    for segment in mine {
                        readers[segment as usize] += 1;
                    }
                }
                let want = members.min(2);
                assert!(readers.iter().all(|&r| r == want), "{members} workers, {total} segments: {readers:?}");
            }
        }
    }

    #[test]
    fn a_lone_worker_reads_everything_and_a_stranger_nothing() {
        let group = ids(1);
        assert_eq!(watched(&group, 1, "w000"), vec![0]);
        assert!(watched(&group, 1, "someone-else").is_empty());
    }

    #[test]
    fn the_assignment_depends_only_on_the_member_list() {
        let group = ids(7);
        let first: Vec<Vec<u32>> = group.iter().map(|me| watched(&group, 5, me)).collect();
        let again: Vec<Vec<u32>> = group.iter().map(|me| watched(&group, 5, me)).collect();
        assert_eq!(first, again);
        // 5 segments over 7 workers: segment s is read by workers s and s + 5 (mod 7).
        assert_eq!(watchers(0, 5, 7), vec![0, 5]);
        assert_eq!(watchers(3, 5, 7), vec![3, 1]);
    }
}
