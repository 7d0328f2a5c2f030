//! Any other OpenAI-compatible server: what tokentap assumes of a server it cannot name.

use super::spec::EngineSpec;

pub(super) static SPEC: EngineSpec = EngineSpec {
    name: "openai",
    // The OpenAI API has no route that acts on the server.
    control_routes: &[],
};
