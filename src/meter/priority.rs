//! The request's `priority`, bucketed: a few bands, so that a client sending every integer
//! cannot create series, and the matrix can be asked for one band's cells.
//!
//! sglang and vLLM both take an integer `priority` per request (OpenAI routes and sglang's
//! `/generate`), but read it in opposite directions: sglang (`--enable-priority-scheduling`)
//! serves larger values first unless `--schedule-low-priority-values-first`; vLLM
//! (`--scheduling-policy priority`) serves smaller values first. The bands keep the value's
//! sign and size, never a meaning, so each engine's operator reads them its own way
//! (docs/metrics.md, "Priority").

/// One band of the request's `priority` field. A request without the field has none (no
/// `priority` label, every matrix as before).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PriorityBand {
    /// Below 0.
    Negative,
    /// Exactly 0 (both engines' default).
    Zero,
    /// 1 to 9.
    Low,
    /// 10 and above.
    High,
}

impl PriorityBand {
    pub const ALL: [PriorityBand; 4] = [Self::Negative, Self::Zero, Self::Low, Self::High];

    /// The band of a `priority` value.
    pub fn of(value: i64) -> Self {
        match value {
            i64::MIN..=-1 => Self::Negative,
            0 => Self::Zero,
            1..=9 => Self::Low,
            _ => Self::High,
        }
    }

    /// The `priority` label value and the `?priority=` query value.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Negative => "negative",
            Self::Zero => "0",
            Self::Low => "1-9",
            Self::High => "10+",
        }
    }

    /// The band a label names (`negative`, `0`, `1-9`, `10+`), or the band of a plain
    /// integer.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        Self::ALL
            .into_iter()
            .find(|band| band.label() == text)
            .or_else(|| text.parse::<i64>().ok().map(Self::of))
    }
}

impl std::fmt::Display for PriorityBand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_integer_falls_in_one_of_four_bands() {
        for (value, band) in [
            (i64::MIN, "negative"),
            (-1, "negative"),
            (0, "0"),
            (1, "1-9"),
            (9, "1-9"),
            (10, "10+"),
            (i64::MAX, "10+"),
        ] {
            assert_eq!(PriorityBand::of(value).label(), band, "{value}");
        }
        for band in PriorityBand::ALL {
            assert_eq!(PriorityBand::parse(band.label()), Some(band));
        }
        assert_eq!(PriorityBand::parse("5"), Some(PriorityBand::Low));
        assert_eq!(PriorityBand::parse("urgent"), None);
    }
}
