//! `leasehold-operator`: reconciles StreamConsumer resources.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use leasehold_operator::context::MetricsScrapers;
use leasehold_operator::context::{Context, Settings};
use leasehold_operator::leader::{self, Election};
use leasehold_operator::metrics::Metrics;
use leasehold_operator::readiness::ControllerState;
use leasehold_worker::health;
use leasehold_worker::signals::Signals;
use tokio_util::sync::CancellationToken;

/// Reconciles StreamConsumer resources into lease tables and worker Deployments.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Worker image used when a consumer's template names none.
    #[arg(long, env = "LEASEHOLD_WORKER_IMAGE", default_value = concat!("ghcr.io/leasehold/worker:", env!("CARGO_PKG_VERSION")))]
    worker_image: String,
    /// Address of /metrics, /healthz and /readyz (docs/reference/operator-metrics.md).
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Watch only this namespace (default: every namespace).
    #[arg(long, env = "LEASEHOLD_WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Run leader election so only one of several replicas reconciles.
    #[arg(long, env = "LEASEHOLD_LEADER_ELECT")]
    leader_elect: bool,
    /// Namespace of the leader election Lease (default: the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    leader_election_namespace: String,
    /// How often stream shard counts are polled (a duration: `30s`, `2m`): resharding reaches the
    /// status and the autoscaling within one interval.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    shard_poll_interval: Duration,
    /// Refuse pod templates that ask for hostNetwork, hostPID, hostIPC, hostPath volumes or privileged
    /// containers (status condition `TemplateRefused`); off by default, as a Deployment would take them.
    #[arg(long, env = "LEASEHOLD_RESTRICT_TEMPLATES")]
    restrict_templates: bool,
    /// Give every consumer's worker pods a NetworkPolicy: the handoff port open to the consumer's own
    /// pods only, the metrics port to the scrapers below (to anyone when both are empty).
    #[arg(long, env = "LEASEHOLD_WORKER_NETWORK_POLICY")]
    worker_network_policy: bool,
    /// With --worker-network-policy: labels (`k=v,k=v`) of the namespaces the metrics scraper runs in.
    #[arg(long, env = "LEASEHOLD_METRICS_FROM_NAMESPACE_LABELS", default_value = "")]
    metrics_from_namespace_labels: String,
    /// With --worker-network-policy: labels (`k=v,k=v`) of the metrics scraper's pods.
    #[arg(long, env = "LEASEHOLD_METRICS_FROM_POD_LABELS", default_value = "")]
    metrics_from_pod_labels: String,
}

const CRD_NAME: &str = "streamconsumers.leasehold.io";

/// Exit code when the flags are refused (clap's own code for bad flags).
const EXIT_REFUSED: u8 = 2;

