use super::*;

const T0_MS: i64 = 1_800_000_000_000;

fn target() -> LagTarget {
    LagTarget {
        target: Duration::from_secs(60),
        scale_up_after: Duration::from_secs(60),
        scale_down_after: Duration::from_secs(600),
    }
}

fn at(second: i64) -> Timestamp {
    Timestamp::from_millisecond(T0_MS + second * 1000).unwrap()
}

fn observed(second: i64, lag_secs: Option<u64>) -> Observed {
    Observed {
        largest: lag_secs.map(Duration::from_secs),
        base: 2,
        open_shards: Some(6),
        max_replicas: 10,
        now: at(second),
    }
}

/// Runs `lags` (second, lag) through `decide` from a fresh state; returns the replicas after each step
/// and the last decision.
fn run(lags: &[(i64, Option<u64>)]) -> (Vec<i32>, Decision) {
    let mut state = LagScalingStatus::default();
    let mut replicas = Vec::new();
    let mut last = None;
    for (second, lag) in lags {
        let decision = decide(&target(), &state, &observed(*second, *lag));
        state = decision.state.clone();
        replicas.push(decision.replicas);
        last = Some(decision);
    }
    (replicas, last.unwrap())
}

#[test]
fn replicas_rise_one_step_per_scale_up_window_up_to_the_open_shards() {
    let lags: Vec<_> = (0..=8).map(|i| (i * 30, Some(90))).collect();
    let (replicas, last) = run(&lags);
    // Steps at 60 s, 120 s, 180 s, 240 s; then every worker reads one of the 6 open shards.
    assert_eq!(replicas, [2, 2, 3, 3, 4, 4, 5, 5, 6]);
    assert!(!last.verdict.ok);
    assert_eq!(last.verdict.reason, "OneShardPerWorker");
    assert!(last.verdict.message.contains("raise concurrency"), "{}", last.verdict.message);
}

#[test]
fn each_step_says_why() {
    let (_, step) = run(&[(0, Some(90)), (60, Some(90))]);
    let why = step.why.expect("a step has a reason");
    assert!(why.contains("lag 1m30s above target 1m"), "{why}");
    let (_, hold) = run(&[(0, Some(90)), (30, Some(90))]);
    assert_eq!(hold.why, None);
    assert_eq!(hold.verdict.reason, "AboveTarget");
}

#[test]
fn a_dip_below_the_target_restarts_the_scale_up_window() {
    let (replicas, _) = run(&[(0, Some(90)), (50, Some(45)), (70, Some(90)), (100, Some(90)), (130, Some(90))]);
    assert_eq!(replicas, [2, 2, 2, 2, 3]);
}

#[test]
fn replicas_fall_back_to_the_shard_count_rule_only_after_the_lag_stays_under_half_the_target() {
    let mut lags: Vec<_> = (0..=4).map(|i| (i * 60, Some(120))).collect();
    // Under half the target from 300 s, but back in the band at 600 s: the window starts again.
    lags.extend([(300, Some(20)), (600, Some(40)), (620, Some(20)), (1200, Some(20)), (1220, Some(20))]);
    let (replicas, last) = run(&lags);
    assert_eq!(replicas, [2, 3, 4, 5, 6, 6, 6, 6, 6, 2]);
    assert_eq!(last.state.extra_replicas, 0);
    assert!(last.why.unwrap().contains("back to the shard-count rule"));
    assert!(last.verdict.ok);
}

#[test]
fn a_lag_around_the_target_does_not_flap() {
    // Every 10 s the lag swings across the target and across half of it: never above for a whole
    // scaleUpAfter, never under half for a whole scaleDownAfter, so the replicas never move.
    let swings = [61, 59, 29, 31, 61, 25, 70, 45];
    let lags: Vec<_> = (0..360).map(|i| (i * 10, Some(swings[i as usize % swings.len()]))).collect();
    let (replicas, _) = run(&lags);
    assert!(replicas.iter().all(|r| *r == 2), "{replicas:?}");

    // Once scaled up, a lag that hovers between half the target and the target keeps the workers.
    let mut lags: Vec<_> = (0..=2).map(|i| (i * 60, Some(90))).collect();
    lags.extend((3..400).map(|i: i64| (i * 10 + 120, Some(30 + (i as u64 % 3) * 10))));
    let (replicas, _) = run(&lags);
    assert!(replicas[3..].iter().all(|r| *r == 4), "{replicas:?}");
}

