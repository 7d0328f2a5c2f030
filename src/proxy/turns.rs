//! Which turn of which conversation a production request is: its session key read from the
//! configured headers and body fields (`[sessions] keys`, first present wins), its prompt's turn
//! ends (`stream::fingerprint`) for a request that names no session, and the session table's
//! answer (`meter::conversation`). Once per request, when its body has been read; the turn's
//! end is told to the table by the record sink below, when the request's record is published
//! (its last byte).

use std::sync::Arc;

use http::HeaderMap;
use tokio::time::Instant;

use crate::config::{SessionKey, SessionsConfig};
use crate::meter::conversation::{Conversations, Turn, TurnQuery};
use crate::meter::record::RequestRecord;
use crate::meter::turn_stats::TurnStats;
use crate::meter::RecordSink;
use crate::stream::fingerprint::PrefixSalt;
use crate::stream::request::RequestFacts;

/// Reads each production request's session and hands it to the table.
#[derive(Debug)]
pub struct TurnTaker {
    table: Arc<Conversations>,
    stats: Arc<TurnStats>,
    salt: PrefixSalt,
    keys: Vec<SessionKey>,
}

impl TurnTaker {
    /// The taker for `config`, with the salt turn ends are keyed with (the workload capture's
    /// when it is on, so a trace's ids and the table's agree; else a random one).
    pub fn new(config: &SessionsConfig, salt: PrefixSalt) -> Self {
        Self {
            table: Arc::new(Conversations::new(config.limits)),
            stats: Arc::default(),
            salt,
            keys: config.keys.clone(),
        }
    }

    pub fn table(&self) -> &Arc<Conversations> {
        &self.table
    }

    /// The session figures per model (`meter::turn_stats`).
    pub fn stats(&self) -> &Arc<TurnStats> {
        &self.stats
    }

    /// The sinks the meter hands records to: the one that tells the table when each turn
    /// ended, and the session figures.
    pub fn sinks(&self) -> [Arc<dyn RecordSink>; 2] {
        [
            Arc::new(TurnEndSink(Arc::clone(&self.table))),
            Arc::clone(&self.stats) as Arc<dyn RecordSink>,
        ]
    }

    /// The turn `body` (with `facts` read from it) is, starting `now`.
    pub(crate) fn turn(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        facts: &RequestFacts,
        now: Instant,
    ) -> Option<Turn> {
        let key = self.keys.iter().find_map(|key| match key {
            SessionKey::Header(name) => headers
                .get(name)
                .map(http::HeaderValue::as_bytes)
                .filter(|value| !value.is_empty()),
            SessionKey::Body(index) => facts
                .session_fields
                .get(*index)
                .copied()
                .flatten()
                .map(|span| span.bytes(body)),
        });
        let prompt = facts
            .prompt
            .map(|span| span.bytes(body))
            .unwrap_or_default();
        let ends = self.salt.turn_ends(prompt);
        self.table.begin(
            TurnQuery {
                key,
                model: facts.model.as_deref().unwrap_or_default(),
                ends: &ends.ends,
                prompt_bytes: ends.len,
            },
            now,
        )
    }
}

/// Tells the table a turn ended, as its record is published.
struct TurnEndSink(Arc<Conversations>);

impl RecordSink for TurnEndSink {
    fn record(&self, record: &Arc<RequestRecord>) {
        if let Some(turn) = &record.turn {
            self.0
                .ended(turn, Instant::now(), record.timing.ttft_tool_call.is_some());
        }
    }
}
