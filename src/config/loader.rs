//! The loader: the TOML file, then `TOKENTAP_<SECTION>__<KEY>` environment variables, then
//! flags, merged into one table and read section by section into [`Config`].

use std::path::{Path, PathBuf};

use super::admin::AdminConfig;
use super::capacity::CapacityConfig;
use super::drift::DriftConfig;
use super::error::{ConfigError, Origins};
use super::fingerprint::FingerprintConfig;
use super::metering::MeteringConfig;
use super::proxy::{ListenerTls, ProxyConfig};
use super::raw::RawConfig;
use super::sessions::SessionsConfig;
use super::store::StoreConfig;
use super::sweep::SweepConfig;
use super::telemetry::TelemetryConfig;
use super::tenants::TenantsConfig;
use super::upstream::UpstreamConfig;
use super::workload::WorkloadConfig;
use crate::matrix::evidence::EvidenceRule;

/// Layered configuration source: file, environment, then flags.
#[derive(Debug, Default)]
pub struct ConfigLoader {
    table: toml::Table,
    origins: Origins,
}

impl ConfigLoader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads a TOML file as the base layer.
    pub fn file(mut self, path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        self.table = toml::from_str(&text).map_err(|source| ConfigError::Syntax {
            path: path.to_path_buf(),
            source,
        })?;
        self.origins.file = Some(path.to_path_buf());
        Ok(self)
    }

    /// Parses TOML text as the base layer (tests, embedded defaults).
    pub fn text(self, text: &str, name: &str) -> Result<Self, ConfigError> {
        let table = toml::from_str(text).map_err(|source| ConfigError::Syntax {
            path: PathBuf::from(name),
            source,
        })?;
        Ok(self.base(table, name))
    }

    /// A table as the base layer, named in errors as a file would be (a command's own
    /// configuration, built as a value: `tokentap demo`'s).
    pub fn base(mut self, table: toml::Table, name: &str) -> Self {
        self.table = table;
        self.origins.file = Some(PathBuf::from(name));
        self
    }

    /// Applies `TOKENTAP_<SECTION>__<KEY>=value` overrides from `vars`. The value is read as a
    /// TOML value when it parses as one (numbers, booleans, arrays), else as a string.
    ///
    /// Only names with a `__` after the prefix are tokentap's: the environment is shared, and
    /// other `TOKENTAP_*` names belong to someone else (`TOKENTAP_BIN` in a script, the
    /// `TOKENTAP_SERVICE_HOST` / `TOKENTAP_PORT_8000_TCP` service links Kubernetes injects for a
    /// Service named `tokentap`, `TOKENTAP_ADMIN_TOKEN` in a compose `.env`), so they are ignored.
    /// A name of tokentap's form that is malformed (`TOKENTAP__KEY`, `TOKENTAP_A__B__C`) is an
    /// error, and an unknown section or key fails at [`ConfigLoader::load`], naming the variable.
    pub fn env(
        mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        for (var, value) in vars {
            let Some((section, key)) = tokentap_key(&var) else {
                continue;
            };
            if section.is_empty() || key.is_empty() || key.contains("__") {
                return Err(ConfigError::Env {
                    var,
                    message:
                        "expected exactly one section and one key, e.g. TOKENTAP_UPSTREAM__URL"
                            .into(),
                });
            }
            let section = section.to_ascii_lowercase();
            let key = key.to_ascii_lowercase();
            let origin = format!("environment variable {var}");
            let value = scalar_for(&section, &key, &value);
            self.set(&section, &key, value, origin);
        }
        Ok(self)
    }

    /// [`ConfigLoader::env`] over the process environment, which may hold names and values that
    /// are not UTF-8 (`std::env::vars` would panic on them). Such variables are skipped unless
    /// they are of tokentap's form, which is then an error naming the variable.
    pub fn process_env(self) -> Result<Self, ConfigError> {
        let mut vars = Vec::new();
        for (name, value) in std::env::vars_os() {
            match (name.into_string(), value.into_string()) {
                (Ok(name), Ok(value)) => vars.push((name, value)),
                (name, _) => {
                    let name = match name {
                        Ok(name) => name,
                        Err(name) => name.to_string_lossy().into_owned(),
                    };
                    if tokentap_key(&name).is_some() {
                        return Err(ConfigError::Env {
                            var: name,
                            message: "its name or value is not UTF-8".into(),
                        });
                    }
                }
            }
        }
        self.env(vars)
    }

    /// Applies `--set SECTION.KEY=VALUE` flags, in order (a later one wins). The value is read
    /// as the environment layer reads it: a TOML value when it parses as one (numbers, booleans,
    /// arrays), else a string. Any key of a `[section]` can be set this way; the `[[upstreams]]`
    /// list cannot (use the file). An unknown key fails at [`ConfigLoader::load`], naming the
    /// flag.
    pub fn set_args(mut self, args: &[String]) -> Result<Self, ConfigError> {
        for arg in args {
            // The error shows what comes before `=` only: the value may be a secret.
            let malformed = |message: &str| ConfigError::Set {
                arg: arg.split('=').next().unwrap_or("").to_owned(),
                message: message.to_owned(),
            };
            let (path, value) = arg.split_once('=').ok_or_else(|| {
                malformed("expected SECTION.KEY=VALUE, e.g. --set proxy.listen=0.0.0.0:8100")
            })?;
            let path = path.trim();
            let (section, key) = path
                .split_once('.')
                .filter(|(s, k)| !s.is_empty() && !k.is_empty() && !k.contains('.'))
                .ok_or_else(|| {
                    malformed("expected one section and one key before `=`, e.g. proxy.listen")
                })?;
            let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
            let value = scalar_for(&section, &key, value.trim());
            self.set(&section, &key, value, format!("flag --set {path}"));
        }
        Ok(self)
    }

    /// Sets one key from a command-line flag.
    pub fn flag(mut self, section: &str, key: &str, value: toml::Value, flag: &str) -> Self {
        self.set(section, key, value, format!("flag {flag}"));
        self
    }

    fn set(&mut self, section: &str, key: &str, value: toml::Value, origin: String) {
        let entry = self
            .table
            .entry(section.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        if let toml::Value::Table(table) = entry {
            table.insert(key.to_string(), value);
        }
        self.origins
            .overridden
            .insert(format!("{section}.{key}"), origin);
    }

    /// Deserialises and validates.
    pub fn load(self) -> Result<Config, ConfigError> {
        let origins = self.origins;
        let raw: RawConfig = serde_path_to_error::deserialize(toml::Value::Table(self.table))
            .map_err(|error| {
                let key = error.path().to_string();
                let mut message = error.inner().message().to_string();
                if message.contains("expected a sequence") {
                    message.push_str(&list_form(&key));
                }
                origins.error(&key, message)
            })?;
        Config::from_raw(raw, &origins)
    }
}

