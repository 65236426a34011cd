//! One module per subcommand: each holds its arguments (clap) and its `run`.

pub mod describe;
pub mod drain;
pub mod kcl;
pub mod pause;
pub mod redrive;
pub mod replay;
pub mod reset;
