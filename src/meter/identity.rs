//! Which configuration each upstream runs: its fingerprint id in a lock-free slot that every
//! request reads once at its start (`RequestRecord::fingerprint`), whether it flaps, and the
//! last few configurations seen with their facts (what `tokentap_upstream_config_info`, the
//! page's markers and the per-fingerprint matrices show).
//!
//! This is only the shared state and its rules (when a change counts, when the upstream
//! flaps); the reader that asks the upstreams and computes the ids is `upstream_identity`.
//!
//! Bounds: [`KEPT_CONFIGS`] configurations per upstream; above [`FLAP_CHANGES_PER_HOUR`]
//! changes within an hour the upstream is *flapping*: its label is fixed to `flapping` and no
//! new configuration is kept until an hour passes with at most that many changes.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::base::lock;

/// Configurations kept per upstream: the current one and three before it.
pub const KEPT_CONFIGS: usize = 4;
/// More changes than this within [`FLAP_WINDOW`] make an upstream flapping.
pub const FLAP_CHANGES_PER_HOUR: usize = 6;
/// The window the flapping rule counts changes in.
pub const FLAP_WINDOW: Duration = Duration::from_secs(3600);

const UNKNOWN: u64 = u64::MAX;
const FLAPPING: u64 = u64::MAX - 1;
const ID_MASK: u64 = 0xFFFF_FFFF_FFFF;

/// A configuration's short id: 48 bits of the fingerprint hash, shown as 12 lowercase hex
/// characters; or `unknown` (not read yet) or `flapping`. `Copy`, so a request carries it
/// without allocating.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FingerprintId(u64);

impl FingerprintId {
    /// The upstream has not said what it is yet.
    pub const UNKNOWN: Self = Self(UNKNOWN);
    /// The upstream changes too often to mint a label per configuration.
    pub const FLAPPING: Self = Self(FLAPPING);

    /// The id of a 64-bit hash (its low 48 bits).
    pub fn from_hash(hash: u64) -> Self {
        Self(hash & ID_MASK)
    }

    /// Reads `unknown`, `flapping` or 12 hex characters.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "unknown" => Some(Self::UNKNOWN),
            "flapping" => Some(Self::FLAPPING),
            _ if text.len() == 12 && text.bytes().all(|b| b.is_ascii_hexdigit()) => {
                u64::from_str_radix(text, 16).ok().map(Self)
            }
            _ => None,
        }
    }

    /// A real configuration (neither `unknown` nor `flapping`).
    pub fn is_config(self) -> bool {
        self.0 <= ID_MASK
    }

    /// The label text, without allocating.
    pub fn label(self) -> FingerprintLabel {
        let mut bytes = [0u8; 12];
        let len = match self.0 {
            UNKNOWN => {
                bytes[..7].copy_from_slice(b"unknown");
                7
            }
            FLAPPING => {
                bytes[..8].copy_from_slice(b"flapping");
                8
            }
            id => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                for (i, byte) in bytes.iter_mut().enumerate() {
                    let shift = 4 * (11 - i);
                    *byte = HEX[((id >> shift) & 0xF) as usize];
                }
                12
            }
        };
        FingerprintLabel { bytes, len }
    }
}

impl Default for FingerprintId {
    fn default() -> Self {
        Self::UNKNOWN
    }
}

impl fmt::Display for FingerprintId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label().as_str())
    }
}

impl fmt::Debug for FingerprintId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FingerprintId({})", self.label().as_str())
    }
}

/// The text of a [`FingerprintId`] on the stack.
#[derive(Clone, Copy)]
pub struct FingerprintLabel {
    bytes: [u8; 12],
    len: usize,
}

impl FingerprintLabel {
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.bytes.get(..self.len).unwrap_or_default()).unwrap_or("unknown")
    }
}

/// What an upstream said about itself, split in two: `fields` enter the fingerprint (the
/// documented list of performance-relevant facts, docs/fleet.md), `extra` is shown but not
/// hashed (the redacted launch command, where each fact came from). Sorted maps: the canonical
/// order the hash is computed over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigFacts {
    pub fields: BTreeMap<String, String>,
    pub extra: BTreeMap<String, String>,
}

