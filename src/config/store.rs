//! `[store]`: where the SQLite store lives, how often the production matrix is saved, how long
//! it is kept.

use std::path::PathBuf;
use std::time::Duration;

use super::error::{ConfigError, Origins};
use super::raw::RawStore;

#[derive(Debug, Clone, PartialEq)]
pub struct StoreConfig {
    /// Directory of the SQLite store; `None` keeps nothing on disk.
    pub data_dir: Option<PathBuf>,
    pub snapshot_interval: Duration,
    pub retention: Duration,
}

impl StoreConfig {
    pub(super) fn from_raw(raw: RawStore, origins: &Origins) -> Result<Self, ConfigError> {
        let store = StoreConfig {
            data_dir: raw.data_dir.filter(|d| !d.is_empty()).map(PathBuf::from),
            snapshot_interval: raw.snapshot_interval,
            retention: raw.retention,
        };
        origins.positive("store.snapshot_interval", store.snapshot_interval)?;
        Ok(store)
    }
}
