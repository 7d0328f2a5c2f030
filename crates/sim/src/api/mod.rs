//! One module per generation API, each holding its request parsing and its bytes (stream
//! events, whole bodies, the errors it reports its own way): `openai` (chat completions and
//! completions), `generate` (sglang's native route), `messages` (Anthropic Messages) and
//! `responses` (OpenAI Responses). They build on `request` (shared field readers), `output`
//! (the words of each step) and `error_body`; `render` and `generation` choose among them.
pub mod generate;
pub mod messages;
pub mod openai;
pub mod responses;
