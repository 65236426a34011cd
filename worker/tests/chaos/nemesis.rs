//! The nemesis: lanes of fault episodes, every choice drawn from a seeded source. Each episode claims a
//! slot (or the stream, for resharding), does its harm, and undoes it before the next one, so the run
//! always heals; two lanes run at once so faults overlap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_testkit::kinesis;
use leasehold_testkit::nemesis::SeededRng;

use crate::cluster::{Cluster, End, Slot};

/// Wall-clock offsets (seconds, libfaketime's syntax) the nemesis sets on skewed slots.
pub const OFFSETS: &[&str] = &["+3600", "-3600", "+86400", "-600", "+90", "-90", "+0"];

/// What the nemesis may do, and how long a lease lasts (stops and cuts are sized against it).
pub struct Plan {
    /// The workers' lease duration.
    pub lease: Duration,
    /// How long a SIGTERM'd worker may take to exit before it is SIGKILLed (and counted as killed).
    pub patience: Duration,
    /// Fewest and most open shards resharding keeps.
    pub shards: (usize, usize),
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Kill,
    Terminate,
    Stop,
    ThrottleDynamo,
    DelayDynamo,
    CutDynamo,
    ThrottleKinesis,
    DelayKinesis,
    Skew,
    Split,
    Merge,
}

/// Relative weights: process faults most often, since they are what leases are for.
const ACTIONS: &[(Action, u64)] = &[
    (Action::Kill, 3),
    (Action::Terminate, 2),
    (Action::Stop, 2),
    (Action::ThrottleDynamo, 1),
    (Action::DelayDynamo, 1),
    (Action::CutDynamo, 2),
    (Action::ThrottleKinesis, 1),
    (Action::DelayKinesis, 1),
    (Action::Skew, 1),
    (Action::Split, 1),
    (Action::Merge, 1),
];

fn draw(rng: &mut SeededRng) -> Action {
    let total: u64 = ACTIONS.iter().map(|(_, w)| w).sum();
    let mut pick = rng.below(total);
    for (action, weight) in ACTIONS {
        if pick < *weight {
            return *action;
        }
        pick -= weight;
    }
    Action::Kill
}

/// Runs one lane of episodes until `until`.
pub async fn lane(
    cluster: Arc<Cluster>,
    client: aws_sdk_kinesis::Client,
    plan: Arc<Plan>,
    mut rng: SeededRng,
    until: Instant,
    reshard: Arc<tokio::sync::Mutex<()>>,
) {
    while Instant::now() < until {
        tokio::time::sleep(rng.millis(300, 2500)).await;
        let action = draw(&mut rng);
        match action {
            Action::Split | Action::Merge => {
                let _stream = reshard.lock().await;
                reshard_once(&cluster, &client, &plan, &mut rng, matches!(action, Action::Split)).await;
            }
            _ => {
                // The slot drawn, or the next one free: another lane may hold it.
                let first = rng.below(cluster.slots.len() as u64) as usize;
                let count = cluster.slots.len();
                let claimed = (0..count).find_map(|i| cluster.slots[(first + i) % count].try_lock().ok());
                let Some(mut slot) = claimed else { continue };
                episode(&cluster, &plan, &mut rng, &mut slot, action).await;
            }
        }
    }
}