impl ConfigFacts {
    /// A fact by key, from either map.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .get(key)
            .or_else(|| self.extra.get(key))
            .map(String::as_str)
    }
}

/// One configuration an upstream ran.
#[derive(Debug, Clone)]
pub struct ConfigEntry {
    pub id: FingerprintId,
    pub facts: ConfigFacts,
    /// When it was first read (this time, after whatever ran before it).
    pub since: SystemTime,
    /// The configuration before it, if any was kept.
    pub previous: Option<FingerprintId>,
}

impl ConfigEntry {
    pub fn engine(&self) -> &str {
        self.facts.get("engine").unwrap_or("unknown")
    }

    pub fn version(&self) -> &str {
        self.facts.get("version").unwrap_or("unknown")
    }
}

/// What one observation changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// The same configuration as before.
    Same,
    /// A configuration other than the current one (or the first): now current.
    Changed {
        previous: Option<FingerprintId>,
        id: FingerprintId,
    },
    /// The change that made the upstream flapping: the label is now `flapping`.
    StartedFlapping,
    /// Flapping, and it changed again: nothing is kept.
    StillFlapping,
    /// An hour with few enough changes: the label is the observed configuration again.
    StoppedFlapping { id: FingerprintId },
}

#[derive(Debug, Default)]
struct History {
    /// Newest last, at most [`KEPT_CONFIGS`].
    configs: VecDeque<ConfigEntry>,
    /// The id read last (while flapping, it differs from the label).
    last_read: Option<FingerprintId>,
    /// When each change within the last [`FLAP_WINDOW`] happened.
    changes: VecDeque<SystemTime>,
    changes_total: u64,
}

/// One upstream's configuration state.
#[derive(Debug)]
pub struct UpstreamIdentity {
    pub upstream: Arc<str>,
    current: AtomicU64,
    flapping: AtomicBool,
    history: Mutex<History>,
    /// The upstream failed (a request that could not reach it, or a read nobody answered)
    /// and has not answered since.
    down: AtomicBool,
    /// Wakes the reader when the upstream answers again after failing.
    back: tokio::sync::Notify,
    /// How many routes the server publishes that no route table classifies (`proxy::describe`
    /// sets it from each read; [`UNKNOWN`] while it has published none).
    unclassified_routes: AtomicU64,
}

impl UpstreamIdentity {
    pub fn new(upstream: Arc<str>) -> Self {
        Self {
            upstream,
            current: AtomicU64::new(UNKNOWN),
            flapping: AtomicBool::new(false),
            history: Mutex::new(History::default()),
            down: AtomicBool::new(false),
            back: tokio::sync::Notify::new(),
            unclassified_routes: AtomicU64::new(UNKNOWN),
        }
    }

    /// Records how many published routes no table classifies (`None`: it publishes none).
    pub fn set_unclassified_routes(&self, count: Option<usize>) {
        let count = count.map_or(UNKNOWN, |n| u64::try_from(n).unwrap_or(UNKNOWN - 1));
        self.unclassified_routes.store(count, Ordering::Relaxed);
    }

    /// How many published routes no table classifies, once the server published its routes.
    pub fn unclassified_routes(&self) -> Option<u64> {
        let count = self.unclassified_routes.load(Ordering::Relaxed);
        (count != UNKNOWN).then_some(count)
    }

    /// Notes whether the upstream answered a request (or a read): the first answer after a
    /// failure wakes the reader (a restarted server may be another configuration). Atomics
    /// only; called at request end.
    pub fn note_answer(&self, answered: bool) {
        if !answered {
            self.down.store(true, Ordering::Relaxed);
        } else if self.down.swap(false, Ordering::Relaxed) {
            self.back.notify_one();
        }
    }

    /// The reader's own read answered: no longer down, without waking the reader.
    pub fn clear_down(&self) {
        self.down.store(false, Ordering::Relaxed);
    }

    /// Whether the upstream failed and has not answered since.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// Resolves when the upstream answers again after a failure.
    pub async fn back(&self) {
        self.back.notified().await;
    }