/// `(SECTION, KEY)` of a `TOKENTAP_<SECTION>__<KEY>` name (either may be empty or hold a further
/// `__`: the caller rejects those); `None` for any other name, which is not tokentap's.
fn tokentap_key(var: &str) -> Option<(&str, &str)> {
    let rest = var.strip_prefix("TOKENTAP_")?;
    match rest.strip_prefix('_') {
        // `TOKENTAP__KEY`: the `__` follows the prefix's own underscore, the section is empty.
        Some(key) => Some(("", key)),
        None => rest.split_once("__"),
    }
}

/// How a list-valued key is written outside the file: `a,b` is one string to TOML, so the form
/// that works is shown with the key's own name.
fn list_form(key: &str) -> String {
    let env = key.replace('.', "__").to_ascii_uppercase();
    format!(
        "; write a list as TOML, quoted for the shell: --set {key}='[\"a\", \"b\"]', or TOKENTAP_{env}='[\"a\", \"b\"]', or `{}` in the file",
        key.rsplit('.').next().unwrap_or(key).to_owned() + " = [\"a\", \"b\"]"
    )
}

/// Keys whose value is text whatever it looks like: a secret made of digits (`123…`, `0x…`,
/// `1e9`) read as a TOML number would be refused as "not a string", or lose its leading zeros.
const VERBATIM: [(&str, &str); 1] = [("admin", "token")];

/// A `--set` or environment value for `section.key`: [`parse_scalar`]'s reading, or the text
/// as it came for a [`VERBATIM`] key.
fn scalar_for(section: &str, key: &str, value: &str) -> toml::Value {
    if VERBATIM.contains(&(section, key)) {
        toml::Value::String(value.to_string())
    } else {
        parse_scalar(value)
    }
}

fn parse_scalar(value: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_string()))
}

/// Validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub proxy: ProxyConfig,
    pub upstreams: Vec<UpstreamConfig>,
    pub admin: AdminConfig,
    pub metering: MeteringConfig,
    pub telemetry: TelemetryConfig,
    pub store: StoreConfig,
    pub sweep: SweepConfig,
    pub drift: DriftConfig,
    /// `[evidence]`: what a production cell must rest on (`matrix::evidence`).
    pub evidence: EvidenceRule,
    /// `[capacity]`: live headroom (`aggregate::headroom`).
    pub capacity: CapacityConfig,
    pub workload: WorkloadConfig,
    /// `[sessions]`: which requests are turns of one conversation (`meter::conversation`).
    pub sessions: SessionsConfig,
    /// `[fingerprint]`: each upstream's configuration, read in the background.
    pub fingerprint: FingerprintConfig,
    /// `[tenants]`: who a request is counted under (`proxy::tenants`).
    pub tenants: TenantsConfig,
}

impl Config {
    /// The defaults, as if no file, variable or flag were given.
    pub fn defaults() -> Result<Self, ConfigError> {
        ConfigLoader::new().load()
    }

