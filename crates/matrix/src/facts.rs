//! The matrix facts as one table: every metadata field that a page lists under Hardware, Engine
//! or Run, with its section, its document key, its page label, how to read it and how to store it.
//!
//! Validation, the page texts, both text importers and every renderer go through [`FACTS`], so a
//! fact is named in exactly one place. Keys without a field of their own are kept as extra facts.
//! Pure: no I/O, no markup (callers escape for their format).
use super::doc::{Fact, Metadata, Source};
use super::units::{format_count, parse_count, parse_with_unit, ValueError};

pub const SECTION_HARDWARE: &str = "Hardware";
pub const SECTION_ENGINE: &str = "Engine";
pub const SECTION_RUN: &str = "Run";
/// The sections that hold facts, in page order.
pub const FACT_SECTIONS: [&str; 3] = [SECTION_HARDWARE, SECTION_ENGINE, SECTION_RUN];

/// One fact field: where it sits on the page and in the document, and how it converts.
#[derive(Clone, Copy)]
pub struct FactField {
    /// The page section it is listed under (one of [`FACT_SECTIONS`]).
    pub section: &'static str,
    /// Its path in the JSON document, as validation errors name it (`metadata.hardware.gpu`).
    pub key: &'static str,
    /// Its wording on the page (`GPU`).
    pub label: &'static str,
    /// The stored value, `None` when unknown.
    pub get: fn(&Metadata) -> Option<FactValue<'_>>,
    /// Stores the page text of the value; a field that is already set is a duplicate.
    pub set: fn(&mut Metadata, &str) -> Result<(), SetError>,
}

/// A fact's stored value, typed so that validation can check it and the page can print it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FactValue<'a> {
    /// One line of free text.
    Text(&'a str),
    /// An RFC 3339 time.
    Time(&'a str),
    /// A duration in seconds: `30 s`.
    Seconds(f64),
    /// A token count: `4,096 tokens`.
    Tokens(u64),
    /// A plain count: `4`.
    Count(u32),
    /// GPU memory: `96 GB`, or `384 GB (4 × 96 GB)` with more than one GPU.
    Memory {
        per_gpu_gb: f64,
        gpu_count: Option<u32>,
    },
    Source(Source),
}

impl FactValue<'_> {
    /// The value as the page prints it.
    pub fn page_text(&self) -> String {
        match *self {
            FactValue::Text(text) | FactValue::Time(text) => text.to_owned(),
            FactValue::Seconds(seconds) => format!("{seconds} s"),
            FactValue::Tokens(tokens) => format!("{} tokens", format_count(tokens)),
            FactValue::Count(count) => count.to_string(),
            FactValue::Memory {
                per_gpu_gb,
                gpu_count,
            } => match gpu_count {
                Some(count) if count > 1 => {
                    format!(
                        "{} GB ({count} × {per_gpu_gb} GB)",
                        f64::from(count) * per_gpu_gb
                    )
                }
                _ => format!("{per_gpu_gb} GB"),
            },
            FactValue::Source(source) => source.as_str().to_owned(),
        }
    }
}

/// Why a fact's page text cannot be stored, before the caller names the fact.
#[derive(Debug, Clone, PartialEq)]
pub enum SetError {
    Value(ValueError),
    /// The field already holds a value.
    Duplicate,
    GpuCountMismatch {
        vram_count: u32,
        gpu_count: u32,
    },
}

/// A fact whose value does not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FactError {
    #[error("{key}")]
    Value {
        key: String,
        #[source]
        source: ValueError,
    },
    #[error("{key}: VRAM says {vram_count} GPUs but GPU count says {gpu_count}")]
    GpuCountMismatch {
        key: String,
        vram_count: u32,
        gpu_count: u32,
    },
    #[error("{key} is given twice")]
    Duplicate { key: String },
}

