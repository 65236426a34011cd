//! `kubectl-leasehold`: the `leasehold` CLI as a kubectl plugin (`kubectl leasehold describe ns/name`).

fn main() -> std::process::ExitCode {
    leasehold_cli::main()
}
