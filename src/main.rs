//! The `outboxd` binary: all logic lives in the library (see `outboxd::cli`).

fn main() -> std::process::ExitCode {
    outboxd::cli::main()
}