impl SetError {
    fn for_key(self, key: &str) -> FactError {
        let key = key.to_owned();
        match self {
            SetError::Value(source) => FactError::Value { key, source },
            SetError::Duplicate => FactError::Duplicate { key },
            SetError::GpuCountMismatch {
                vram_count,
                gpu_count,
            } => FactError::GpuCountMismatch {
                key,
                vram_count,
                gpu_count,
            },
        }
    }
}

/// Stores `value` into an empty slot.
fn store<T>(slot: &mut Option<T>, value: T) -> Result<(), SetError> {
    if slot.is_some() {
        return Err(SetError::Duplicate);
    }
    *slot = Some(value);
    Ok(())
}

fn seconds(text: &str) -> Result<f64, SetError> {
    parse_with_unit(text, "s").map_err(SetError::Value)
}

/// A fact field holding one line of free text.
macro_rules! text_fact {
    ($section:expr, $key:literal, $label:literal, $($field:ident).+) => {
        FactField {
            section: $section,
            key: $key,
            label: $label,
            get: |metadata| metadata.$($field).+.as_deref().map(FactValue::Text),
            set: |metadata, text| store(&mut metadata.$($field).+, text.to_owned()),
        }
    };
}

/// Every fact field, in page order within each section.
pub const FACTS: &[FactField] = &[
    text_fact!(
        SECTION_HARDWARE,
        "metadata.hardware.kind",
        "Type",
        hardware.kind
    ),
    text_fact!(
        SECTION_HARDWARE,
        "metadata.hardware.gpu",
        "GPU",
        hardware.gpu
    ),
    FactField {
        section: SECTION_HARDWARE,
        key: "metadata.hardware.gpu_count",
        label: "GPU count",
        get: |metadata| metadata.hardware.gpu_count.map(FactValue::Count),
        set: set_gpu_count,
    },
    FactField {
        section: SECTION_HARDWARE,
        key: "metadata.hardware.memory_per_gpu_gb",
        label: "VRAM",
        get: |metadata| {
            let hardware = &metadata.hardware;
            hardware
                .memory_per_gpu_gb
                .map(|per_gpu_gb| FactValue::Memory {
                    per_gpu_gb,
                    gpu_count: hardware.gpu_count,
                })
        },
        set: set_vram,
    },
    text_fact!(SECTION_HARDWARE, "metadata.hardware.os", "OS", hardware.os),
    text_fact!(
        SECTION_ENGINE,
        "metadata.engine.name",
        "Engine",
        engine.name
    ),
    text_fact!(
        SECTION_ENGINE,
        "metadata.engine.version",
        "Version",
        engine.version
    ),
    text_fact!(
        SECTION_ENGINE,
        "metadata.engine.quantization",
        "Quantization",
        engine.quantization
    ),
    text_fact!(
        SECTION_ENGINE,
        "metadata.engine.backend",
        "Backend",
        engine.backend
    ),
    text_fact!(
        SECTION_ENGINE,
        "metadata.engine.repository",
        "Repository",
        engine.repository
    ),
    text_fact!(
        SECTION_ENGINE,
        "metadata.engine.build",
        "Build",
        engine.build
    ),
    text_fact!(
        SECTION_ENGINE,
        "metadata.engine.commit",
        "Commit",
        engine.commit
    ),
    text_fact!(
        SECTION_RUN,
        "metadata.model.served_model",
        "Served model",
        model.served_model
    ),
    text_fact!(
        SECTION_RUN,
        "metadata.model.model_path",
        "Model path",
        model.model_path
    ),
    text_fact!(
        SECTION_RUN,
        "metadata.model.revision",
        "Revision",
        model.revision
    ),
    text_fact!(
        SECTION_RUN,
        "metadata.run.benchmark_tool",
        "Benchmark tool",
        run.benchmark_tool
    ),
    text_fact!(
        SECTION_RUN,
        "metadata.run.decode_test",
        "Decode test",
        run.decode_test
    ),
    text_fact!(
        SECTION_RUN,
        "metadata.run.prefill_mode",
        "Prefill mode",
        run.prefill_mode
    ),
    FactField {
        section: SECTION_RUN,
        key: "metadata.run.time_per_measurement_s",
        label: "Time per measurement",
        get: |metadata| metadata.run.time_per_measurement_s.map(FactValue::Seconds),
        set: |metadata, text| store(&mut metadata.run.time_per_measurement_s, seconds(text)?),
    },
    FactField {
        section: SECTION_RUN,
        key: "metadata.run.max_output_tokens",
        label: "Max output",
        get: |metadata| metadata.run.max_output_tokens.map(FactValue::Tokens),
        set: |metadata, text| {
            let tokens = text
                .strip_suffix(" tokens")
                .and_then(|count| parse_count(count).ok())
                .ok_or_else(|| {
                    SetError::Value(ValueError {
                        expected: "a token count like 4,096 tokens",
                        found: text.to_owned(),
                    })
                })?;
            store(&mut metadata.run.max_output_tokens, tokens)
        },
    },
    FactField {
        section: SECTION_RUN,
        key: "metadata.run.source",
        label: "Source",
        get: |metadata| metadata.run.source.map(FactValue::Source),
        set: |metadata, text| {
            let source = Source::parse(text).ok_or_else(|| {
                SetError::Value(ValueError {
                    expected: "production or synthetic",
                    found: text.to_owned(),
                })
            })?;
            store(&mut metadata.run.source, source)
        },
    },
    text_fact!(
        SECTION_RUN,
        "metadata.run.sweep_id",
        "Sweep id",
        run.sweep_id
    ),
    FactField {
        section: SECTION_RUN,
        key: "metadata.run.window_s",
        label: "Window",
        get: |metadata| metadata.run.window_s.map(FactValue::Seconds),
        set: |metadata, text| store(&mut metadata.run.window_s, seconds(text)?),
    },
    FactField {
        section: SECTION_RUN,
        key: "metadata.run.started_at",
        label: "Started",
        get: |metadata| metadata.run.started_at.as_deref().map(FactValue::Time),
        set: |metadata, text| store(&mut metadata.run.started_at, text.to_owned()),
    },
    FactField {
        section: SECTION_RUN,
        key: "metadata.run.ended_at",
        label: "Ended",
        get: |metadata| metadata.run.ended_at.as_deref().map(FactValue::Time),
        set: |metadata, text| store(&mut metadata.run.ended_at, text.to_owned()),
    },
];

