//! The dispatcher's guarantees under random processing delays: per-key order, the concurrency limit,
//! the watermark with out-of-order completion, the window, the gate and graceful stops.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::Rng;

use super::*;
use crate::processor::{Outputs, ProcessError, ShardProcessor};

/// Watches what runs: how many at once, per key at once, and each key's processing order.
#[derive(Default)]
struct Probe {
    running: AtomicUsize,
    most: AtomicUsize,
    per_key: Mutex<HashMap<String, usize>>,
    same_key_overlaps: AtomicUsize,
    started: Mutex<HashMap<String, Vec<u64>>>,
    finished: Mutex<Vec<u64>>,
    /// Delay of record n, or random up to 3 ms when absent.
    delays: Option<fn(u64) -> Duration>,
}

fn number(record: &Record) -> u64 {
    record.sequence_number.parse().unwrap_or(u64::MAX)
}

#[async_trait]
impl ShardProcessor for Probe {
    async fn process(&self, record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        let n = number(record);
        let now = self.running.fetch_add(1, AtomicOrdering::SeqCst) + 1;
        self.most.fetch_max(now, AtomicOrdering::SeqCst);
        {
            let mut per_key = self.per_key.lock().unwrap();
            let count = per_key.entry(record.partition_key.clone()).or_default();
            *count += 1;
            if *count > 1 {
                self.same_key_overlaps.fetch_add(1, AtomicOrdering::SeqCst);
            }
        }
        self.started.lock().unwrap().entry(record.partition_key.clone()).or_default().push(n);
        let delay = match self.delays {
            Some(delay) => delay(n),
            None => Duration::from_micros(rand::rng().random_range(0..3000)),
        };
        tokio::time::sleep(delay).await;
        *self.per_key.lock().unwrap().get_mut(&record.partition_key).unwrap() -= 1;
        self.running.fetch_sub(1, AtomicOrdering::SeqCst);
        self.finished.lock().unwrap().push(n);
        Ok(())
    }
}

fn record(n: u64, key: &str) -> Record {
    Record {
        stream: Arc::from("s"),
        shard_id: Arc::from("shardId-0"),
        sequence_number: n.to_string(),
        partition_key: key.to_string(),
        data: Bytes::new(),
        arrival_ms: None,
        explicit_hash_key: None,
        sub_sequence_number: None,
    }
}

fn dispatcher(ordering: Ordering, concurrency: usize, probe: Arc<Probe>) -> (Dispatcher, CancellationToken) {
    let stop = CancellationToken::new();
    let runner = Arc::new(RecordRunner::new(Arc::default()));
    let settings = DispatchSettings { ordering, concurrency };
    (Dispatcher::new(settings, runner, probe, stop.clone(), Arc::new(|| true)), stop)
}

/// Admits every record as the shard reader does (waiting for room), then waits for all to end.
async fn feed(d: &mut Dispatcher, records: Vec<Record>) {
    for r in records {
        while !d.has_room() {
            assert!(d.step().await.expect("gate open"), "full window with nothing running");
        }
        d.push_plain(r).expect("gate open");
        assert!(d.marks.pending() <= d.window, "window exceeded");
    }
    while d.step().await.expect("gate open") {}
}

#[tokio::test(start_paused = true)]
async fn key_ordering_keeps_each_keys_order_under_random_delays() {
    for concurrency in [1, 4, 32] {
        let probe = Arc::new(Probe::default());
        let (mut d, _stop) = dispatcher(Ordering::Key, concurrency, probe.clone());
        // 100 keys, skewed so some keys are hot and others rare.
        let mut rng = rand::rng();
        let records: Vec<Record> = (0..4000)
            .map(|n| {
                let key = if rng.random_bool(0.3) { rng.random_range(0..3) } else { rng.random_range(0..100) };
                record(n, &format!("key-{key}"))
            })
            .collect();
        let mut expected: HashMap<String, Vec<u64>> = HashMap::new();
        for r in &records {
            expected.entry(r.partition_key.clone()).or_default().push(number(r));
        }
        feed(&mut d, records).await;
        assert_eq!(probe.same_key_overlaps.load(AtomicOrdering::SeqCst), 0, "N={concurrency}: a key ran twice at once");
        assert_eq!(*probe.started.lock().unwrap(), expected, "N={concurrency}: a key's records started out of order");
        let most = probe.most.load(AtomicOrdering::SeqCst);
        assert!(most <= concurrency, "N={concurrency}: {most} ran at once");
        if concurrency > 1 {
            assert!(most == concurrency, "N={concurrency}: only {most} ever ran at once");
        }
        assert_eq!(d.watermark(), Some(&at("3999")), "N={concurrency}: everything done");
        assert!(d.is_settled());
    }
}

