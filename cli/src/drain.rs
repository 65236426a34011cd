//! `leasehold drain CONSUMER WORKER`: ask one worker to hand its leases to the other live workers
//! through the lease rows' handoff requests (`handoff_to`; the holder finishes its records,
//! checkpoints and hands over in one write, so nothing is processed twice), then wait until it
//! holds none.
//!
//! A holder honours requests only for leases above its fair share (the group's balance rule,
//! docs/architecture.md), so a worker at its share keeps the rest: `--delete-pod` then deletes its pod,
//! and a worker stopped with SIGTERM checkpoints and releases everything it still holds at once,
//! again without repeats. Requests still pending when the command gives up are withdrawn.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use leasehold_worker::internals::lease::attr;
use leasehold_worker::lease::{Lease, ShardLeases};
use serde::Serialize;

use crate::error::{CliError, Result, sdk_message};
use crate::output::{Format, structured};
use crate::table::{Snapshot, now_ms, read};
use crate::target::{Target, TargetArgs, kube_client, resolve};

/// Arguments of `drain`.
#[derive(Args, Debug)]
pub struct DrainArgs {
    /// The consumer.
    #[command(flatten)]
    pub target: TargetArgs,
    /// The worker to drain: its owner id (the pod name for workers the operator runs). With `--table`,
    /// the only positional argument.
    #[arg(value_name = "WORKER")]
    pub worker: Option<String>,
    /// How long to wait for the handoffs.
    #[arg(long, default_value = "60s", value_parser = crate::parse_duration)]
    pub timeout: Duration,
    /// When the worker keeps leases (at its fair share), delete its pod (namespace of the consumer):
    /// on SIGTERM it checkpoints and releases the rest at once.
    #[arg(long)]
    pub delete_pod: bool,
}

/// How long a deleted worker pod is given to release its leases: Kubernetes' default termination
/// grace period.
const POD_GRACE: Duration = Duration::from_secs(30);

/// What `drain` did.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// The worker drained.
    pub worker: String,
    /// Leases it held at the start.
    pub held: Vec<String>,
    /// Handoff requests written: lease -> the worker asked to take it.
    pub requested: BTreeMap<String, String>,
    /// Leases it still holds.
    pub remaining: Vec<String>,
    /// True when its pod was deleted.
    pub pod_deleted: bool,
}

fn held_by<'a>(snapshot: &'a Snapshot, worker: &str) -> Vec<&'a Lease> {
    snapshot.leases.iter().filter(|l| l.is_held_by(worker) && !l.checkpoint.is_shard_end()).collect()
}

/// Withdraws a request this command wrote, if the row is still as it left it (counter unchanged, the
/// same asker); the counter does not move, as when it was written.
async fn withdraw(target: &Target, lease: &Lease, asker: &str) -> Result<()> {
    let result = target
        .dynamodb
        .update_item()
        .table_name(&target.table)
        .key(attr::LEASE_KEY, AttributeValue::S(lease.key.to_string()))
        .update_expression("REMOVE handoff_to")
        .condition_expression("lease_counter = :counter AND handoff_to = :asker")
        .expression_attribute_values(":counter", AttributeValue::N(lease.counter.to_string()))
        .expression_attribute_values(":asker", AttributeValue::S(asker.to_string()))
        .send()
        .await;
    match result {
        Ok(_) => Ok(()),
        Err(e) => {
            let message = sdk_message(&e);
            // The row moved on (handed over, or another request): nothing of ours is left on it.
            if message.starts_with("ConditionalCheckFailed") {
                Ok(())
            } else {
                Err(CliError::Service(format!("withdrawing the request on {}: {message}", lease.key)))
            }
        }
    }
}

