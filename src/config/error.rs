//! The configuration's error ([`ConfigError`]: the key, where its value came from, what was
//! wrong) and where each key's value came from ([`Origins`]), which every section's checks use.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// A configuration error, naming the key and the reason. The file errors keep their cause as
/// the error's source, not in their own text (the CLI prints the chain, which would say it
/// twice).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML")]
    Syntax {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{origin}: key `{key}`: {message}")]
    Key {
        key: String,
        origin: String,
        message: String,
    },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    #[error("--set {arg}: {message}")]
    Set { arg: String, message: String },
}

/// Where a key's value came from, for error messages.
#[derive(Debug, Clone, Default)]
pub struct Origins {
    pub(super) file: Option<PathBuf>,
    /// key path → description ("environment variable X", "flag --y").
    pub(super) overridden: BTreeMap<String, String>,
}

impl Origins {
    pub(super) fn describe(&self, key: &str) -> String {
        if let Some(origin) = self.overridden.get(key) {
            return origin.clone();
        }
        // An error on a section (`upstreams`) blames the override that created it, if any.
        if let Some((_, origin)) = self
            .overridden
            .iter()
            .find(|(k, _)| k.split('.').next() == Some(key))
        {
            return origin.clone();
        }
        match &self.file {
            Some(path) => format!("config file {}", path.display()),
            None => "configuration".to_string(),
        }
    }

    pub(super) fn error(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Key {
            key: key.to_string(),
            origin: self.describe(key),
            message: message.into(),
        }
    }

    /// A count that must be above zero, as a `usize`.
    pub(super) fn nonzero(&self, key: &str, value: u64) -> Result<usize, ConfigError> {
        if value == 0 {
            return Err(self.error(key, "must be greater than zero"));
        }
        self.size(key, value)
    }

    /// A count as a `usize`.
    pub(super) fn size(&self, key: &str, value: u64) -> Result<usize, ConfigError> {
        usize::try_from(value).map_err(|_| self.error(key, "too large"))
    }

    /// A duration where zero is not allowed.
    pub(super) fn positive(&self, key: &str, value: Duration) -> Result<(), ConfigError> {
        if value.is_zero() {
            return Err(self.error(key, "must be greater than zero"));
        }
        Ok(())
    }
}