/// The field a page lists as `label` under `section`, if it has one of its own.
pub fn field(section: &str, label: &str) -> Option<&'static FactField> {
    FACTS
        .iter()
        .find(|field| field.section == section && field.label == label)
}

/// The facts of one section as (label, value) page text, in page order; extra facts last.
pub fn section_facts(metadata: &Metadata, section: &str) -> Vec<(String, String)> {
    let fields = FACTS
        .iter()
        .filter(|field| field.section == section)
        .filter_map(|field| {
            (field.get)(metadata).map(|value| (field.label.to_owned(), value.page_text()))
        });
    let extra = metadata
        .extra_facts
        .iter()
        .filter(|fact| fact.section == section)
        .map(|fact| (fact.key.clone(), fact.value.clone()));
    fields.chain(extra).collect()
}

/// Stores one page fact into `metadata`; keys without a field of their own become extra facts.
pub fn apply_fact(
    metadata: &mut Metadata,
    section: &str,
    key: &str,
    value: &str,
) -> Result<(), FactError> {
    if let Some(field) = field(section, key) {
        return (field.set)(metadata, value).map_err(|error| error.for_key(key));
    }
    if metadata
        .extra_facts
        .iter()
        .any(|fact| fact.section == section && fact.key == key)
    {
        return Err(FactError::Duplicate {
            key: key.to_owned(),
        });
    }
    metadata.extra_facts.push(Fact {
        section: section.to_owned(),
        key: key.to_owned(),
        value: value.to_owned(),
    });
    Ok(())
}

