//! [`RecordCollector`]: a record sink keeping the records of one run's synthetic requests (their
//! tags start with the run's prefix) until the run takes them by tag. Registered through
//! [`super::DataPath::collect`], whose scope removes it when the run ends, however it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::base::lock::lock;
use crate::base::Source;
use crate::meter::record::RequestRecord;
use crate::meter::RecordSink;

/// Collects the records of one run's requests (their tags start with its prefix).
#[derive(Debug)]
pub struct RecordCollector {
    prefix: String,
    records: Mutex<HashMap<Arc<str>, Arc<RequestRecord>>>,
}

impl RecordCollector {
    pub fn new(prefix: String) -> Arc<Self> {
        Arc::new(Self {
            prefix,
            records: Mutex::new(HashMap::new()),
        })
    }

    /// Removes and returns the record of the request tagged `tag`.
    pub fn take(&self, tag: &str) -> Option<Arc<RequestRecord>> {
        lock(&self.records).remove(tag)
    }
}

impl RecordSink for RecordCollector {
    fn record(&self, record: &Arc<RequestRecord>) {
        if record.labels.source != Source::Synthetic {
            return;
        }
        if let Some(tag) = &record.labels.tag {
            if tag.starts_with(&self.prefix) {
                lock(&self.records).insert(Arc::clone(tag), Arc::clone(record));
            }
        }
    }
}