/// The operator's exit codes, as docs/reference/operator.md lists them.
#[cfg(test)]
const EXIT_CODES: &[(u8, &str)] = &[
    (0, "stopped by SIGTERM or SIGINT (as leader or as a standby candidate)"),
    (
        1,
        "cannot run: the Kubernetes API is unreachable, the StreamConsumer CRD is not installed or cannot be read, the metrics address cannot be bound; or leadership was lost (the pod restarts as a candidate)",
    ),
    (EXIT_REFUSED, "the flags are refused (the message names the flag)"),
];

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn,aws=warn".into()),
        )
        .json()
        .flatten_event(true)
        .with_writer(std::io::stderr)
        .init();
    let client = match kube::Client::try_default().await {
        Ok(client) => client,
        Err(e) => {
            eprintln!("error: cannot reach the Kubernetes API: {e}");
            return ExitCode::FAILURE;
        }
    };
    match Api::<CustomResourceDefinition>::all(client.clone()).get_opt(CRD_NAME).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            eprintln!(
                "error: the CustomResourceDefinition {CRD_NAME} is not installed; install it with \
                 `kubectl apply -f crds/streamconsumer.yaml` (or the Helm chart) and start the operator again"
            );
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("error: cannot read CustomResourceDefinition {CRD_NAME}: {e}");
            return ExitCode::FAILURE;
        }
    }
    // Every connection holds a descriptor; the soft limit is often 1,024 of a far larger hard one.
    if let Err(e) = health::raise_fd_limit() {
        tracing::warn!(error = %e, "cannot raise the open files limit");
    }
    let shutdown = CancellationToken::new();
    let worker_network_policy = match args
        .worker_network_policy
        .then(|| MetricsScrapers::parse(&args.metrics_from_namespace_labels, &args.metrics_from_pod_labels))
    {
        None => None,
        Some(Ok(scrapers)) => Some(scrapers),
        Some(Err(e)) => {
            eprintln!("error: --metrics-from-*-labels: {e}");
            return ExitCode::from(EXIT_REFUSED);
        }
    };
    let settings = Settings {
        worker_image: args.worker_image,
        shard_poll_interval: args.shard_poll_interval,
        static_credentials: None,
        restrict_templates: args.restrict_templates,
        worker_network_policy,
    };
    let ctx = Arc::new(Context::new(client, settings, Metrics::default()));
    let listener = match tokio::net::TcpListener::bind(args.metrics_addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("error: cannot listen on {}: {e}", args.metrics_addr);
            return ExitCode::FAILURE;
        }
    };
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    }
    // The endpoints outlive the controller: /readyz answers 503 while it stops, /healthz 200.
    let endpoints = CancellationToken::new();
    let _stop_endpoints = endpoints.clone().drop_guard();
    tokio::spawn(health::serve(listener, ctx.metrics.health(ctx.readiness.clone()), endpoints));
    // Listening from here on; the endpoints above are up, so /readyz can say the operator is stopping.
    let signals = Signals::listen();
    let cancel = shutdown.clone();
    let readiness = ctx.readiness.clone();
    tokio::spawn(async move {
        signals.received().await;
        readiness.stopping();
        cancel.cancel();
    });
    let stop = shutdown.child_token();
    if args.leader_elect {
        let identity = std::env::var("POD_NAME").unwrap_or_else(|_| format!("operator-{}", std::process::id()));
        let election = Election::new(args.leader_election_namespace, "leasehold-operator", identity);
        let lost = CancellationToken::new();
        ctx.readiness.set(ControllerState::Standby);
        if !leader::lead(ctx.client.clone(), election, lost.clone(), shutdown.clone()).await {
            return ExitCode::SUCCESS;
        }
        let stop_on_loss = stop.clone();
        let readiness = ctx.readiness.clone();
        tokio::spawn(async move {
            lost.cancelled().await;
            readiness.stopping();
            stop_on_loss.cancel();
        });
    }
    tracing::info!("operator started");
    leasehold_operator::controller::run(ctx, args.namespace, stop).await;
    if shutdown.is_cancelled() {
        tracing::info!("operator stopped");
        ExitCode::SUCCESS
    } else {
        // Leadership lost: exit so the pod restarts as a candidate.
        tracing::error!("operator stopped: leadership lost");
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operator's reference page: its flags and exit codes.
    fn reference_page() -> String {
        use clap::CommandFactory;
        use leasehold_worker::reference::{command_markdown, exit_codes_markdown, generated_note};
        format!(
            "# `leasehold-operator` reference\n\n{}\n\
             The operator's flags (`leasehold-operator --help`; the Helm chart sets them from its values). \
             Logging follows `RUST_LOG` (default `info,kube=warn,aws=warn`), as JSON lines on standard \
             error. With `--leader-elect` the Lease holder's identity is `$POD_NAME`.\n\n{}\
             ## Exit codes\n\n{}",
            generated_note("`operator/src/main.rs`"),
            command_markdown(&Args::command(), 2),
            exit_codes_markdown(EXIT_CODES)
        )
    }

    #[test]
    fn reference_page_of_the_operator_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference/operator.md");
        if let Err(e) = leasehold_worker::reference::check_or_write(&path, &reference_page()) {
            panic!("{e}");
        }
    }

    #[test]
    fn every_flag_has_a_description_on_the_page() {
        use clap::CommandFactory;
        let command = Args::command();
        let page = reference_page();
        for arg in command.get_arguments() {
            let long = arg.get_long().expect("every operator flag is a long flag");
            assert!(arg.get_help().is_some(), "--{long} has no doc comment");
            assert!(page.contains(&format!("`--{long}")), "--{long} missing from the page");
        }
        assert!(command.get_arguments().count() >= 10);
    }
}