    /// The label requests get now: one atomic load.
    pub fn current(&self) -> FingerprintId {
        FingerprintId(self.current.load(Ordering::Relaxed))
    }

    pub fn is_flapping(&self) -> bool {
        self.flapping.load(Ordering::Relaxed)
    }

    /// Configuration changes seen since start (the first read is not a change).
    pub fn changes_total(&self) -> u64 {
        lock::lock(&self.history).changes_total
    }

    /// The kept configurations, oldest first.
    pub fn configs(&self) -> Vec<ConfigEntry> {
        lock::lock(&self.history).configs.iter().cloned().collect()
    }

    /// The kept configuration `id`, if kept.
    pub fn config(&self, id: FingerprintId) -> Option<ConfigEntry> {
        lock::lock(&self.history)
            .configs
            .iter()
            .find(|c| c.id == id)
            .cloned()
    }

    /// The current configuration's entry (none while unknown or flapping).
    pub fn current_config(&self) -> Option<ConfigEntry> {
        self.config(self.current())
    }

    /// The configuration before the current one, if kept.
    pub fn previous_config(&self) -> Option<ConfigEntry> {
        let previous = self.current_config()?.previous?;
        self.config(previous)
    }

    /// Records that the upstream now reads as `id` with `facts` at `now`.
    pub fn observe(&self, id: FingerprintId, facts: ConfigFacts, now: SystemTime) -> Observed {
        let mut history = lock::lock(&self.history);
        while history
            .changes
            .front()
            .is_some_and(|t| now.duration_since(*t).unwrap_or_default() > FLAP_WINDOW)
        {
            history.changes.pop_front();
        }
        let changed = history.last_read.is_some_and(|last| last != id);
        let first = history.last_read.is_none();
        history.last_read = Some(id);
        if changed {
            history.changes.push_back(now);
            history.changes_total += 1;
        }
        let flapping_now = history.changes.len() > FLAP_CHANGES_PER_HOUR;
        let was_flapping = self.flapping.load(Ordering::Relaxed);
        if flapping_now {
            self.flapping.store(true, Ordering::Relaxed);
            self.current.store(FLAPPING, Ordering::Relaxed);
            return if was_flapping {
                Observed::StillFlapping
            } else {
                Observed::StartedFlapping
            };
        }
        if was_flapping {
            self.flapping.store(false, Ordering::Relaxed);
            self.keep(&mut history, id, facts, now);
            return Observed::StoppedFlapping { id };
        }
        if !changed && !first {
            // The same configuration: refresh its facts (a field that answered late).
            if let Some(entry) = history.configs.iter_mut().rev().find(|c| c.id == id) {
                entry.facts = facts;
            }
            return Observed::Same;
        }
        let previous = self.keep(&mut history, id, facts, now);
        Observed::Changed { previous, id }
    }

    /// Makes `id` current and kept (moved to the end if it was kept already); returns the
    /// configuration it replaces.
    fn keep(
        &self,
        history: &mut History,
        id: FingerprintId,
        facts: ConfigFacts,
        now: SystemTime,
    ) -> Option<FingerprintId> {
        let previous = Some(self.current()).filter(|p| p.is_config() && *p != id);
        history.configs.retain(|c| c.id != id);
        history.configs.push_back(ConfigEntry {
            id,
            facts,
            since: now,
            previous,
        });
        while history.configs.len() > KEPT_CONFIGS {
            history.configs.pop_front();
        }
        self.current.store(id.0, Ordering::Relaxed);
        previous
    }
}

/// Every upstream's configuration state, for the exporters and the admin listener.
#[derive(Debug, Default)]
pub struct IdentityRegistry {
    upstreams: Mutex<Vec<Arc<UpstreamIdentity>>>,
}

impl IdentityRegistry {
    /// Adds an upstream's state (the proxy's upstreams own theirs); a second one of the same
    /// name replaces the first.
    pub fn add(&self, identity: Arc<UpstreamIdentity>) {
        let mut upstreams = lock::lock(&self.upstreams);
        upstreams.retain(|u| u.upstream != identity.upstream);
        upstreams.push(identity);
    }

