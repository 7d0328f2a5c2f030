//! The `tokentap` binary: parse the command line and hand over to [`tokentap::cli::run`].

fn main() -> std::process::ExitCode {
    tokentap::cli::main()
}