#[tokio::test(start_paused = true)]
async fn shard_ordering_runs_one_at_a_time_in_order_and_none_ignores_keys() {
    let probe = Arc::new(Probe::default());
    let (mut d, _stop) = dispatcher(Ordering::Shard, 16, probe.clone());
    feed(&mut d, (0..300).map(|n| record(n, &format!("k{}", n % 50))).collect()).await;
    assert_eq!(probe.most.load(AtomicOrdering::SeqCst), 1);
    assert_eq!(*probe.finished.lock().unwrap(), (0..300).collect::<Vec<_>>());

    let probe = Arc::new(Probe::default());
    let (mut d, _stop) = dispatcher(Ordering::None, 8, probe.clone());
    feed(&mut d, (0..300).map(|n| record(n, "one-key")).collect()).await;
    assert_eq!(probe.most.load(AtomicOrdering::SeqCst), 8, "none runs N at once even on one key");
    assert!(probe.same_key_overlaps.load(AtomicOrdering::SeqCst) > 0);
    assert_eq!(d.watermark(), Some(&at("299")));
}

#[tokio::test(start_paused = true)]
async fn the_watermark_covers_only_a_fully_done_prefix() {
    // Record n takes 10 - n ms: they finish in reverse order.
    let probe = Arc::new(Probe { delays: Some(|n| Duration::from_millis(10 - n)), ..Probe::default() });
    let (mut d, _stop) = dispatcher(Ordering::None, 10, probe.clone());
    for n in 0..10 {
        d.push_plain(record(n, &format!("k{n}"))).unwrap();
    }
    assert_eq!(d.in_flight(), 10);
    for finished in 1..10 {
        assert!(d.step().await.unwrap());
        assert_eq!(probe.finished.lock().unwrap().len(), finished);
        assert_eq!(d.watermark(), None, "record 0 is still running after {finished} others finished");
        assert_eq!(d.take_advanced(), None);
    }
    assert!(d.step().await.unwrap());
    assert_eq!(d.take_advanced(), Some(&at("9")), "the last to finish opens the whole prefix");
}

#[tokio::test(start_paused = true)]
async fn a_slow_processor_fills_the_window_and_no_more() {
    let probe = Arc::new(Probe { delays: Some(|_| Duration::from_secs(3600)), ..Probe::default() });
    let (mut d, _stop) = dispatcher(Ordering::Key, 4, probe);
    let mut admitted = 0;
    while d.has_room() {
        d.push_plain(record(admitted, &format!("k{}", admitted % 3))).unwrap();
        admitted += 1;
    }
    assert_eq!(admitted, 16, "window = 4 x concurrency");
    assert_eq!(d.in_flight(), 3, "three keys, one record of each at a time");
}

#[tokio::test(start_paused = true)]
async fn a_closed_gate_starts_nothing_more() {
    let probe = Arc::new(Probe::default());
    let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let gate_open = open.clone();
    let runner = Arc::new(RecordRunner::new(Arc::default()));
    let settings = DispatchSettings { ordering: Ordering::Key, concurrency: 2 };
    let mut d = Dispatcher::new(
        settings,
        runner,
        probe.clone(),
        CancellationToken::new(),
        Arc::new(move || gate_open.load(AtomicOrdering::SeqCst)),
    );
    d.push_plain(record(0, "a")).unwrap();
    d.push_plain(record(1, "a")).unwrap();
    assert_eq!(d.step().await, Ok(true), "record 0 ran, and record 1 of its key was let in");
    open.store(false, AtomicOrdering::SeqCst);
    assert_eq!(d.push_plain(record(2, "b")), Err(Halted), "a new record may not start");
    assert_eq!(d.step().await, Err(Halted), "nor the next of key a");
    assert_eq!(*probe.finished.lock().unwrap(), vec![0]);
}

