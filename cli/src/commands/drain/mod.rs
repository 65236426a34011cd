//! `leasehold drain CONSUMER WORKER`: empty one worker without stopping it. The command marks the
//! worker's membership row draining (see [`mark`](mod@mark)): the worker's share drops to 0, it takes
//! no lease, and it hands every lease it holds to whichever live worker asks, through the lease rows'
//! handoff requests (`handoff_to`; the holder finishes its records, checkpoints and hands over in one
//! write, so nothing is processed twice). The others leave it out of their fair shares and ask for its
//! leases; the command asks too, on their behalf, so the first handoffs need no wait for their scans.
//! It then waits until the worker holds none.
//!
//! The mark stays until `drain --cancel` removes it or the worker leaves (its membership row, and the
//! mark with it, is deleted when it stops or is found silent): its pod can then be removed with nothing
//! left to move. Requests still pending when the command gives up are withdrawn; the mark is not.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use leasehold_worker::internals::balance;
use leasehold_worker::lease::{GroupRows, Lease, ShardLeases};
use serde::Serialize;

pub mod mark;

use crate::shared::error::{CliError, Result};
use crate::shared::output::{Format, structured};
use crate::shared::snapshot::{MemberRow, Snapshot, now_ms, read};
use crate::shared::target::{Target, TargetArgs, kube_client, resolve};
use mark::{mark, unmark};

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
    /// Once drained, delete the worker's pod (namespace of the consumer); at the timeout with leases
    /// left, too: on SIGTERM it checkpoints and releases them at once.
    #[arg(long, conflicts_with = "cancel")]
    pub delete_pod: bool,
    /// Remove the draining mark instead: the worker takes its fair share again.
    #[arg(long)]
    pub cancel: bool,
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
    /// True when the mark was already there (a drain run before).
    pub was_draining: bool,
    /// True when its pod was deleted.
    pub pod_deleted: bool,
}

/// What `drain --cancel` did.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cancelled {
    /// The worker.
    pub worker: String,
    /// True when it was marked draining (and no longer is).
    pub was_draining: bool,
}

/// The unfinished leases `worker` holds, in key order (the order the workers deal them in).
fn held_by<'a>(snapshot: &'a Snapshot, worker: &str) -> Vec<&'a Lease> {
    let mut held: Vec<&Lease> =
        snapshot.leases.iter().filter(|l| l.is_held_by(worker) && !l.checkpoint.is_shard_end()).collect();
    held.sort_by(|a, b| a.key.cmp(&b.key));
    held
}

/// Withdraws a request this command wrote on behalf of `asker`, if the row is still as it left it
/// (counter unchanged, the same asker); the counter does not move, as when it was written. A row that
/// moved on (handed over, or another request) has nothing of ours left on it.
async fn withdraw(target: &Target, lease: &Lease, asker: &str) -> Result<()> {
    target.store(asker).withdraw_handoff(lease).await?;
    Ok(())
}

/// The worker named on the command line, and the consumer's arguments without it.
fn worker_and_target(args: &DrainArgs) -> Result<(String, TargetArgs)> {
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
    Ok((worker, target_args))
}

/// Runs `drain --cancel`.
async fn cancel(target: &Target, worker: &str, format: Format) -> Result<()> {
    let was_draining = unmark(target, worker).await?;
    if was_draining {
        // Workers that read the table in segments learn of the change at once.
        target.store("leasehold-cli").announce().await?;
    }
    let outcome = Cancelled { worker: worker.to_string(), was_draining };
    if !structured(format, &outcome)? {
        if was_draining {
            println!("{worker}: drain cancelled; it takes its fair share again");
        } else {
            println!("{worker} was not draining");
        }
    }
    Ok(())
}

