//! `skiffctl`: Skiff's command-line client.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = skiff_ctl::Cli::parse();
    let runtime = tokio::runtime::Runtime::new().expect("cannot start the tokio runtime");
    match runtime.block_on(skiff_ctl::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skiffctl: {e}");
            ExitCode::FAILURE
        }
    }
}
