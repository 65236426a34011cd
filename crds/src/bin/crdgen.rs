//! Prints the StreamConsumer CRD as YAML, or with `--reference` the configuration reference as
//! Markdown (`make crds` writes both).

fn main() -> std::process::ExitCode {
    let reference = std::env::args().any(|a| a == "--reference");
    let output = if reference {
        leasehold_crds::reference_markdown().map_err(|e| e.to_string())
    } else {
        leasehold_crds::crd_yaml().map_err(|e| e.to_string())
    };
    match output {
        Ok(text) => {
            print!("{text}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
