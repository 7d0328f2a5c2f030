//! The `tokentap` binary: parse the command line and hand over to [`tokentap::app::main`].

fn main() -> std::process::ExitCode {
    tokentap::app::main()
}
