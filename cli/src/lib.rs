//! The `leasehold` CLI (also the kubectl plugin `kubectl-leasehold`): describe a consumer's lease
//! table, rewind it, pause and resume its workers, drain one worker, import checkpoints from a Java
//! KCL lease table, redrive dead letters and replay a window of the past. It reaches AWS and
//! Kubernetes with the worker's and operator's own clients.

pub mod commands;
pub mod shared;

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};

use commands::{describe, drain, kcl, pause, redrive, replay, reset};
use shared::error::{EXIT_CODES_HELP, Result};
use shared::output::Format;
use shared::target::{self, TargetArgs};

/// Day-2 tool for Leasehold consumers: describe, reset, pause/resume, drain, import from the Java KCL,
/// redrive dead letters, replay a window.
#[derive(Parser, Debug)]
#[command(name = "leasehold", version, after_help = EXIT_CODES_HELP)]
pub struct Cli {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table, global = true)]
    pub output: Format,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// One row per shard (stream, shard, owner, checkpoint, lag, load, parents, handoff, state), the
    /// members with the load of the leases each holds, and a summary.
    #[command(after_help = EXIT_CODES_HELP)]
    Describe {
        /// The consumer.
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Move checkpoints: a dry run by default (before -> after per shard); `--execute` applies it,
    /// refused while any worker of the group is alive.
    #[command(after_help = EXIT_CODES_HELP)]
    Reset(Box<reset::ResetArgs>),
    /// Set the StreamConsumer's spec.paused (the operator scales its workers to zero) and wait until
    /// every worker has left the group.
    #[command(after_help = EXIT_CODES_HELP)]
    Pause(pause::PauseArgs),
    /// Clear spec.paused and wait until the workers are back.
    #[command(after_help = EXIT_CODES_HELP)]
    Resume(pause::PauseArgs),
    /// Mark one worker draining: it hands all its leases to the other live workers (cooperative
    /// handoff, no repeats) and takes none while marked; wait until it holds none. `--cancel` unmarks.
    #[command(after_help = EXIT_CODES_HELP)]
    Drain(Box<drain::DrainArgs>),
    /// Copy the checkpoints of a Java KCL lease table into the consumer's (dry run by default), so a
    /// KCL application switches to Leasehold with no gap and no reprocessing.
    #[command(name = "import-kcl", after_help = EXIT_CODES_HELP)]
    ImportKcl(Box<kcl::ImportArgs>),
    /// Put dead letters back: read the consumer's dead-letter stream, queue and bucket and put each
    /// original record on its stream again (dry run by default; `--execute` puts and marks them).
    #[command(after_help = EXIT_CODES_HELP)]
    Redrive(Box<redrive::RedriveArgs>),
    /// Reprocess the records that arrived between two times beside the live consumer: a dry run by
    /// default (the shards and an estimate of the window's records); `--execute` creates a window
    /// consumer from the live one's spec, follows it to `Completed` and deletes it (`--keep` keeps it).
    #[command(after_help = EXIT_CODES_HELP)]
    Replay(Box<replay::ReplayArgs>),
    /// Print a shell completion script.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Parses the command line and runs it; the process's exit code.
pub fn main() -> ExitCode {
    // Run as `kubectl-leasehold` (kubectl's plugin), usage and completions say `kubectl leasehold`.
    let plugin = std::env::args_os()
        .next()
        .and_then(|arg0| std::path::Path::new(&arg0).file_name().map(|n| n.to_string_lossy().starts_with("kubectl-")))
        .unwrap_or(false);
    let command = if plugin { Cli::command().bin_name("kubectl leasehold") } else { Cli::command() };
    let cli = match command.try_get_matches().and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m)) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            error.exit_code()
        }
    }
}

/// Runs one parsed command.
pub async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Describe { target } => {
            let target = target::resolve(&target).await?;
            describe::run(&target, cli.output).await
        }
        Command::Reset(args) => reset::run(&args, cli.output).await,
        Command::Pause(args) => pause::run(&args, true, cli.output).await,
        Command::Resume(args) => pause::run(&args, false, cli.output).await,
        Command::Drain(args) => drain::run(&args, cli.output).await,
        Command::ImportKcl(args) => kcl::run(&args, cli.output).await,
        Command::Redrive(args) => redrive::run(&args, cli.output).await,
        Command::Replay(args) => replay::run(&args, cli.output).await,
        Command::Completions { shell } => {
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "leasehold", &mut std::io::stdout());
            Ok(())
        }
    }
}

/// Parses a duration argument (`30s`, `2h`, `1d`).
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration like 30s, 15m or 2h: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CLI's reference page: every command (walked from clap's tree), its flags, the exit codes.
    fn reference_page() -> String {
        use leasehold_worker::reference::{command_markdown, exit_codes_markdown, generated_note};
        format!(
            "# `leasehold` CLI reference\n\n{}\n\
             Every command of the `leasehold` CLI, also installed as the kubectl plugin `kubectl-leasehold` \
             (`kubectl leasehold ...`, the same commands and flags). A consumer is named as \
             `namespace/name` (its StreamConsumer) or, where a command allows it, by `--table`.\n\n{}\
             ## Exit codes\n\nEvery command exits with one of these (its `--help` lists them too).\n\n{}",
            generated_note("the CLI's clap definitions (`cli/src`)"),
            command_markdown(&Cli::command(), 2),
            exit_codes_markdown(shared::error::EXIT_CODES)
        )
    }

    #[test]
    fn reference_page_of_the_cli_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference/cli.md");
        if let Err(e) = leasehold_worker::reference::check_or_write(&path, &reference_page()) {
            panic!("{e}");
        }
    }

    #[test]
    fn the_page_has_every_subcommand_and_every_exit_code() {
        let page = reference_page();
        for sub in Cli::command().get_subcommands() {
            assert!(page.contains(&format!("## `leasehold {}`", sub.get_name())), "{} missing", sub.get_name());
            assert!(sub.get_about().is_some(), "{} has no doc comment", sub.get_name());
        }
        for (code, _) in shared::error::EXIT_CODES {
            assert!(page.contains(&format!("| {code} |")), "exit code {code} missing");
        }
    }
}
