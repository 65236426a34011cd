//! Prints the StreamConsumer CRD as YAML (`make crds` writes it to crds/streamconsumer.yaml).

fn main() -> std::process::ExitCode {
    match leasehold_crds::crd_yaml() {
        Ok(yaml) => {
            print!("{yaml}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
