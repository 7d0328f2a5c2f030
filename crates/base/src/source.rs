//! Where traffic and figures come from: production (real clients) or synthetic (a sweep's own
//! requests, or a published benchmark page). Records, metric labels and matrix documents use
//! this one type, so a synthetic figure is never mixed into a production one.

use serde::{Deserialize, Serialize};

/// Where a request or a matrix's figures come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Real client traffic through the proxy.
    Production,
    /// The sweep's own requests (tokentap's, or a published benchmark page's).
    Synthetic,
}

impl Source {
    pub const ALL: [Source; 2] = [Source::Production, Source::Synthetic];

    /// The label value and the document spelling (a static string: no allocation when labelling).
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Production => "production",
            Source::Synthetic => "synthetic",
        }
    }

    pub fn parse(text: &str) -> Option<Source> {
        match text {
            "production" => Some(Source::Production),
            "synthetic" => Some(Source::Synthetic),
            _ => None,
        }
    }

    /// Position in per-source arrays (`ALL` order).
    pub fn index(self) -> usize {
        match self {
            Source::Production => 0,
            Source::Synthetic => 1,
        }
    }
}
