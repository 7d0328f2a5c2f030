//! JSON output and wall-clock seconds for the simulator's bodies. Written by hand, not through
//! serde, because the servers' exact bytes (key order, compact separators, raw UTF-8) are the
//! product and no per-chunk `serde_json::Value` may be built; the string writer is the workspace's
//! one (`base::json`), which writes raw UTF-8 as orjson/msgspec/pydantic do.
use std::time::SystemTime;

pub use tokentap_base::json::push_json_string as push_json_str;
use tokentap_base::wallclock;

/// Whole seconds since the Unix epoch (0 if the clock is before it): `created` fields.
pub fn unix_seconds() -> u64 {
    wallclock::unix_seconds(SystemTime::now()).max(0.0) as u64
}

/// Fractional seconds since the Unix epoch: sglang's `response_sent_to_client_ts`.
pub fn unix_seconds_f64() -> f64 {
    wallclock::unix_seconds(SystemTime::now())
}