/// Runs `drain`.
pub async fn run(args: &DrainArgs, format: Format) -> Result<()> {
    let mut target_args = args.target.clone();
    let worker = match (&target_args.consumer, &args.worker, &target_args.table) {
        (Some(_), Some(worker), _) => worker.clone(),
        (Some(worker), None, Some(_)) => {
            let worker = worker.clone();
            target_args.consumer = None;
            worker
        }
        _ => {
            return Err(CliError::Usage(
                "name the worker: drain CONSUMER WORKER (or drain --table TABLE WORKER)".into(),
            ));
        }
    };
    let target = resolve(&target_args).await?;
    let worker = worker.as_str();
    let snapshot = read(&target).await?;
    let now = now_ms();
    let live: Vec<&str> = snapshot.members.iter().filter(|m| m.fresh(now)).map(|m| m.owner.as_str()).collect();
    if !live.contains(&worker) {
        return Err(CliError::NotFound(format!(
            "worker {worker} is not a live member of {} (live: {})",
            target.name(),
            if live.is_empty() { "none".to_string() } else { live.join(", ") }
        )));
    }
    let others: Vec<&str> = live.iter().copied().filter(|w| *w != worker).collect();
    if others.is_empty() {
        return Err(CliError::Refused(format!(
            "refused: {worker} is the only live worker of {}: nobody could take its leases",
            target.name()
        )));
    }
    let held: Vec<Lease> = held_by(&snapshot, worker).into_iter().cloned().collect();
    // Each lease to the least loaded of the others.
    let mut load: BTreeMap<&str, usize> =
        others.iter().map(|w| (*w, snapshot.leases.iter().filter(|l| l.is_held_by(w)).count())).collect();
    let mut requested: BTreeMap<String, String> = BTreeMap::new();
    let mut mine: Vec<(Lease, String)> = Vec::new();
    for lease in &held {
        if lease.handoff_to.is_some() {
            continue;
        }
        let Some((&to, _)) = load.iter().min_by_key(|(w, n)| (**n, **w)) else { break };
        let store = target.store(to);
        match store.request_handoff(lease).await {
            Ok(written) => {
                requested.insert(lease.key.to_string(), to.to_string());
                mine.push((written, to.to_string()));
                *load.entry(to).or_default() += 1;
            }
            // The row moved since the read: leave it.
            Err(e) if e.is_not_held() => {}
            Err(e) => return Err(e.into()),
        }
    }
    eprintln!("{worker}: {} lease(s) held; {} handoff request(s) written", held.len(), requested.len());
    let started = Instant::now();
    let mut deadline = started + args.timeout;
    let tty = std::io::stderr().is_terminal();
    let mut remaining: Vec<Lease>;
    let mut pod_deleted = false;
    loop {
        let now = read(&target).await?;
        remaining = held_by(&now, worker).into_iter().cloned().collect();
        if remaining.is_empty() {
            break;
        }
        let line = format!("{worker} still holds {} lease(s)", remaining.len());
        if tty {
            eprint!("\r\x1b[2K{line} ({}s)", started.elapsed().as_secs());
        } else {
            eprintln!("{line}");
        }
        if Instant::now() > deadline {
            if args.delete_pod && !pod_deleted {
                let (ns, _) = crate::needs_resource(&target, "--delete-pod")?;
                let pods: Api<Pod> = Api::namespaced(kube_client().await?, &ns);
                pods.delete(worker, &Default::default()).await?;
                eprintln!(
                    "\n{worker} keeps {} lease(s) at its fair share: pod {ns}/{worker} deleted; on SIGTERM it checkpoints and releases them",
                    remaining.len()
                );
                pod_deleted = true;
                // The pod's worker stops on SIGTERM: give it its termination grace (30 s by default)
                // to checkpoint and release, or the timeout if longer.
                deadline = Instant::now() + args.timeout.max(POD_GRACE);
                continue;
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if tty {
        eprintln!();
    }
    if !remaining.is_empty() {
        // Take back what was not answered, so no stale request lingers on the rows.
        let current = read(&target).await?;
        for (lease, asker) in &mine {
            if let Some(row) = current.leases.iter().find(|l| l.key == lease.key)
                && row.handoff_to.as_deref() == Some(asker.as_str())
            {
                withdraw(&target, row, asker).await?;
            }
        }
        let keys: Vec<String> = remaining.iter().map(|l| l.key.to_string()).collect();
        return Err(CliError::Timeout(format!(
            "{worker} still holds {} lease(s) after {}: {}. A worker hands over only the leases above its fair share \
             (it keeps ~{} of {} here); pending requests were withdrawn. Finish by removing it: delete its pod \
             (or run drain with --delete-pod) — on SIGTERM it checkpoints and releases every lease at once, with no repeats.",
            keys.len(),
            humantime::format_duration(args.timeout),
            keys.join(", "),
            snapshot.leases.iter().filter(|l| !l.checkpoint.is_shard_end()).count().div_ceil(live.len()),
            snapshot.leases.iter().filter(|l| !l.checkpoint.is_shard_end()).count()
        )));
    }
    let outcome = Outcome {
        worker: worker.to_string(),
        held: held.iter().map(|l| l.key.to_string()).collect(),
        requested,
        remaining: Vec::new(),
        pod_deleted,
    };
    if !structured(format, &outcome)? {
        println!("{worker} drained: {} lease(s) handed over", outcome.held.len());
    }
    Ok(())
}
