//! The `gatehouse` binary: the command line over the `server` library, and the benchmarks
//! (which stay out of the shipped library).

mod bench;
mod cli;

use std::process::ExitCode;

/// mimalloc instead of glibc's allocator: a request or a job allocates and frees many small
/// buffers across threads, where glibc spent a fifth of the CPU (malloc, free and
/// `malloc_consolidate` in a `perf` profile of `gatehouse bench webhook`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    cli::main()
}