fn set_gpu_count(metadata: &mut Metadata, text: &str) -> Result<(), SetError> {
    let hardware = &mut metadata.hardware;
    let count = parse_count(text)
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            SetError::Value(ValueError {
                expected: "a GPU count like 4",
                found: text.to_owned(),
            })
        })?;
    if let (Some(existing), true) = (hardware.gpu_count, hardware.memory_per_gpu_gb.is_some()) {
        // VRAM came first and already set the count.
        if existing != count {
            return Err(SetError::GpuCountMismatch {
                vram_count: existing,
                gpu_count: count,
            });
        }
        return Ok(());
    }
    store(&mut hardware.gpu_count, count)
}

fn set_vram(metadata: &mut Metadata, text: &str) -> Result<(), SetError> {
    let hardware = &mut metadata.hardware;
    let (per_gpu, count) = parse_vram(text).map_err(SetError::Value)?;
    if let Some(count) = count {
        match hardware.gpu_count {
            Some(existing) if existing != count => {
                return Err(SetError::GpuCountMismatch {
                    vram_count: count,
                    gpu_count: existing,
                })
            }
            Some(_) => {}
            None => hardware.gpu_count = Some(count),
        }
    }
    store(&mut hardware.memory_per_gpu_gb, per_gpu)
}

/// `384 GB (4 × 96 GB)` → (96, Some(4)); `96 GB` → (96, None).
fn parse_vram(value: &str) -> Result<(f64, Option<u32>), ValueError> {
    let error = || ValueError {
        expected: "memory like 96 GB or 384 GB (4 × 96 GB)",
        found: value.to_owned(),
    };
    match value.split_once(" (") {
        None => Ok((parse_with_unit(value, "GB").map_err(|_| error())?, None)),
        Some((total, inner)) => {
            let total = parse_with_unit(total, "GB").map_err(|_| error())?;
            let inner = inner.strip_suffix(')').ok_or_else(error)?;
            let (count, per_gpu) = inner.split_once(" × ").ok_or_else(error)?;
            let count = parse_count(count)
                .ok()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n > 0)
                .ok_or_else(error)?;
            let per_gpu = parse_with_unit(per_gpu, "GB").map_err(|_| error())?;
            let expected_total = f64::from(count) * per_gpu;
            if (expected_total - total).abs() > 1e-9 * expected_total.max(1.0) {
                return Err(error());
            }
            Ok((per_gpu, Some(count)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::{Engine, Hardware, ModelInfo, RunInfo};

    fn every_fact_set() -> Metadata {
        Metadata {
            model: ModelInfo {
                display_name: None,
                served_model: Some("nvidia/GLM".to_owned()),
                model_path: Some("/models/glm".to_owned()),
                revision: Some("main".to_owned()),
            },
            hardware: Hardware {
                label: None,
                kind: Some("Discrete GPU".to_owned()),
                gpu: Some("RTX PRO 6000".to_owned()),
                gpu_count: Some(4),
                memory_per_gpu_gb: Some(95.5),
                os: Some("linux".to_owned()),
            },
            engine: Engine {
                name: Some("sglang".to_owned()),
                version: Some("0.5.1".to_owned()),
                quantization: Some("NVFP4".to_owned()),
                backend: Some("cuda".to_owned()),
                repository: Some("github.com/sgl-project/sglang".to_owned()),
                build: Some("cuda-13.2".to_owned()),
                commit: Some("abc123".to_owned()),
            },
            run: RunInfo {
                source: Some(Source::Production),
                benchmark_tool: Some("tokentap v0.1.0".to_owned()),
                decode_test: Some("Fixed duration".to_owned()),
                prefill_mode: Some("Measured during decode warm-up".to_owned()),
                time_per_measurement_s: Some(30.0),
                max_output_tokens: Some(4096),
                sweep_id: Some("s-1".to_owned()),
                window_s: Some(7200.0),
                started_at: Some("2025-06-01T12:00:00Z".to_owned()),
                ended_at: Some("2025-06-01T14:00:00Z".to_owned()),
                shape: None,
            },
            launch_command: None,
            extra_facts: vec![Fact {
                section: SECTION_RUN.to_owned(),
                key: "Seed".to_owned(),
                value: "42".to_owned(),
            }],
            notes: Vec::new(),
        }
    }

    #[test]
    fn page_text_round_trips_through_the_table() {
        let original = every_fact_set();
        let mut read = Metadata::default();
        for section in FACT_SECTIONS {
            for (label, value) in section_facts(&original, section) {
                apply_fact(&mut read, section, &label, &value).unwrap();
            }
        }
        assert_eq!(read, original);
        let vram = section_facts(&original, SECTION_HARDWARE);
        assert!(vram.contains(&("VRAM".to_owned(), "382 GB (4 × 95.5 GB)".to_owned())));
        let run = section_facts(&original, SECTION_RUN);
        assert!(run.contains(&("Max output".to_owned(), "4,096 tokens".to_owned())));
        assert_eq!(
            run.last(),
            Some(&("Seed".to_owned(), "42".to_owned())),
            "extra facts come last"
        );
    }

    /// Every metadata field the page lists is in the table under its JSON path, so a field added
    /// to the document without a fact entry (or a key that names no field) fails here.
    #[test]
    fn table_keys_are_exactly_the_document_fact_fields() {
        let json = serde_json::to_value(every_fact_set()).unwrap();
        let mut paths = Vec::new();
        for group in ["model", "hardware", "engine", "run"] {
            let fields = json[group].as_object().unwrap();
            paths.extend(
                fields
                    .keys()
                    .map(|field| format!("metadata.{group}.{field}")),
            );
        }
        let title_parts = ["metadata.model.display_name", "metadata.hardware.label"];
        let mut expected: Vec<String> = paths
            .into_iter()
            .filter(|path| !title_parts.contains(&path.as_str()))
            .collect();
        let mut keys: Vec<String> = FACTS.iter().map(|field| field.key.to_owned()).collect();
        expected.sort();
        keys.sort();
        assert_eq!(keys, expected);
        for field in FACTS {
            assert!(FACT_SECTIONS.contains(&field.section), "{}", field.key);
            assert_eq!(
                FACTS
                    .iter()
                    .filter(|other| other.section == field.section && other.label == field.label)
                    .count(),
                1,
                "{} is listed twice",
                field.label
            );
        }
    }

    #[test]
    fn unparsable_duplicate_and_inconsistent_facts_are_errors() {
        let mut metadata = Metadata::default();
        assert!(matches!(
            apply_fact(&mut metadata, SECTION_RUN, "Max output", "4096"),
            Err(FactError::Value { .. })
        ));
        apply_fact(&mut metadata, SECTION_RUN, "Window", "60 s").unwrap();
        assert_eq!(
            apply_fact(&mut metadata, SECTION_RUN, "Window", "60 s"),
            Err(FactError::Duplicate {
                key: "Window".to_owned()
            })
        );
        apply_fact(
            &mut metadata,
            SECTION_HARDWARE,
            "VRAM",
            "384 GB (4 × 96 GB)",
        )
        .unwrap();
        assert_eq!(
            apply_fact(&mut metadata, SECTION_HARDWARE, "GPU count", "2"),
            Err(FactError::GpuCountMismatch {
                key: "GPU count".to_owned(),
                vram_count: 4,
                gpu_count: 2
            })
        );
        // A label of one section is an extra fact in another.
        apply_fact(&mut metadata, SECTION_ENGINE, "Window", "x").unwrap();
        assert_eq!(metadata.extra_facts.len(), 1);
    }
}