    /// Each section validated beside its type, in the order of the file, then the rules
    /// between sections (none today: each section's checks are its own).
    fn from_raw(raw: RawConfig, origins: &Origins) -> Result<Self, ConfigError> {
        let tls = ListenerTls::from_raw(raw.tls, origins)?;
        let proxy = ProxyConfig::from_raw(raw.proxy, tls, origins)?;
        let upstreams = super::upstream::upstreams(raw.upstream, raw.upstreams, origins)?;
        let admin = AdminConfig::from_raw(raw.admin, origins)?;
        let metering = MeteringConfig::from_raw(raw.metering, &raw.slo, origins)?;
        let telemetry = TelemetryConfig::from_raw(raw.telemetry, origins)?;
        let store = StoreConfig::from_raw(raw.store, origins)?;
        let sweep = SweepConfig::from_raw(raw.sweep, origins)?;
        let evidence = super::drift::evidence_rule(raw.evidence);
        let capacity = CapacityConfig::from_raw(raw.capacity, origins)?;
        let drift = DriftConfig::from_raw(raw.drift, evidence, origins)?;
        let workload = WorkloadConfig::from_raw(raw.workload, origins)?;
        let sessions = SessionsConfig::from_raw(raw.sessions, origins)?;
        let fingerprint = FingerprintConfig::from_raw(raw.fingerprint, origins)?;
        let tenants = TenantsConfig::from_raw(raw.tenants, origins)?;
        Ok(Config {
            proxy,
            upstreams,
            admin,
            metering,
            telemetry,
            store,
            sweep,
            drift,
            evidence,
            capacity,
            workload,
            sessions,
            fingerprint,
            tenants,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::duration::parse_duration;
    use crate::config::UsageUnasked;
    use std::time::Duration;

    #[test]
    fn the_documented_example_parses_and_matches_the_defaults() {
        let text = include_str!("../../config/tokentap.toml");
        let from_file = ConfigLoader::new()
            .text(text, "config/tokentap.toml")
            .unwrap()
            .load()
            .unwrap();
        let defaults = Config::defaults().unwrap();
        assert_eq!(from_file, defaults);
        // The comparison sees the values the file sets: one changed value makes them differ.
        let changed = text.replacen("max_connections = 0", "max_connections = 4095", 1);
        assert_ne!(changed, text, "the example sets proxy.max_connections");
        let from_changed = ConfigLoader::new()
            .text(&changed, "changed.toml")
            .unwrap()
            .load()
            .unwrap();
        assert_ne!(from_changed, defaults);
    }

    #[test]
    fn server_timing_says_when_and_its_header_must_be_a_header_name() {
        use crate::config::ServerTiming;
        let load = |text: &str| {
            ConfigLoader::new()
                .text(&format!("[metering]\n{text}\n"), "x.toml")
                .and_then(ConfigLoader::load)
                .map(|config| config.metering)
                .map_err(|e| e.to_string())
        };
        let defaults = load("").unwrap();
        assert_eq!(defaults.server_timing, ServerTiming::Off);
        assert_eq!(defaults.server_timing_header, "x-tokentap-timing");
        let asked =
            load("server_timing = \"on_request\"\nserver_timing_header = \"X-Timing\"").unwrap();
        assert_eq!(asked.server_timing, ServerTiming::OnRequest);
        assert_eq!(asked.server_timing_header, "x-timing");
        assert_eq!(
            load("server_timing = \"always\"").unwrap().server_timing,
            ServerTiming::Always
        );
        let error = load("server_timing = \"yes\"").unwrap_err();
        assert!(
            error.contains("metering.server_timing") && error.contains("on_request"),
            "{error}"
        );
        let error = load("server_timing_header = \"two words\"").unwrap_err();
        assert!(error.contains("metering.server_timing_header"), "{error}");
    }

    #[test]
    fn usage_unasked_says_which_usage_and_yes_means_every_chunk() {
        let parse = |value: &str| {
            ConfigLoader::new()
                .text(
                    &format!("[upstream]\nsends_usage_unasked = \"{value}\"\n"),
                    "x.toml",
                )
                .and_then(ConfigLoader::load)
                .map(|config| config.upstreams.first().map(|u| u.sends_usage_unasked))
        };
        assert_eq!(parse("final").unwrap(), Some(UsageUnasked::Final));
        assert_eq!(
            parse("every_chunk").unwrap(),
            Some(UsageUnasked::EveryChunk)
        );
        assert_eq!(parse("yes").unwrap(), Some(UsageUnasked::EveryChunk));
        assert_eq!(parse("no").unwrap(), Some(UsageUnasked::No));
        let error = parse("sometimes").unwrap_err().to_string();
        assert!(error.contains("sends_usage_unasked"), "{error}");
    }

    #[test]
    fn slo_objectives_default_per_model_and_out_of_range() {
        let load = |text: &str| {
            ConfigLoader::new()
                .text(text, "x.toml")
                .and_then(ConfigLoader::load)
                .map(|config| config.metering.objectives)
        };
        let defaults = load("").unwrap();
        assert_eq!(defaults.of("any"), 0.99);
        let set = load("[slo]\nobjective = 0.999\n[slo.models.\"m\"]\nobjective = 0.995\n[slo.models.\"n\"]\nttft = \"1s\"\n").unwrap();
        assert_eq!(set.of("m"), 0.995);
        assert_eq!(
            set.of("n"),
            0.999,
            "a table without one takes [slo] objective"
        );
        assert_eq!(set.of("other"), 0.999);
        for (text, key) in [
            ("[slo]\nobjective = 0.9\n", "slo.objective"),
            ("[slo]\nobjective = 1.0\n", "slo.objective"),
            (
                "[slo.models.\"m\"]\nobjective = 0.5\n",
                "slo.models.\"m\".objective",
            ),
        ] {
            let error = load(text).unwrap_err().to_string();
            assert!(error.contains(key), "{error}");
            assert!(error.contains("between 0.95 and 0.99999"), "{error}");
        }
    }

    #[test]
    fn unknown_keys_name_the_key_and_origin() {
        let error = ConfigLoader::new()
            .text("[proxy]\nlisen = \"1.2.3.4:5\"\n", "x.toml")
            .unwrap()
            .load()
            .unwrap_err()
            .to_string();
        assert!(error.contains("proxy"), "{error}");
        assert!(error.contains("lisen"), "{error}");
        let error = ConfigLoader::new()
            .env([("TOKENTAP_PROXY__NOPE".to_string(), "1".to_string())])
            .unwrap()
            .load()
            .unwrap_err()
            .to_string();
        assert!(error.contains("nope"), "{error}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let cases = [
            ("TOKENTAP_PROXY__LISTEN", "nowhere", "proxy.listen"),
            ("TOKENTAP_UPSTREAM__URL", "ftp://x", "upstream.url"),
            (
                "TOKENTAP_PROXY__SHUTDOWN_GRACE",
                "10 parsecs",
                "proxy.shutdown_grace",
            ),
            (
                "TOKENTAP_METERING__CONTEXT_BUCKETS",
                "[16, 8]",
                "metering.context_buckets",
            ),
            ("TOKENTAP_ADMIN__LISTEN", "0.0.0.0:9464", "admin.token"),
            (
                "TOKENTAP_METERING__MAX_EVENT_BYTES",
                "\"lots\"",
                "metering.max_event_bytes",
            ),
        ];
        for (var, value, key) in cases {
            let error = ConfigLoader::new()
                .env([(var.to_string(), value.to_string())])
                .unwrap()
                .load()
                .unwrap_err()
                .to_string();
            assert!(error.contains(key), "{var}={value}: {error}");
            if key != "admin.token" {
                assert!(error.contains(var), "{var}={value}: {error}");
            }
        }
        for malformed in [
            "TOKENTAP__LISTEN",
            "TOKENTAP_PROXY__",
            "TOKENTAP_PROXY__LISTEN__X",
        ] {
            let error = ConfigLoader::new()
                .env([(malformed.to_string(), "x".to_string())])
                .unwrap_err()
                .to_string();
            assert!(error.contains(malformed), "{error}");
        }
    }

    #[test]
    fn other_tokentap_variables_are_not_ours() {
        // Kubernetes' service links for a Service `tokentap` with ports `proxy` and `metrics`,
        // a compose `.env` name and a script's own variable: none is a key, none is an error.
        let foreign = [
            ("TOKENTAP_SERVICE_HOST", "10.0.0.7"),
            ("TOKENTAP_SERVICE_PORT", "8000"),
            ("TOKENTAP_SERVICE_PORT_PROXY", "8000"),
            ("TOKENTAP_SERVICE_PORT_METRICS", "9464"),
            ("TOKENTAP_PORT", "tcp://10.0.0.7:8000"),
            ("TOKENTAP_PORT_8000_TCP", "tcp://10.0.0.7:8000"),
            ("TOKENTAP_PORT_8000_TCP_PROTO", "tcp"),
            ("TOKENTAP_PORT_8000_TCP_PORT", "8000"),
            ("TOKENTAP_PORT_8000_TCP_ADDR", "10.0.0.7"),
            ("TOKENTAP_ADMIN_TOKEN", "not-this-one"),
            ("TOKENTAP_BIN", "/usr/local/bin/tokentap"),
            ("TOKENTAP_PROXY", "x"),
        ];
        let config = ConfigLoader::new()
            .env(foreign.map(|(k, v)| (k.to_string(), v.to_string())))
            .unwrap()
            .load()
            .unwrap();
        let defaults = ConfigLoader::new().load().unwrap();
        assert_eq!(config.proxy.listen, defaults.proxy.listen);
        assert_eq!(
            config.admin.token, None,
            "TOKENTAP_ADMIN_TOKEN is not admin.token"
        );
        // The same names beside a real key: the key still applies.
        let config = ConfigLoader::new()
            .env(
                foreign
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into_iter()
                    .chain([(
                        "TOKENTAP_ADMIN__TOKEN".to_string(),
                        "a-long-enough-admin-token".to_string(),
                    )]),
            )
            .unwrap()
            .load()
            .unwrap();
        assert!(config.admin.token.is_some());
    }

    #[test]
    fn an_admin_token_of_digits_stays_text_and_a_short_one_is_refused() {
        for (via_env, value) in [
            (true, "0123456789012345678901"),
            (false, "1e40000000000000"),
        ] {
            let loader = ConfigLoader::new();
            let loader = if via_env {
                loader.env([("TOKENTAP_ADMIN__TOKEN".to_string(), value.to_string())])
            } else {
                loader.set_args(&[format!("admin.token={value}")])
            };
            let config = loader.unwrap().load().unwrap();
            assert_eq!(
                config.admin.token.as_deref(),
                Some(value),
                "leading zeros and all"
            );
        }
        let short = ConfigLoader::new()
            .env([("TOKENTAP_ADMIN__TOKEN".to_string(), "change-me".to_string())])
            .unwrap()
            .load()
            .unwrap_err()
            .to_string();
        assert!(
            short.contains("admin.token") && short.contains("at least 16"),
            "{short}"
        );
    }

    #[test]
    fn layers_override_in_order() {
        let config = ConfigLoader::new()
            .text(
                "[upstream]\nurl = \"http://10.0.0.1:1\"\n[proxy]\nlisten = \"127.0.0.1:1\"\n",
                "f",
            )
            .unwrap()
            .env([(
                "TOKENTAP_PROXY__LISTEN".to_string(),
                "127.0.0.1:2".to_string(),
            )])
            .unwrap()
            .flag(
                "upstream",
                "url",
                toml::Value::String("http://10.0.0.3:3".into()),
                "--upstream",
            )
            .load()
            .unwrap();
        assert_eq!(config.proxy.listen.port(), 2);
        assert_eq!(config.upstreams[0].url.port_u16(), Some(3));
    }

    #[test]
    fn a_bare_zero_is_a_duration_from_any_layer() {
        let config = ConfigLoader::new()
            .text("[upstream]\nresponse_timeout = 0\n", "f")
            .unwrap()
            .env([("TOKENTAP_STORE__RETENTION".to_string(), "0".to_string())])
            .unwrap()
            .load()
            .unwrap();
        assert!(config.upstreams[0].response_timeout.is_zero());
        assert!(config.store.retention.is_zero());
        let error = ConfigLoader::new()
            .env([(
                "TOKENTAP_PROXY__SHUTDOWN_GRACE".to_string(),
                "5".to_string(),
            )])
            .unwrap()
            .load()
            .unwrap_err()
            .to_string();
        assert!(error.contains("no unit"), "{error}");
    }

    #[test]
    fn slo_targets_per_model_and_from_the_environment() {
        let ms = Duration::from_millis;
        let config = ConfigLoader::new()
            .text(
                "[slo]\nttft = \"2s\"\n[slo.models.\"a/b\"]\ntbt = \"30ms\"\n[slo.models.exempt]\n",
                "x.toml",
            )
            .unwrap()
            .env([("TOKENTAP_SLO__E2E".to_string(), "1m".to_string())])
            .unwrap()
            .load()
            .unwrap();
        let slo = &config.metering.slo;
        assert_eq!(slo.default.ttft, Some(ms(2000)));
        assert_eq!(slo.default.e2e, Some(ms(60_000)));
        let model = slo.for_model(Some("a/b"));
        assert_eq!(
            (model.ttft, model.tbt, model.e2e),
            (None, Some(ms(30)), None)
        );
        assert!(!slo.for_model(Some("exempt")).is_set());
        assert_eq!(slo.for_model(Some("other")), slo.default);
        // Off by default.
        assert!(!Config::defaults().unwrap().metering.slo.default.is_set());
        for (text, key) in [
            ("[slo]\nttft = \"0ms\"\n", "slo.ttft"),
            ("[slo]\ntbt = \"fast\"\n", "slo.tbt"),
            ("[slo.models.m]\ne2e = \"5\"\n", "slo.models.\"m\".e2e"),
        ] {
            let error = ConfigLoader::new()
                .text(text, "x.toml")
                .unwrap()
                .load()
                .unwrap_err()
                .to_string();
            assert!(error.contains(key), "{text}: {error}");
        }
        let error = ConfigLoader::new()
            .text("[slo]\nlatency = \"1s\"\n", "x.toml")
            .unwrap()
            .load()
            .unwrap_err()
            .to_string();
        assert!(error.contains("latency"), "{error}");
    }

    #[test]
    fn set_flags_override_the_file_and_name_themselves_in_errors() {
        let config = ConfigLoader::new()
            .text("[proxy]\nlisten = \"127.0.0.1:8000\"\n", "t.toml")
            .unwrap()
            .set_args(&[
                "proxy.listen=127.0.0.1:8100".to_owned(),
                "admin.max_sessions=3".to_owned(),
                "upstream.metrics_interval = 0".to_owned(),
            ])
            .unwrap()
            .load()
            .unwrap();
        assert_eq!(config.proxy.listen.port(), 8100);
        assert_eq!(config.admin.max_sessions, 3);
        assert!(config.upstreams[0].metrics_interval.is_zero());
        let unknown = ConfigLoader::new()
            .set_args(&["proxy.lisen=x".to_owned()])
            .unwrap()
            .load()
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("flag --set proxy.lisen"), "{unknown}");
        // A list is TOML: `a,b` is one string, and the error shows the form that works.
        let list = ConfigLoader::new()
            .set_args(&["tenants.allow=a,b".to_owned()])
            .unwrap()
            .load()
            .unwrap_err()
            .to_string();
        assert!(
            list.contains("flag --set tenants.allow")
                && list.contains(r#"--set tenants.allow='["a", "b"]'"#)
                && list.contains(r#"TOKENTAP_TENANTS__ALLOW='["a", "b"]'"#),
            "{list}"
        );
        let config = ConfigLoader::new()
            .set_args(&[
                r#"tenants.allow=["a", "b"]"#.to_owned(),
                "tenants.header=x-t".to_owned(),
            ])
            .unwrap()
            .load()
            .unwrap();
        let allowed: Vec<&str> = config.tenants.allow.iter().map(|a| &**a).collect();
        assert_eq!(allowed, ["a", "b"]);
        for (bad, shown) in [
            ("proxy.listen", "proxy.listen"),
            ("listen=1", "listen"),
            ("a.b.c=secret", "a.b.c"),
            (".x=1", ".x"),
        ] {
            let error = ConfigLoader::new()
                .set_args(&[bad.to_owned()])
                .unwrap_err()
                .to_string();
            assert!(error.starts_with(&format!("--set {shown}:")), "{error}");
            assert!(!error.contains("secret"), "{error}");
        }
    }

    /// Every error message, word for word, from each layer: the typed raw values and the
    /// per-section checks must say what the one `from_raw` said.
    #[test]
    fn error_messages_word_for_word() {
        let file = |text: &str| {
            ConfigLoader::new()
                .text(text, "x.toml")
                .and_then(ConfigLoader::load)
                .map_or_else(|e| e.to_string(), |_| "accepted".to_owned())
        };
        let env = |var: &str, value: &str| {
            ConfigLoader::new()
                .env([(var.to_owned(), value.to_owned())])
                .and_then(ConfigLoader::load)
                .map_or_else(|e| e.to_string(), |_| "accepted".to_owned())
        };
        let set = |arg: &str| {
            ConfigLoader::new()
                .set_args(&[arg.to_owned()])
                .and_then(ConfigLoader::load)
                .map_or_else(|e| e.to_string(), |_| "accepted".to_owned())
        };
        let cases: Vec<(String, &str)> = vec![
            (file("[proxy]\nshutdown_grace = \"10 parsecs\"\n"), "config file x.toml: key `proxy.shutdown_grace`: unknown unit `parsecs` in `10 parsecs`: use ms, s, m, h or d"),
            (env("TOKENTAP_PROXY__SHUTDOWN_GRACE", "5"), "environment variable TOKENTAP_PROXY__SHUTDOWN_GRACE: key `proxy.shutdown_grace`: `5` has no unit: write e.g. 500ms, 30s, 5m, 1h or 7d"),
            (set("upstream.connect_timeout=fast"), "flag --set upstream.connect_timeout: key `upstream.connect_timeout`: `fast` is not a duration: write e.g. 500ms, 30s, 5m, 1h or 7d"),
            (file("[proxy]\nshutdown_grace = true\n"), "config file x.toml: key `proxy.shutdown_grace`: invalid type: boolean `true`, expected a duration such as 500ms, 30s or 5m"),
            (file("[proxy]\nshutdown_grace = 1.5\n"), "config file x.toml: key `proxy.shutdown_grace`: `1.5` has no unit: write e.g. 500ms, 30s, 5m, 1h or 7d"),
            (set("proxy.shutdown_grace=5"), "flag --set proxy.shutdown_grace: key `proxy.shutdown_grace`: `5` has no unit: write e.g. 500ms, 30s, 5m, 1h or 7d"),
            (file("[store]\nretention = \"1e999h\"\n"), "config file x.toml: key `store.retention`: unknown unit `e999h` in `1e999h`: use ms, s, m, h or d"),
            (env("TOKENTAP_PROXY__LISTEN", "nowhere"), "environment variable TOKENTAP_PROXY__LISTEN: key `proxy.listen`: `nowhere` is not an address like 127.0.0.1:8000: invalid socket address syntax"),
            (file("[admin]\nlisten = 5\n"), "config file x.toml: key `admin.listen`: invalid type: integer `5`, expected a string"),
            (env("TOKENTAP_UPSTREAM__URL", "ftp://x"), "environment variable TOKENTAP_UPSTREAM__URL: key `upstream.url`: `ftp://x` must be an http:// or https:// URL with a host"),
            (file("[upstream]\nurl = \"http://user:secret@exa mple\"\n"), "config file x.toml: key `upstream.url`: `http://***@exa mple` is not a URL: invalid uri character"),
            (file("[upstream]\nurl = \"http://x/?a=1\"\n"), "config file x.toml: key `upstream.url`: must not have a query string"),
            (file("[upstream]\nurl = 5\n"), "config file x.toml: key `upstream.url`: invalid type: integer `5`, expected a string"),
            (file("[[upstreams]]\nname = \"b\"\nurl = \"ftp://y\"\nmodels = [\"m\"]\n"), "config file x.toml: key `upstreams[0].url`: `ftp://y` must be an http:// or https:// URL with a host"),
            (file("[[upstreams]]\nname = \"b\"\nmodels = [\"m\"]\nconnect_timeout = \"1y\"\n"), "config file x.toml: key `upstreams[0].connect_timeout`: unknown unit `y` in `1y`: use ms, s, m, h or d"),
            (file("[[upstreams]]\nname = \"b\"\n"), "config file x.toml: key `upstreams[0].models`: an extra upstream needs `models` or `path_prefix` to be chosen"),
            (file("[[upstreams]]\nname = \"default\"\nmodels = [\"m\"]\n"), "config file x.toml: key `upstreams[0].name`: `default` is used twice"),
            (file("[upstream]\nmodels = [\"m\"]\n"), "config file x.toml: key `upstream.models`: the default [upstream] takes every request no other upstream claims; put `models` and `path_prefix` on [[upstreams]] entries"),
            (file("[[upstreams]]\nname = \"b\"\npath_prefix = \"/a/\"\n"), "config file x.toml: key `upstreams[0].path_prefix`: `/a/` must start with / and not end with /"),
            (file("[upstream]\ntls_client_cert = \"c\"\n"), "config file x.toml: key `upstream.tls_client_cert`: tls_client_cert and tls_client_key go together"),
            (file("[upstream]\ntls_ca = \"c\"\n"), "config file x.toml: key `upstream.tls_ca`: TLS settings need an https:// url"),
            (file("[upstream]\nname = \"\"\n"), "config file x.toml: key `upstream.name`: must be 1 to 64 characters"),
            (file("[upstream]\nmetrics_path = \"metrics\"\n"), "config file x.toml: key `upstream.metrics_path`: `metrics` must be a path starting with /"),
            (env("TOKENTAP_UPSTREAM__SENDS_USAGE_UNASKED", "sometimes"), "environment variable TOKENTAP_UPSTREAM__SENDS_USAGE_UNASKED: key `upstream.sends_usage_unasked`: `sometimes` must be \"auto\", \"final\", \"every_chunk\", \"yes\" or \"no\""),
            (env("TOKENTAP_UPSTREAM__SENDS_USAGE_UNASKED", "true"), "environment variable TOKENTAP_UPSTREAM__SENDS_USAGE_UNASKED: key `upstream.sends_usage_unasked`: invalid type: boolean `true`, expected a string"),
            (env("TOKENTAP_TELEMETRY__OTLP_ENDPOINT", "grpc://collector:4317"), "environment variable TOKENTAP_TELEMETRY__OTLP_ENDPOINT: key `telemetry.otlp_endpoint`: `grpc://collector:4317` must be an http:// or https:// URL with a host"),
            (env("TOKENTAP_TELEMETRY__METRIC_INTERVAL", "0"), "environment variable TOKENTAP_TELEMETRY__METRIC_INTERVAL: key `telemetry.metric_interval`: must be greater than zero"),
            (env("TOKENTAP_TELEMETRY__MAX_SERIES", "0"), "environment variable TOKENTAP_TELEMETRY__MAX_SERIES: key `telemetry.max_series`: must be greater than zero"),
            (file("[capacity]\nbasis = \"p42\"\n"), "config file x.toml: key `capacity.basis`: `p42`: expected auto, attainment, median, p90 or p99"),
            (file("[capacity]\nwindow = \"30s\"\n"), "config file x.toml: key `capacity.window`: must lie between 1m and 24h"),
            (env("TOKENTAP_PROXY__WORKERS", "5000"), "environment variable TOKENTAP_PROXY__WORKERS: key `proxy.workers`: at most 1024 (0: the shared runtime)"),
            (file("[capacity]\nattainment = 1.5\n"), "config file x.toml: key `capacity.attainment`: must lie in (0, 1], found 1.5"),
            (file("[slo.models.m]\ne2e = \"5\"\n"), "config file x.toml: key `slo.models.\"m\".e2e`: `5` has no unit: write e.g. 500ms, 2s or 1m"),
            (file("[slo]\nttft = 500\n"), "config file x.toml: key `slo.ttft`: `500` has no unit: write e.g. 500ms, 2s or 1m"),
            (set("slo.ttft=500"), "flag --set slo.ttft: key `slo.ttft`: `500` has no unit: write e.g. 500ms, 2s or 1m"),
            (env("TOKENTAP_SLO__TTFT", "500"), "environment variable TOKENTAP_SLO__TTFT: key `slo.ttft`: `500` has no unit: write e.g. 500ms, 2s or 1m"),
            (file("[slo.models.m]\ntbt = 0.5\n"), "config file x.toml: key `slo.models.\"m\".tbt`: `0.5` has no unit: write e.g. 500ms, 2s or 1m"),
            (file("[slo]\nttft = true\n"), "config file x.toml: key `slo.ttft`: invalid type: boolean `true`, expected a duration such as 500ms, 30s or 5m"),
            (file("[slo]\nttft = \"500x\"\n"), "config file x.toml: key `slo.ttft`: `500x` is not a positive duration like 500ms, 2s or 1m"),
            (file("[slo]\nttft = \"0ms\"\n"), "config file x.toml: key `slo.ttft`: `0ms` is not a positive duration like 500ms, 2s or 1m"),
            (file("[proxy]\nbody_idle_timeout = 0\n"), "config file x.toml: key `proxy.body_idle_timeout`: must be greater than zero"),
            (file("[proxy]\nheader_read_timeout = \"0s\"\n"), "config file x.toml: key `proxy.header_read_timeout`: must be greater than zero"),
            (file("[proxy]\nmax_stream_buffer = 100\n"), "config file x.toml: key `proxy.max_stream_buffer`: must lie between 8192 and 16777216 bytes"),
            (file("[proxy]\nmax_header_bytes = 100\n"), "config file x.toml: key `proxy.max_header_bytes`: must be at least 8192 (hyper's minimum)"),
            (file("[proxy]\nmax_header_bytes = 0\n"), "config file x.toml: key `proxy.max_header_bytes`: must be greater than zero"),
            (file("[proxy]\nhttp2_max_concurrent_streams = 5000000000\n"), "config file x.toml: key `proxy.http2_max_concurrent_streams`: too large"),
            (file("[proxy]\nhttp2_keep_alive_timeout = 0\n"), "config file x.toml: key `proxy.http2_keep_alive_timeout`: must be greater than zero while pings are on"),
            (file("[tls]\ncert = \"c\"\n"), "config file x.toml: key `tls.key`: tls.cert is set, tls.key is missing"),
            (file("[tls]\nkey = \"k\"\n"), "config file x.toml: key `tls.cert`: tls.key is set, tls.cert is missing"),
            (file("[tls]\nclient_ca = \"a\"\n"), "config file x.toml: key `tls.client_ca`: needs tls.cert and tls.key"),
            (file("[admin]\nlisten = \"0.0.0.0:9464\"\n"), "config file x.toml: key `admin.token`: the admin listener 0.0.0.0:9464 is not on loopback, so it needs a bearer token (set admin.token or TOKENTAP_ADMIN__TOKEN)"),
            (file("[admin]\nsession_ttl = 0\n"), "config file x.toml: key `admin.session_ttl`: must be greater than zero"),
            (file("[admin]\nmax_sessions = 0\n"), "config file x.toml: key `admin.max_sessions`: must be greater than zero"),
            (file("[metering]\ncontext_buckets = [16, 8]\n"), "config file x.toml: key `metering.context_buckets`: values must be strictly increasing"),
            (env("TOKENTAP_METERING__MAX_EVENT_BYTES", "\"lots\""), "environment variable TOKENTAP_METERING__MAX_EVENT_BYTES: key `metering.max_event_bytes`: invalid type: string \"lots\", expected u64"),
            (file("[store]\nsnapshot_interval = 0\n"), "config file x.toml: key `store.snapshot_interval`: must be greater than zero"),
            (file("[store]\nretention = \"x\"\n"), "config file x.toml: key `store.retention`: `x` is not a duration: write e.g. 500ms, 30s, 5m, 1h or 7d"),
            (file("[sweep]\ncell_duration = 0\n"), "config file x.toml: key `sweep.cell_duration`: must be greater than zero"),
            (file("[sweep]\nmax_output = 0\n"), "config file x.toml: key `sweep.max_output`: must be greater than zero"),
            (file("[evidence]\nmin_measured_for = \"ten\"\n"), "config file x.toml: key `evidence.min_measured_for`: `ten` is not a duration: write e.g. 500ms, 30s, 5m, 1h or 7d"),
            (file("[drift]\nwindow = \"25h\"\n"), "config file x.toml: key `drift.window`: must lie between 1m and 24h"),
            (file("[drift]\nrefresh_interval = 0\n"), "config file x.toml: key `drift.refresh_interval`: must be greater than zero"),
            (file("[workload]\nmax_age = \"1y\"\n"), "config file x.toml: key `workload.max_age`: unknown unit `y` in `1y`: use ms, s, m, h or d"),
            (file("[workload]\nmax_requests = 0\n"), "config file x.toml: key `workload.max_requests`: must be greater than zero"),
            (file("[sessions]\nkeys = [\"cookie\"]\n"), "config file x.toml: key `sessions.keys`: `cookie` is not a session key: use `header:<name>` or `body:<field>` with a field among prompt_cache_key, session_id, user"),
            (file("[sessions]\nmax_sessions = 2\n"), "config file x.toml: key `sessions.max_sessions`: must be at least 4"),
            (file("[workload]\nmax_exports = 0\n"), "config file x.toml: key `workload.max_exports`: must be greater than zero"),
            (file("[fingerprint]\ninterval = \"500ms\"\n"), "config file x.toml: key `fingerprint.interval`: must be 0 (off) or at least 1s"),
            (file("[fingerprint]\ninterval = \"soon\"\n"), "config file x.toml: key `fingerprint.interval`: `soon` is not a duration: write e.g. 500ms, 30s, 5m, 1h or 7d"),
        ];
        let wrong: Vec<String> = cases
            .iter()
            .filter(|(got, want)| got != want)
            .map(|(got, want)| format!("got  {got:?}\nwant {want:?}"))
            .collect();
        assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5y").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
