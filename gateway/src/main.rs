//! `bulkhead`: the gateway and its operator tools.

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = cli::Args::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
