//! A matrix document and the configuration that produced it: the production matrix's
//! metadata filled from an upstream's configuration facts (`meter::identity`), so it carries
//! what a seed page carries (engine, version, quantization, launch command, model, hardware),
//! and the fingerprint id every document records as the extra fact `Engine / Fingerprint`.
//! Pure.

use crate::matrix::doc::{Fact, Metadata};
use crate::meter::identity::{ConfigEntry, FingerprintId};

/// The extra fact's section and key holding a document's fingerprint id.
pub const FINGERPRINT_SECTION: &str = "Engine";
pub const FINGERPRINT_KEY: &str = "Fingerprint";

/// Fills what `metadata` lacks from `config`, and records its fingerprint.
pub fn apply_config(metadata: &mut Metadata, config: &ConfigEntry) {
    let facts = &config.facts;
    let get = |key: &str| facts.get(key).map(str::to_owned);
    let engine = &mut metadata.engine;
    engine.name = engine.name.take().or_else(|| get("engine"));
    engine.version = engine.version.take().or_else(|| get("version"));
    engine.quantization = engine
        .quantization
        .take()
        .or_else(|| get("quantization").filter(|q| !q.is_empty() && q != "null" && q != "None"));
    let model = &mut metadata.model;
    model.model_path = model.model_path.take().or_else(|| get("model"));
    model.revision = model.revision.take().or_else(|| get("weight_version"));
    let hardware = &mut metadata.hardware;
    hardware.label = hardware.label.take().or_else(|| get("hardware"));
    hardware.gpu_count = hardware
        .gpu_count
        .or_else(|| facts.get("gpu_count").and_then(|n| n.parse().ok()));
    metadata.launch_command = metadata
        .launch_command
        .take()
        .or_else(|| get("launch_command"));
    set_fingerprint(metadata, config.id);
}

/// Records `id` as the document's fingerprint (replacing any earlier one).
pub fn set_fingerprint(metadata: &mut Metadata, id: FingerprintId) {
    metadata
        .extra_facts
        .retain(|f| !(f.section == FINGERPRINT_SECTION && f.key == FINGERPRINT_KEY));
    metadata.extra_facts.push(Fact {
        section: FINGERPRINT_SECTION.to_owned(),
        key: FINGERPRINT_KEY.to_owned(),
        value: id.to_string(),
    });
}

/// The fingerprint a document records, if any (and a real configuration).
pub fn fingerprint_of(metadata: &Metadata) -> Option<FingerprintId> {
    metadata
        .extra_facts
        .iter()
        .find(|f| f.section == FINGERPRINT_SECTION && f.key == FINGERPRINT_KEY)
        .and_then(|f| FingerprintId::parse(&f.value))
        .filter(|id| id.is_config())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::identity::ConfigFacts;

    #[test]
    fn facts_fill_the_metadata_and_the_id_round_trips() {
        let mut facts = ConfigFacts::default();
        for (k, v) in [
            ("engine", "sglang"),
            ("version", "0.5.23"),
            ("model", "/models/m"),
            ("quantization", "fp8"),
            ("hardware", "4x H100"),
            ("gpu_count", "4"),
        ] {
            facts.fields.insert(k.into(), v.into());
        }
        facts.extra.insert(
            "launch_command".into(),
            "python -m sglang --api-key <redacted>".into(),
        );
        let id = FingerprintId::from_hash(0xabc);
        let entry = ConfigEntry {
            id,
            facts,
            since: std::time::SystemTime::UNIX_EPOCH,
            previous: None,
        };
        let mut metadata = Metadata::default();
        apply_config(&mut metadata, &entry);
        assert_eq!(metadata.engine.name.as_deref(), Some("sglang"));
        assert_eq!(metadata.engine.version.as_deref(), Some("0.5.23"));
        assert_eq!(metadata.engine.quantization.as_deref(), Some("fp8"));
        assert_eq!(metadata.model.model_path.as_deref(), Some("/models/m"));
        assert_eq!(metadata.hardware.gpu_count, Some(4));
        assert!(metadata
            .launch_command
            .as_deref()
            .unwrap()
            .contains("<redacted>"));
        assert_eq!(fingerprint_of(&metadata), Some(id));
        apply_config(&mut metadata, &entry);
        assert_eq!(metadata.extra_facts.len(), 1, "one fingerprint fact");
    }
}