async fn episode(cluster: &Cluster, plan: &Plan, rng: &mut SeededRng, slot: &mut Slot, action: Action) {
    if slot.current.is_none() {
        cluster.start_worker(slot, false).await;
        return;
    }
    // A soak's stayer keeps its process: a process fault drawn for it becomes a DynamoDB fault.
    let action = match action {
        Action::Kill | Action::Terminate | Action::Stop if slot.stayer => {
            [Action::ThrottleDynamo, Action::DelayDynamo, Action::CutDynamo][rng.below(3) as usize]
        }
        other => other,
    };
    match action {
        Action::Kill | Action::Terminate => {
            let (signal, end) =
                if matches!(action, Action::Kill) { ("KILL", End::Killed) } else { ("TERM", End::Terminated) };
            // Sometimes a graceful stop while cut off from DynamoDB: no release can succeed, and the
            // worker must still exit within its graceful timeout.
            let cut = matches!(action, Action::Terminate) && rng.chance(30);
            let Some(incarnation) = slot.current.as_mut() else { return };
            let id = incarnation.id.clone();
            if cut {
                incarnation.dynamo.faults().set_cut(true);
                let now = Instant::now();
                incarnation.faults.push((now, now + plan.patience, "DynamoDB cut off at SIGTERM".into()));
                cluster.note(format!("DynamoDB cut off for {id} before its SIGTERM"));
                tokio::time::sleep(rng.millis(0, 1500)).await;
            }
            cluster.note(format!("SIG{signal} {id}"));
            cluster.stop_worker(slot, signal, end, plan.patience).await;
            tokio::time::sleep(rng.millis(0, 3000)).await;
            let new_owner = rng.chance(50);
            cluster.start_worker(slot, new_owner).await;
        }
        Action::Stop => {
            let pause = plan.lease + rng.millis(200, 3000);
            let Some(incarnation) = slot.current.as_mut() else { return };
            cluster.note(format!("SIGSTOP {} for {pause:?}", incarnation.id));
            let from = Instant::now();
            incarnation.process.signal("STOP");
            tokio::time::sleep(pause).await;
            incarnation.process.signal("CONT");
            incarnation.faults.push((from, Instant::now(), "SIGSTOP".into()));
            cluster.note(format!("SIGCONT {}", incarnation.id));
        }
        Action::ThrottleDynamo | Action::DelayDynamo | Action::CutDynamo => {
            let Some(incarnation) = slot.current.as_mut() else { return };
            let faults = incarnation.dynamo.faults();
            let (what, length) = match action {
                Action::ThrottleDynamo => {
                    let permille = rng.between(200, 900) as u32;
                    faults.set_throttle_permille(permille);
                    (format!("DynamoDB throttled {permille}‰"), rng.millis(1000, 6000))
                }
                Action::DelayDynamo => {
                    // Now and then past a whole lease: a renewal answered after the deadline.
                    let delay = if rng.chance(20) { rng.millis(1500, 3000) } else { rng.millis(50, 1500) };
                    faults.set_delay(delay);
                    (format!("DynamoDB delayed {delay:?}"), rng.millis(1000, 6000))
                }
                _ => {
                    faults.set_cut(true);
                    (
                        "DynamoDB cut off (Kinesis reachable)".to_string(),
                        rng.millis(500, 3 * plan.lease.as_millis() as u64),
                    )
                }
            };
            cluster.note(format!("{what} for {} for {length:?}", incarnation.id));
            let from = Instant::now();
            tokio::time::sleep(length).await;
            faults.heal();
            incarnation.faults.push((from, Instant::now(), what));
            cluster.note(format!("DynamoDB healed for {}", incarnation.id));
        }
        Action::ThrottleKinesis | Action::DelayKinesis => {
            let faults = slot.kinesis.faults();
            let length = rng.millis(1000, 6000);
            let what = if matches!(action, Action::ThrottleKinesis) {
                let permille = rng.between(200, 900) as u32;
                faults.set_throttle_permille(permille);
                format!("Kinesis throttled {permille}‰")
            } else {
                let delay = rng.millis(50, 1500);
                faults.set_delay(delay);
                // A slow Kinesis is slower for a bigger page (a loaded kinesalite took 28 s for 1000
                // records, seed 4491231873834608077): from the same draw, so seeds replay as before.
                let per_record = delay / 150;
                faults.set_record_delay(per_record);
                format!("Kinesis delayed {delay:?} (+{per_record:?} per record read)")
            };
            cluster.note(format!("{what} for slot {} for {length:?}", slot.name));
            tokio::time::sleep(length).await;
            faults.heal();
            cluster.note(format!("Kinesis healed for slot {}", slot.name));
        }
        Action::Skew => {
            let Some(file) = &slot.skew_file else { return };
            let offset = OFFSETS[rng.below(OFFSETS.len() as u64) as usize];
            std::fs::write(file, format!("{offset}\n")).expect("write skew file");
            let id = slot.current.as_ref().map(|i| i.id.clone()).unwrap_or_default();
            cluster.note(format!("wall clock of slot {} ({id}) set {offset} s off", slot.name));
        }
        Action::Split | Action::Merge => {}
    }
}

async fn reshard_once(
    cluster: &Cluster,
    client: &aws_sdk_kinesis::Client,
    plan: &Plan,
    rng: &mut SeededRng,
    split: bool,
) {
    let mut open = kinesis::open_shards(client, &cluster.stream).await;
    open.sort_by_key(|(_, start, _)| *start);
    if split && open.len() < plan.shards.1 {
        let (shard, _, _) = &open[rng.below(open.len() as u64) as usize];
        cluster.note(format!("split {shard}"));
        kinesis::split(client, &cluster.stream, shard).await;
        cluster.note(format!("split {shard} done"));
    } else if !split && open.len() > plan.shards.0 {
        let pairs: Vec<(&str, &str)> =
            open.windows(2).filter(|w| w[0].2 + 1 == w[1].1).map(|w| (w[0].0.as_str(), w[1].0.as_str())).collect();
        if pairs.is_empty() {
            return;
        }
        let (a, b) = pairs[rng.below(pairs.len() as u64) as usize];
        cluster.note(format!("merge {a} + {b}"));
        kinesis::merge(client, &cluster.stream, a, b).await;
        cluster.note(format!("merge {a} + {b} done"));
    }
}