#[test]
fn an_unknown_lag_changes_nothing() {
    let (replicas, last) = run(&[(0, Some(90)), (60, Some(90)), (90, None), (2000, None)]);
    assert_eq!(replicas, [2, 3, 3, 3]);
    assert_eq!(last.verdict.reason, "NotMeasured");
    assert_eq!(last.state.above_target_since, Some(Time(at(0))), "the window is kept, not restarted");
}

#[test]
fn max_replicas_bounds_the_steps_and_says_so() {
    let mut state = LagScalingStatus::default();
    let mut last = None;
    for second in [0, 60, 120, 180] {
        let seen = Observed { max_replicas: 3, ..observed(second, Some(90)) };
        let decision = decide(&target(), &state, &seen);
        state = decision.state.clone();
        last = Some(decision);
    }
    let last = last.unwrap();
    assert_eq!(last.replicas, 3);
    assert_eq!((last.verdict.ok, last.verdict.reason.as_str()), (false, "AtMaxReplicas"));
}

#[test]
fn fewer_open_shards_take_the_extra_workers_with_them() {
    let previous = LagScalingStatus { extra_replicas: 4, ..LagScalingStatus::default() };
    let merged = Observed { open_shards: Some(3), ..observed(0, Some(40)) };
    let decision = decide(&target(), &previous, &merged);
    assert_eq!((decision.replicas, decision.state.extra_replicas), (3, 1));
}

/// The state as the API server gives it back: `Time` keeps whole seconds.
fn through_the_api_server(state: &LagScalingStatus) -> LagScalingStatus {
    serde_json::from_value(serde_json::to_value(state).unwrap()).unwrap()
}

#[test]
fn no_window_ends_early_when_the_api_server_keeps_whole_seconds() {
    let target =
        LagTarget { scale_up_after: Duration::from_secs(1), scale_down_after: Duration::from_secs(3), ..target() };
    let ms = |ms: i64| Timestamp::from_millisecond(T0_MS + ms).unwrap();
    let look = |state: &LagScalingStatus, at_ms: i64, lag_secs: u64| {
        let observed = Observed { now: ms(at_ms), ..observed(0, Some(lag_secs)) };
        let decision = decide(&target, state, &observed);
        (decision.replicas, through_the_api_server(&decision.state))
    };
    // Above target from 0.6 s: no step before 1.6 s, whatever the API server did to the stamp.
    let (_, mut state) = look(&LagScalingStatus::default(), 600, 90);
    for at in (700..1_600).step_by(100) {
        let (replicas, next) = look(&state, at, 90);
        assert_eq!(replicas, 2, "stepped {} ms after the crossing", at - 600);
        state = next;
    }
    let (replicas, stepped) = look(&state, 2_000, 90);
    assert_eq!(replicas, 3, "one step once a whole scaleUpAfter passed");
    // The next step waits a whole scaleUpAfter from this one, too.
    let (replicas, _) = look(&stepped, 2_900, 90);
    assert_eq!(replicas, 3, "a second step 0.9 s after the first");
    // Under half from 5.3 s: still 3 workers until 8.3 s.
    let (_, mut state) = look(&stepped, 5_300, 0);
    for at in (5_400..8_300).step_by(100) {
        let (replicas, next) = look(&state, at, 0);
        assert_eq!(replicas, 3, "fell back {} ms after the lag went under half", at - 5_300);
        state = next;
    }
    let (replicas, _) = look(&state, 9_000, 0);
    assert_eq!(replicas, 2, "back to the shard-count rule after scaleDownAfter");
}
