//! The worker binary's whole life, for `leasehold-worker` and for a user's own binary alike: flags,
//! logging, `/metrics` `/healthz` `/readyz`, SIGTERM and SIGINT, exit codes.
//!
//! Exit codes: 0 after a clean shutdown; 2 when the flags or the configuration are refused (the
//! message names the field); 1 when the worker cannot run (the lease table cannot be made, the metrics
//! address cannot be bound).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tokio_util::sync::CancellationToken;

use crate::config::WorkerConfig;
use crate::coordinator::{HandoffSecret, inbox, notice_route, notice_server_limits};
use crate::metrics::Metrics;
use crate::processor::ProcessorFactory;
use crate::signals::Signals;
use crate::{health, runtime};

/// Runs one worker of a Leasehold consumer: reads the shards it leases and processes their records.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// YAML file holding a StreamConsumer spec.
    #[arg(long)]
    config: PathBuf,
    /// Lease owner id (default: spec.ownerId, else a fresh id per process).
    #[arg(long)]
    owner_id: Option<String>,
    /// Address of /metrics, /healthz and /readyz (port 0: any free port, logged at start).
    #[arg(long, default_value = "0.0.0.0:9090")]
    metrics_addr: SocketAddr,
    /// Address of the endpoint taking the handoff notices peers send when they shut down, a port of
    /// its own so a NetworkPolicy can open it to the group alone (port 0: any free port, logged at
    /// start). Served only with a handoff secret.
    #[arg(long, env = "LEASEHOLD_HANDOFF_ADDR", default_value = "0.0.0.0:9091")]
    handoff_addr: SocketAddr,
    /// File holding the consumer's handoff secret (at least 16 bytes; every worker of the group has
    /// the same): notices are signed and checked with it. Without one, notices are off and freed rows
    /// are found by the scans.
    #[arg(long, env = "LEASEHOLD_HANDOFF_SECRET_FILE")]
    handoff_secret_file: Option<PathBuf>,
    /// `host:port` at which peers reach this worker's handoff endpoint (default: the bound address,
    /// or `$POD_IP` with its port when bound to every interface; none: peers rely on their scans).
    #[arg(long, env = "LEASEHOLD_ADVERTISE_ADDR")]
    advertise_addr: Option<String>,
    /// Log format on standard error.
    #[arg(long, value_enum, default_value_t = LogFormat::Json)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    /// one JSON object a line
    Json,
    /// human-readable lines
    Text,
}

/// Exit code when the flags or the configuration are refused (clap's own code for bad flags).
const EXIT_REFUSED: u8 = 2;

#[cfg(test)]
/// The worker's exit codes, as docs/reference/worker.md lists them.
const EXIT_CODES: &[(u8, &str)] = &[
    (0, "clean shutdown (SIGTERM or SIGINT: leases handed off or released, checkpoints written)"),
    (
        1,
        "the worker cannot run: the async runtime cannot start, the metrics or handoff address cannot be bound, the owner id is over 256 bytes, or the run failed (the lease table cannot be created or reached; the log says why)",
    ),
    (
        EXIT_REFUSED,
        "the flags or the configuration are refused (the message names the flag or the field), or the handoff secret file cannot be read or is too short",
    ),
];

/// The `leasehold-worker` binary: the processor is one of the built-in ones the spec names.
pub fn main() -> ExitCode {
    start(None)
}

/// A worker binary of your own: `spec.processor.custom` runs `processors` (one processor per shard);
/// the built-in processors stay available under their names. Everything else is as for
/// `leasehold-worker`: the same flags, endpoints, signals and exit codes, so the operator runs it as a
/// consumer's worker image.
///
/// ```no_run
/// use leasehold_worker::{LeaseKey, Outputs, ProcessError, Record, ShardProcessor};
///
/// struct Printer;
///
/// #[async_trait::async_trait]
/// impl ShardProcessor for Printer {
///     async fn process(&self, record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
///         println!("{}", record.partition_key);
///         Ok(())
///     }
/// }
///
/// fn main() -> std::process::ExitCode {
///     leasehold_worker::main_with_processor(|_shard: &LeaseKey| Printer)
/// }
/// ```
pub fn main_with_processor(processors: impl ProcessorFactory + 'static) -> ExitCode {
    start(Some(Arc::new(processors)))
}

fn start(custom: Option<Arc<dyn ProcessorFactory>>) -> ExitCode {
    let args = Args::parse();
    init_logging(args.log_format);
    match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(tokio) => tokio.block_on(serve(args, custom)),
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,aws_config=warn,aws_smithy_runtime=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).init(),
        LogFormat::Text => builder.init(),
    }
}