    /// By configured order.
    pub fn all(&self) -> Vec<Arc<UpstreamIdentity>> {
        lock::lock(&self.upstreams).clone()
    }

    pub fn get(&self, upstream: &str) -> Option<Arc<UpstreamIdentity>> {
        lock::lock(&self.upstreams)
            .iter()
            .find(|u| &*u.upstream == upstream)
            .cloned()
    }

    /// The kept configuration `id` of any upstream.
    pub fn config(&self, id: FingerprintId) -> Option<ConfigEntry> {
        self.all().iter().find_map(|u| u.config(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(version: &str) -> ConfigFacts {
        let mut facts = ConfigFacts::default();
        facts.fields.insert("version".into(), version.into());
        facts
    }

    #[test]
    fn labels_are_twelve_hex_or_a_word() {
        let id = FingerprintId::from_hash(0xbeef_0123_4567_89ab);
        assert_eq!(id.label().as_str(), "0123456789ab");
        assert_eq!(FingerprintId::parse("0123456789ab"), Some(id));
        assert_eq!(FingerprintId::UNKNOWN.to_string(), "unknown");
        assert_eq!(FingerprintId::FLAPPING.to_string(), "flapping");
        assert_eq!(
            FingerprintId::parse("flapping"),
            Some(FingerprintId::FLAPPING)
        );
        assert_eq!(FingerprintId::from_hash(0).to_string(), "000000000000");
        for bad in [
            "",
            "0123456789a",
            "0123456789abc",
            "0123456789aG",
            "+12345678901",
        ] {
            assert_eq!(FingerprintId::parse(bad), None, "{bad}");
        }
        assert!(!FingerprintId::UNKNOWN.is_config());
        assert!(id.is_config());
    }

    #[test]
    fn changes_keep_a_bounded_history_and_flapping_fixes_the_label() {
        let u = UpstreamIdentity::new("u".into());
        assert_eq!(u.current(), FingerprintId::UNKNOWN);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let a = FingerprintId::from_hash(1);
        let b = FingerprintId::from_hash(2);
        assert_eq!(
            u.observe(a, facts("1"), t0),
            Observed::Changed {
                previous: None,
                id: a
            }
        );
        assert_eq!(u.observe(a, facts("1"), t0), Observed::Same);
        assert_eq!(
            u.observe(b, facts("2"), t0 + Duration::from_secs(60)),
            Observed::Changed {
                previous: Some(a),
                id: b
            }
        );
        assert_eq!(u.previous_config().map(|c| c.id), Some(a));
        assert_eq!(u.changes_total(), 1);
        // Six more changes in the hour are allowed; the seventh flaps.
        let mut at = t0 + Duration::from_secs(120);
        for i in 0..5u64 {
            let id = FingerprintId::from_hash(10 + i);
            assert!(matches!(
                u.observe(id, facts("x"), at),
                Observed::Changed { .. }
            ));
            at += Duration::from_secs(60);
        }
        assert_eq!(u.configs().len(), KEPT_CONFIGS);
        assert_eq!(
            u.observe(a, facts("1"), at),
            Observed::StartedFlapping,
            "the 7th change in an hour"
        );
        assert_eq!(u.current(), FingerprintId::FLAPPING);
        assert!(u.is_flapping());
        for i in 0..50u64 {
            at += Duration::from_secs(1);
            assert_eq!(
                u.observe(FingerprintId::from_hash(100 + i), facts("y"), at),
                Observed::StillFlapping
            );
        }
        assert_eq!(
            u.configs().len(),
            KEPT_CONFIGS,
            "flapping keeps nothing new"
        );
        // An hour later with no change: the label is the configuration read.
        at += FLAP_WINDOW + Duration::from_secs(1);
        let last = FingerprintId::from_hash(149);
        assert_eq!(
            u.observe(last, facts("y"), at),
            Observed::StoppedFlapping { id: last }
        );
        assert_eq!(u.current(), last);
        assert!(!u.is_flapping());
    }
}
