//! The `tokentap` binary: parse the command line and hand over to [`tokentap::app::main`].
//! It also picks the process's allocator, which only a binary may do.

/// jemalloc, not the system's malloc (feature `jemalloc`: production builds and the image turn it on). A proxy holds
/// thousands of long-lived connections, and hyper gives each one 8 KiB buffers that an idle
/// stream barely writes (its write buffer, and the read it keeps posted to see a hang-up).
/// glibc's in-band chunk headers make such blocks resident; jemalloc keeps its metadata out of
/// band, so an idle stream costs ~15 instead of ~19 KiB (docs/benchmarks.md, "The allocator").
/// A plain `cargo build` uses the system allocator (jemalloc's C build is a minute of a cold build).
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    tokentap::app::main()
}
