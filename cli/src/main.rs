//! `leasehold`: the day-2 CLI of Leasehold consumers.

fn main() -> std::process::ExitCode {
    leasehold_cli::main()
}
