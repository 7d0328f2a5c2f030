//! The integration tests, one test binary (each file below was a binary of its own: one link
//! of the crate instead of twenty-odd on two cores). Run one file's tests with
//! `cargo test --test integration fault_tests::` (or `scripts/test --test integration fault_tests::`).
//! `alloc_tests.rs` stays a binary of its own: it installs a counting global allocator.

mod common;

mod admin_tests;
mod agreement_tests;
mod availability_tests;
mod bench_tests;
mod budget_tests;
mod cli_tests;
mod demo_tests;
mod deploy_tests;
mod drift_tests;
mod engine_tests;
mod fault_tests;
mod fidelity_tests;
mod fingerprint_tests;
mod fleet_tests;
mod hardening_tests;
mod interference_tests;
mod labels_tests;
mod layers_tests;
mod matrix_tests;
mod otel_tests;
mod production_tests;
mod proxy_tests;
mod replay_tests;
mod server_state_tests;
mod session_tests;
mod shed_tests;
mod sim_conformance_tests;
mod sim_layers_tests;
mod sim_tests;
mod slo_tests;
mod sweep_tests;
mod tenant_tests;
mod timing_tests;
mod tls_tests;
mod verdict_tests;
mod workload_tests;
