//! The `gatehouse` binary: the command line over the `server` library, and the benchmarks
//! (which stay out of the shipped library).

mod bench;
mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