#[tokio::test(start_paused = true)]
async fn a_closed_gate_starts_nothing_more_even_if_admitted_before() {
    let probe = Arc::new(Probe::default());
    let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let gate_open = open.clone();
    let runner = Arc::new(RecordRunner::new(Arc::default()));
    let settings = DispatchSettings { ordering: Ordering::Key, concurrency: 2 };
    let mut d = Dispatcher::new(
        settings,
        runner,
        probe.clone(),
        CancellationToken::new(),
        Arc::new(move || gate_open.load(AtomicOrdering::SeqCst)),
    );
    // Admitted while the lease was valid, but not yet run when the deadline passed (a process stopped
    // in between): the processor is not called.
    d.push_plain(record(0, "a")).unwrap();
    open.store(false, AtomicOrdering::SeqCst);
    assert_eq!(d.push_plain(record(1, "b")), Err(Halted), "a new record may not start");
    assert_eq!(d.step().await, Err(Halted), "nor one admitted before the deadline");
    assert!(probe.finished.lock().unwrap().is_empty(), "nothing ran past the deadline");
}

#[tokio::test(start_paused = true)]
async fn a_stop_lets_running_records_finish_and_starts_no_other() {
    let probe = Arc::new(Probe { delays: Some(|n| Duration::from_millis(10 * (n + 1))), ..Probe::default() });
    let (mut d, stop) = dispatcher(Ordering::Key, 2, probe.clone());
    for n in 0..6 {
        d.push_plain(record(n, ["a", "b", "a"][n as usize % 3])).unwrap();
    }
    stop.cancel();
    while d.step().await.unwrap() {}
    assert!(d.is_settled());
    let mut finished = probe.finished.lock().unwrap().clone();
    finished.sort();
    assert_eq!(finished, vec![0, 1], "the two running records finished; nothing else started");
    assert_eq!(d.watermark(), Some(&at("1")));
}

#[tokio::test(start_paused = true)]
async fn after_a_stop_the_gaps_before_done_records_are_filled_so_nothing_is_repeated() {
    // Record 1 waits behind record 0 (same key, slow) while 2 and 3 finish: after a stop, 1 still
    // runs, so the done prefix covers all four and the next reader repeats none of them.
    let probe =
        Arc::new(Probe { delays: Some(|n| Duration::from_millis(if n == 0 { 50 } else { 10 })), ..Probe::default() });
    let (mut d, stop) = dispatcher(Ordering::Key, 2, probe.clone());
    for (n, key) in ["a", "a", "b", "b", "a"].into_iter().enumerate() {
        d.push_plain(record(n as u64, key)).unwrap();
    }
    while !probe.finished.lock().unwrap().contains(&3) {
        assert!(d.step().await.unwrap());
    }
    stop.cancel();
    while d.step().await.unwrap() {}
    let mut finished = probe.finished.lock().unwrap().clone();
    finished.sort();
    assert_eq!(finished, vec![0, 1, 2, 3], "1 filled the gap; 4 (after every done record) did not start");
    assert_eq!(d.watermark(), Some(&at("3")));
}

fn at(sequence: &str) -> Checkpoint {
    Checkpoint::Sequence(sequence.into())
}

/// Admitting a plain record, covered by its own sequence number.
trait PushPlain {
    fn push_plain(&mut self, record: Record) -> Result<(), Halted>;
}

impl PushPlain for Dispatcher {
    fn push_plain(&mut self, record: Record) -> Result<(), Halted> {
        let covers = at(&record.sequence_number);
        self.push(record, covers)
    }
}
