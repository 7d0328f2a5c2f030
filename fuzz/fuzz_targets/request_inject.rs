//! Any request body through inspection and usage injection: no panic, and an injected body
//! still parses as JSON whenever the original did.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokentap::stream::classify::Route;
use tokentap::stream::request::{inject_usage, inspect};

fuzz_target!(|input: &[u8]| {
    for route in Route::ALL {
        let Some(facts) = inspect(route, input) else { continue };
        if let Some((body, _)) = inject_usage(input, &facts) {
            if serde_json_is_valid(input) {
                assert!(serde_json_is_valid(&body), "injection broke valid JSON");
            }
        }
    }
});

fn serde_json_is_valid(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(bytes).is_ok()
}