/// Writes handoff requests for `held` on behalf of `others`, dealt as the workers deal them (leases
/// in key order, to workers in id order, each up to its fair share), so the request a worker writes for
/// itself at its next scan names the same lease the command named for it; lease -> asker, as written.
async fn request_handoffs(
    target: &Target,
    snapshot: &Snapshot,
    held: &[Lease],
    others: &[&str],
) -> Result<Vec<(Lease, String)>> {
    let active = balance::active(&snapshot.leases);
    let mut load: BTreeMap<&str, usize> =
        others.iter().map(|w| (*w, active.iter().filter(|l| l.is_held_by(w)).count())).collect();
    let names: Vec<String> = load.keys().map(|w| w.to_string()).collect();
    let shares = balance::targets(active.len(), &names);
    let mut written: Vec<(Lease, String)> = Vec::new();
    for lease in held {
        // A lease a live worker asked for already counts toward that worker, or the next lease would
        // go to it too and leave the group uneven after the drain.
        if let Some(asker) = asked_by(lease, others) {
            count_toward(&mut load, asker);
            continue;
        }
        let Some(to) = next_taker(&load, &shares) else { break };
        match target.store(to).request_handoff(lease).await {
            Ok(row) => {
                written.push((row, to.to_string()));
                count_toward(&mut load, to);
            }
            // The row moved since the read (handed over already, or asked for by a worker since the
            // mark): leave it, counted toward whoever has it or asked for it now.
            Err(e) if e.is_not_held() => {
                let now = target.store(to).get(&lease.key).await?;
                let handed_to = now.as_ref().and_then(|row| row.owner.as_deref()).filter(|o| others.contains(o));
                if let Some(worker) = now.as_ref().and_then(|row| asked_by(row, others)).or(handed_to) {
                    count_toward(&mut load, worker);
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(written)
}

/// Who gets the next lease: the first worker in id order short of its share, as the workers' own
/// dealing gives it; the least loaded when the snapshot shows none short.
fn next_taker<'a>(load: &BTreeMap<&'a str, usize>, shares: &BTreeMap<String, usize>) -> Option<&'a str> {
    let short = load.iter().find(|(w, n)| **n < shares.get(**w).copied().unwrap_or(0));
    short.or_else(|| load.iter().min_by_key(|(w, n)| (**n, **w))).map(|(w, _)| *w)
}

/// The live worker (one of `others`) that asked for `lease`, if any.
fn asked_by<'a>(lease: &Lease, others: &[&'a str]) -> Option<&'a str> {
    let asker = lease.handoff_to.as_deref()?;
    others.iter().copied().find(|w| *w == asker)
}

/// Adds one lease to `worker`'s count, if it is one of the workers counted.
fn count_toward(load: &mut BTreeMap<&str, usize>, worker: &str) {
    if let Some(n) = load.get_mut(worker) {
        *n += 1;
    }
}

/// Deletes the worker's pod (the consumer's namespace).
async fn delete_pod(target: &Target, worker: &str) -> Result<String> {
    let (ns, _) = crate::shared::target::needs_resource(target, "--delete-pod")?;
    let pods: Api<Pod> = Api::namespaced(kube_client().await?, &ns);
    pods.delete(worker, &Default::default()).await?;
    Ok(ns)
}

/// Runs `drain`: read the group, mark the worker and ask for its leases on the others' behalf, wait
/// until it holds none (deleting its pod with `--delete-pod`), print.
pub async fn run(args: &DrainArgs, format: Format) -> Result<()> {
    let (worker, target_args) = worker_and_target(args)?;
    let target = resolve(&target_args).await?;
    let worker = worker.as_str();
    if args.cancel {
        return cancel(&target, worker, format).await;
    }
    if args.delete_pod {
        crate::shared::target::needs_resource(&target, "--delete-pod")?;
    }
    let snapshot = read(&target).await?;
    let others = takers(&target, &snapshot, worker)?;
    let was_draining = !mark(&target, worker).await?;
    // Workers that read the table in segments learn of the mark at once.
    target.store("leasehold-cli").announce().await?;
    let held: Vec<Lease> = held_by(&snapshot, worker).into_iter().cloned().collect();
    let mine = request_handoffs(&target, &snapshot, &held, &others).await?;
    let requested: BTreeMap<String, String> = mine.iter().map(|(l, to)| (l.key.to_string(), to.clone())).collect();
    eprintln!(
        "{worker} marked draining{}: {} lease(s) held; {} handoff request(s) written",
        if was_draining { " (it already was)" } else { "" },
        held.len(),
        requested.len()
    );
    let (remaining, mut pod_deleted) = wait_until_drained(args, &target, worker).await?;
    if !remaining.is_empty() {
        return Err(give_up(args, &target, worker, &mine, &remaining).await?);
    }
    if args.delete_pod && !pod_deleted {
        let ns = delete_pod(&target, worker).await?;
        eprintln!("pod {ns}/{worker} deleted");
        pod_deleted = true;
    }
    let outcome = Outcome {
        worker: worker.to_string(),
        held: held.iter().map(|l| l.key.to_string()).collect(),
        requested,
        remaining: Vec::new(),
        was_draining,
        pod_deleted,
    };
    if !structured(format, &outcome)? {
        println!("{worker} drained: {} lease(s) handed over; it takes none while marked draining", outcome.held.len());
        if !pod_deleted {
            println!(
                "its pod can be removed now (the mark goes with its membership row); `drain --cancel` puts it back to work"
            );
        }
    }
    Ok(())
}

