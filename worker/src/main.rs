//! `leasehold-worker --config FILE`: runs one worker of a Kinesis consumer group (see
//! `leasehold_worker::main` for flags, signals and exit codes).

fn main() -> std::process::ExitCode {
    leasehold_worker::main()
}
