//! `leasehold pause` / `resume`: set the StreamConsumer's `spec.paused` (the operator scales its
//! workers to zero, or back), then wait, with a progress line, until the workers have left the group
//! (no live membership row) or are back.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use clap::Args;
use kube::Api;
use kube::api::{Patch, PatchParams};
use leasehold_crds::StreamConsumer;

use crate::shared::error::{CliError, Result};
use crate::shared::output::{Format, structured};
use crate::shared::snapshot::{now_ms, read};
use crate::shared::target::{Target, TargetArgs, kube_client, resolve};

/// Arguments of `pause` and `resume`.
#[derive(Args, Debug)]
pub struct PauseArgs {
    /// The consumer.
    #[command(flatten)]
    pub target: TargetArgs,
    /// Set the flag and return without waiting for the workers.
    #[arg(long)]
    pub no_wait: bool,
    /// How long to wait for the workers to leave (pause) or come back (resume).
    #[arg(long, default_value = "5m", value_parser = crate::parse_duration)]
    pub timeout: Duration,
}

/// What `pause`/`resume` did.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// `namespace/name`.
    pub consumer: String,
    /// `spec.paused` now.
    pub paused: bool,
    /// Workers alive when the command finished.
    pub live_members: Vec<String>,
    /// Seconds waited.
    pub waited_seconds: f64,
}

/// Live members by their heartbeats.
async fn live(target: &Target) -> Result<Vec<String>> {
    let now = now_ms();
    Ok(read(target).await?.members.into_iter().filter(|m| m.fresh(now)).map(|m| m.owner).collect())
}

/// The workers the spec asks for once resumed (fixed replicas, else autoscaling's minimum, else one).
fn wanted(target: &Target) -> usize {
    let workers = target.spec.as_ref().map(|s| s.workers.clone()).unwrap_or_default();
    let count = match (workers.replicas, workers.autoscaling) {
        (Some(replicas), _) => replicas,
        (None, Some(autoscaling)) => autoscaling.min_replicas.unwrap_or(1),
        (None, None) => 1,
    };
    usize::try_from(count.max(1)).unwrap_or(1)
}

/// Runs `pause` (`paused` true) or `resume` (false).
pub async fn run(args: &PauseArgs, paused: bool, format: Format) -> Result<()> {
    let target = resolve(&args.target).await?;
    let (ns, name) = crate::shared::target::needs_resource(&target, if paused { "pause" } else { "resume" })?;
    let api: Api<StreamConsumer> = Api::namespaced(kube_client().await?, &ns);
    let patch = serde_json::json!({"spec": {"paused": paused}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let verb = if paused { "paused" } else { "resumed" };
    eprintln!("{ns}/{name}: spec.paused = {paused}");
    let started = Instant::now();
    let mut alive = live(&target).await?;
    if !args.no_wait {
        let want = wanted(&target);
        let tty = std::io::stderr().is_terminal();
        let mut last = String::new();
        loop {
            let done = if paused { alive.is_empty() } else { alive.len() >= want };
            if done {
                break;
            }
            let line = if paused {
                format!("waiting for {} worker(s) to leave: {}", alive.len(), alive.join(", "))
            } else {
                format!("waiting for workers to come back: {} of {want} alive", alive.len())
            };
            if tty {
                eprint!("\r\x1b[2K{line} ({}s)", started.elapsed().as_secs());
            } else if line != last {
                eprintln!("{line}");
            }
            last = line;
            if started.elapsed() > args.timeout {
                if tty {
                    eprintln!();
                }
                return Err(CliError::Timeout(format!(
                    "{ns}/{name} is {verb} (spec.paused = {paused}), but after {} {}: {}",
                    humantime::format_duration(args.timeout),
                    if paused { "these workers are still alive" } else { "not enough workers are back" },
                    if alive.is_empty() { "none".to_string() } else { alive.join(", ") }
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            alive = live(&target).await?;
        }
        if tty {
            eprintln!();
        }
    }
    let outcome = Outcome {
        consumer: format!("{ns}/{name}"),
        paused,
        live_members: alive,
        waited_seconds: started.elapsed().as_secs_f64(),
    };
    if !structured(format, &outcome)? {
        println!(
            "{ns}/{name} {verb}: {} live worker(s){}",
            outcome.live_members.len(),
            if args.no_wait { " (not waited for)" } else { "" }
        );
    }
    Ok(())
}