/// The live workers, other than `worker` and not draining, that can take its leases: refused when
/// `worker` is not a live member or nobody could take them.
fn takers<'a>(target: &Target, snapshot: &'a Snapshot, worker: &str) -> Result<Vec<&'a str>> {
    let now = now_ms();
    let live: Vec<&MemberRow> = snapshot.members.iter().filter(|m| m.fresh(now)).collect();
    if !live.iter().any(|m| m.owner == worker) {
        let names: Vec<&str> = live.iter().map(|m| m.owner.as_str()).collect();
        return Err(CliError::NotFound(format!(
            "worker {worker} is not a live member of {} (live: {})",
            target.name(),
            if names.is_empty() { "none".to_string() } else { names.join(", ") }
        )));
    }
    let others: Vec<&str> =
        live.iter().filter(|m| m.owner != worker && !m.draining).map(|m| m.owner.as_str()).collect();
    if others.is_empty() {
        let why = if live.len() > 1 { "every other live worker is draining" } else { "it is the only live worker" };
        return Err(CliError::Refused(format!(
            "refused: {why} of {}: nobody could take {worker}'s leases",
            target.name()
        )));
    }
    Ok(others)
}

/// Reads the table every half second until `worker` holds no lease or the timeout passes (with
/// `--delete-pod`, its pod is then deleted and given its grace to release); the leases it still
/// holds, and whether its pod was deleted.
async fn wait_until_drained(args: &DrainArgs, target: &Target, worker: &str) -> Result<(Vec<Lease>, bool)> {
    let started = Instant::now();
    let mut deadline = started + args.timeout;
    let tty = std::io::stderr().is_terminal();
    let mut remaining: Vec<Lease>;
    let mut pod_deleted = false;
    loop {
        let now = read(target).await?;
        remaining = held_by(&now, worker).into_iter().cloned().collect();
        if remaining.is_empty() {
            break;
        }
        let line = format!("{worker} still holds {} lease(s)", remaining.len());
        if tty {
            eprint!("\r\x1b[2K{line} ({}s)", started.elapsed().as_secs());
        } else {
            eprintln!("{line} ({}s)", started.elapsed().as_secs());
        }
        if Instant::now() > deadline {
            if args.delete_pod && !pod_deleted {
                let ns = delete_pod(target, worker).await?;
                eprintln!(
                    "\n{worker} still holds {} lease(s): pod {ns}/{worker} deleted; on SIGTERM it checkpoints and releases them",
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
    Ok((remaining, pod_deleted))
}

/// Withdraws the requests this command wrote that are still unanswered (no stale request lingers on
/// the rows); the timeout error naming the leases `worker` still holds.
async fn give_up(
    args: &DrainArgs,
    target: &Target,
    worker: &str,
    mine: &[(Lease, String)],
    remaining: &[Lease],
) -> Result<CliError> {
    let current = read(target).await?;
    for (lease, asker) in mine {
        if let Some(row) = current.leases.iter().find(|l| l.key == lease.key)
            && row.handoff_to.as_deref() == Some(asker.as_str())
        {
            withdraw(target, row, asker).await?;
        }
    }
    let keys: Vec<String> = remaining.iter().map(|l| l.key.to_string()).collect();
    Ok(CliError::Timeout(format!(
        "{worker} still holds {} lease(s) after {}: {}. It stays marked draining and hands them over as the \
         others ask (a lease whose records are slow to finish takes that long); run drain again to keep \
         waiting, drain --cancel to put it back to work, or delete its pod (or run drain with --delete-pod): \
         on SIGTERM it checkpoints and releases every lease at once, with no repeats.",
        keys.len(),
        humantime::format_duration(args.timeout),
        keys.join(", "),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deal(load: &[(&'static str, usize)], total: usize, leases: usize) -> Vec<&'static str> {
        let mut load: BTreeMap<&str, usize> = load.iter().copied().collect();
        let names: Vec<String> = load.keys().map(|w| w.to_string()).collect();
        let shares = balance::targets(total, &names);
        (0..leases)
            .map(|_| {
                let to = next_taker(&load, &shares).expect("a taker");
                count_toward(&mut load, to);
                to
            })
            .collect()
    }

    #[test]
    fn leases_go_to_workers_in_id_order_each_up_to_its_share() {
        // 7 shards over a and c: shares 4 and 3, as the workers compute them. The least loaded first
        // would give a, c, a; the workers deal a, a, c.
        assert_eq!(deal(&[("c", 2), ("a", 2)], 7, 3), ["a", "a", "c"]);
        assert_eq!(deal(&[("a", 2), ("c", 2)], 6, 2), ["a", "c"]);
        assert_eq!(deal(&[("a", 3), ("c", 1)], 6, 2), ["c", "c"]);
    }

    #[test]
    fn with_every_worker_at_its_share_the_least_loaded_takes_it() {
        assert_eq!(deal(&[("a", 3), ("c", 3)], 6, 2), ["a", "c"]);
    }
}