async fn serve(args: Args, custom: Option<Arc<dyn ProcessorFactory>>) -> ExitCode {
    // Listening first: a SIGTERM that comes while the worker is still starting (reading its config,
    // binding /metrics; long on a loaded machine) must end it cleanly, not by the signal's default.
    let shutdown = CancellationToken::new();
    let signals = Signals::listen();
    let cancel = shutdown.clone();
    tokio::spawn(async move {
        signals.received().await;
        cancel.cancel();
    });
    let config = match WorkerConfig::load(&args.config) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_REFUSED);
        }
    };
    let owner = runtime::owner_id(&config, args.owner_id);
    let processors = match runtime::processors(&config, &owner, custom) {
        Ok(processors) => processors,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_REFUSED);
        }
    };
    let secret = match args.handoff_secret_file.as_deref().map(HandoffSecret::from_file).transpose() {
        Ok(secret) => secret,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_REFUSED);
        }
    };
    // Every connection and shard holds descriptors; the soft limit is often 1,024 of a far larger hard one.
    match health::raise_fd_limit() {
        Ok(limit) => tracing::debug!(limit, "open files limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open files limit"),
    }
    let listener = match tokio::net::TcpListener::bind(args.metrics_addr).await {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(address = %args.metrics_addr, error = %e, "cannot listen for /metrics");
            return ExitCode::FAILURE;
        }
    };
    if let Ok(address) = listener.local_addr() {
        tracing::info!(address = %address, "serving /metrics, /healthz and /readyz");
    }
    let metrics = Arc::new(Metrics::default());
    let serving = health::serve_router(listener, health::router(metrics.health(), shutdown.clone()), shutdown.clone());
    tokio::spawn(async move {
        if let Err(e) = serving.await {
            tracing::error!(error = %e, "/metrics server failed");
        }
    });
    let inbox = match secret {
        Some(secret) => {
            let listener = match tokio::net::TcpListener::bind(args.handoff_addr).await {
                Ok(listener) => listener,
                Err(e) => {
                    tracing::error!(address = %args.handoff_addr, error = %e, "cannot listen for handoff notices");
                    return ExitCode::FAILURE;
                }
            };
            let bound = listener.local_addr().ok();
            let advertised =
                args.advertise_addr.or_else(|| bound.and_then(|b| advertised(b, std::env::var("POD_IP").ok())));
            tracing::info!(
                address = bound.map(|b| b.to_string()).unwrap_or_default(),
                advertised = advertised.as_deref().unwrap_or("-"),
                "taking handoff notices"
            );
            let (inbox, gate) = inbox(advertised, secret, metrics.clone());
            let serving =
                health::serve_router_with(listener, notice_route(gate), shutdown.clone(), notice_server_limits());
            tokio::spawn(async move {
                if let Err(e) = serving.await {
                    tracing::error!(error = %e, "handoff notice server failed");
                }
            });
            Some(inbox)
        }
        None => {
            tracing::info!("handoff notices off (no --handoff-secret-file): freed rows are found by the scans");
            None
        }
    };
    let worker = runtime::Worker { config, owner, processors, metrics, shutdown };
    match runtime::run_taking_notices(worker, inbox).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "worker failed");
            ExitCode::FAILURE
        }
    }
}

/// Where peers reach endpoints bound at `bound`: the bound address itself, or, bound to every
/// interface, the pod's IP with the bound port (`None` without one: no address is a safe answer).
fn advertised(bound: SocketAddr, pod_ip: Option<String>) -> Option<String> {
    if !bound.ip().is_unspecified() {
        return Some(bound.to_string());
    }
    let ip: std::net::IpAddr = pod_ip?.parse().ok()?;
    Some(SocketAddr::new(ip, bound.port()).to_string())
}

#[cfg(test)]
/// The worker's reference page: its flags and exit codes.
fn reference_page() -> String {
    use crate::reference::{command_markdown, exit_codes_markdown, generated_note};
    use clap::CommandFactory;
    format!(
        "# `leasehold-worker` reference\n\n{}\n\
         The worker's flags (`leasehold-worker --help`); a binary of your own made with \
         `leasehold_worker::main_with_processor` takes the same. Logging follows `RUST_LOG` \
         (default `info,aws_config=warn,aws_smithy_runtime=warn`); the consumer's settings are the \
         `--config` file, a StreamConsumer spec ([spec.md](spec.md)).\n\n{}\
         ## Exit codes\n\n{}",
        generated_note("`worker/src/cli.rs`"),
        command_markdown(&Args::command(), 2),
        exit_codes_markdown(EXIT_CODES)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_page_of_the_worker_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference/worker.md");
        if let Err(e) = crate::reference::check_or_write(&path, &reference_page()) {
            panic!("{e}");
        }
    }

    #[test]
    fn every_documented_flag_is_on_the_page() {
        let page = reference_page();
        for flag in [
            "--config",
            "--owner-id",
            "--metrics-addr",
            "--handoff-addr",
            "--handoff-secret-file",
            "--advertise-addr",
            "--log-format",
        ] {
            assert!(page.contains(&format!("`{flag} <")), "{flag} missing from:\n{page}");
        }
        assert!(page.contains("`LEASEHOLD_ADVERTISE_ADDR`"), "{page}");
        assert!(page.contains("| 2 |"), "{page}");
    }

    #[test]
    fn the_advertised_address_is_the_bound_one_or_the_pods() {
        let any: SocketAddr = "0.0.0.0:9090".parse().expect("address");
        let local: SocketAddr = "127.0.0.1:4000".parse().expect("address");
        assert_eq!(advertised(local, None).as_deref(), Some("127.0.0.1:4000"));
        assert_eq!(advertised(any, Some("10.1.2.3".into())).as_deref(), Some("10.1.2.3:9090"));
        assert_eq!(advertised(any, Some("fd00::5".into())).as_deref(), Some("[fd00::5]:9090"));
        assert_eq!(advertised(any, None), None);
        assert_eq!(advertised(any, Some("not an ip".into())), None);
    }
}
