//! The `outboxd` binary: all logic lives in the library (see `outboxd::cli`).
//!
//! Its allocator is mimalloc: under load glibc's malloc and free took about
//! a fifth of the worker's CPU, with futex waits on its arena locks between
//! the runtime's thread and lapin's I/O thread, which frees the frames the
//! runtime built; mimalloc took 17–22 % off a worker's CPU per message
//! (BENCHMARKS.md, section 7).

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    outboxd::cli::main()
}
