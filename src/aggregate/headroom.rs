//! Headroom on live traffic: how far production's current load is from the capacity boundary,
//! per context and overall, weighted by the traffic's own context mix (docs/capacity.md).
//!
//! The load of a context is the mean number of its production requests decoding at once over
//! the window: Σ request-seconds of its cells (average active × measured for) ÷ the window's
//! length. The total load is their sum. The capacity of a context comes from a capacity report
//! (a sweep's or a reference's, judged by the configured `[slo]`). Mixed contexts share one
//! server, so the capacity of the mix is the harmonic combination 1 ÷ Σ (share ÷ capacity):
//! a batch of n streams fills the server when each context's streams use their share of it.
//! Headroom is 1 − load ÷ capacity: 1 idle, 0 at the boundary, below 0 past it. Pure: documents
//! in, figures out.
use serde::{Deserialize, Serialize};

use crate::matrix::capacity::CapacityReport;
use crate::matrix::doc::{CellStatus, MatrixDoc};

/// One context's load and headroom.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextHeadroom {
    pub context_tokens: u64,
    /// Mean production requests of this context decoding at once over the window.
    pub load: f64,
    /// Its share of the total load (0–1).
    pub share: f64,
    /// Streams this context can take under the SLO (`None`: the report has no answer for it).
    pub capacity: Option<u32>,
    /// The sweep stopped before a cell missed the SLO (no boundary seen): the context can take
    /// at least `capacity` streams, maybe more, and its headroom is at least `headroom`.
    pub capacity_is_lower_bound: bool,
    /// 1 − total load ÷ capacity: the headroom were all traffic at this context.
    pub headroom: Option<f64>,
}

/// The whole traffic's headroom.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Headroom {
    /// Mean production requests decoding at once over the window, every context.
    pub load: f64,
    /// The capacity of the traffic's context mix (streams), over the contexts with an answer.
    pub capacity: Option<f64>,
    /// 1 − load ÷ capacity.
    pub headroom: Option<f64>,
    /// Some context of the mix has only a lower bound for its capacity (its sweep never saw a
    /// cell miss): the mix's capacity and the headroom are "at least" figures.
    pub capacity_is_lower_bound: bool,
    /// Requests of this model in flight through this proxy now (production and synthetic),
    /// beside `load`, the window's mean; filled by the caller that has the live meter.
    pub running_now: Option<u32>,
    /// Share of the load at contexts the capacity report answers for (0–1): the overall figure
    /// speaks for that much of the traffic.
    pub covered_share: f64,
    pub contexts: Vec<ContextHeadroom>,
}

/// Request-seconds a cell's conditions held: average active × measured for.
fn request_seconds(active: Option<f64>, measured_for: Option<f64>) -> f64 {
    match (active, measured_for) {
        (Some(a), Some(m)) if a.is_finite() && m.is_finite() && a > 0.0 && m > 0.0 => a * m,
        _ => 0.0,
    }
}

/// The headroom of `production` (a window's matrix: its `window_s` is the length) under the
/// capacities of `capacity`; `None` when the window has no length or no load.
pub fn headroom(production: &MatrixDoc, capacity: &CapacityReport) -> Option<Headroom> {
    let window = production
        .metadata
        .run
        .window_s
        .filter(|w| w.is_finite() && *w > 0.0)?;
    let mut contexts: Vec<ContextHeadroom> = Vec::new();
    for context in production.contexts() {
        // Traffic is traffic whatever its evidence: every cell that measured something counts.
        let seconds: f64 = production
            .decode
            .iter()
            .filter(|c| c.context_tokens == context)
            .filter(|c| {
                matches!(
                    c.status,
                    CellStatus::Valid
                        | CellStatus::LowEvidence
                        | CellStatus::Error(_)
                        | CellStatus::Shed(_)
                        | CellStatus::Bursts(_)
                )
            })
            .map(|c| request_seconds(c.average_active_requests, c.measured_for_s))
            .sum();
        if seconds <= 0.0 {
            continue;
        }
        contexts.push(ContextHeadroom {
            context_tokens: context,
            load: seconds / window,
            share: 0.0,
            capacity: capacity.context(context).and_then(|c| c.capacity),
            capacity_is_lower_bound: capacity
                .context(context)
                .is_some_and(|c| c.capacity.is_some() && !c.boundary_seen),
            headroom: None,
        });
    }
    let load: f64 = contexts.iter().map(|c| c.load).sum();
    if load <= 0.0 {
        return None;
    }
    let mut covered = 0.0;
    let mut inverse = 0.0;
    let mut past_boundary = false;
    for context in &mut contexts {
        context.share = context.load / load;
        let Some(streams) = context.capacity else {
            continue;
        };
        covered += context.share;
        if streams == 0 {
            // Even the lowest measured concurrency misses the SLO: no headroom at any load.
            context.headroom = Some(-1.0);
            past_boundary = true;
        } else {
            context.headroom = Some(1.0 - load / f64::from(streams));
            inverse += context.share / f64::from(streams);
        }
    }
    // Over the covered contexts, their shares renormalised.
    let mix = (!past_boundary && covered > 0.0 && inverse > 0.0).then(|| covered / inverse);
    let overall = if past_boundary {
        Some(-1.0)
    } else {
        mix.map(|m| 1.0 - load / m)
    };
    let capacity_is_lower_bound = !past_boundary
        && contexts
            .iter()
            .any(|c| c.capacity.is_some() && c.capacity_is_lower_bound);
    Some(Headroom {
        load,
        capacity: mix,
        headroom: overall,
        capacity_is_lower_bound,
        running_now: None,
        covered_share: covered,
        contexts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::capacity::{capacity, Basis, CapacityQuery, Targets};
    use crate::matrix::doc::DecodeCell;

    fn cell(context: u64, concurrency: u32, active: f64, seconds: f64, tbt: f64) -> DecodeCell {
        let mut cell = DecodeCell::status_only(context, concurrency, CellStatus::Valid);
        cell.average_active_requests = Some(active);
        cell.measured_for_s = Some(seconds);
        cell.tbt_ms = Some(tbt);
        cell.ttft_ms = Some(100.0);
        cell
    }

    fn report(cells: Vec<DecodeCell>) -> CapacityReport {
        let mut doc = MatrixDoc::new(Default::default());
        doc.decode = cells;
        capacity(
            &doc,
            &CapacityQuery {
                targets: Targets {
                    tbt_ms: Some(50.0),
                    ..Targets::default()
                },
                attainment: 0.95,
                basis: Basis::Median,
                output_tokens: None,
            },
        )
        .unwrap()
    }

    #[test]
    fn steady_traffic_at_known_concurrency_has_one_minus_load_over_capacity() {
        // The sweep: 8K meets up to 8 streams, misses at 16.
        let sweep = report(vec![
            cell(8192, 4, 4.0, 30.0, 30.0),
            cell(8192, 8, 8.0, 30.0, 45.0),
            cell(8192, 16, 16.0, 30.0, 60.0),
        ]);
        // Production: 2 streams for the whole 300 s window.
        let mut production = MatrixDoc::new(Default::default());
        production.metadata.run.window_s = Some(300.0);
        production.decode = vec![cell(8192, 2, 2.0, 300.0, 25.0)];
        let figures = headroom(&production, &sweep).unwrap();
        assert!((figures.load - 2.0).abs() < 1e-9);
        assert_eq!(figures.contexts[0].capacity, Some(8));
        assert!((figures.headroom.unwrap() - 0.75).abs() < 1e-9);
        assert!((figures.covered_share - 1.0).abs() < 1e-9);
        assert!(!figures.capacity_is_lower_bound);
    }

    #[test]
    fn a_sweep_that_never_missed_gives_an_at_least_capacity_and_headroom() {
        // Every cell meets: the boundary lies beyond 8 streams.
        let sweep = report(vec![
            cell(8192, 4, 4.0, 30.0, 30.0),
            cell(8192, 8, 8.0, 30.0, 45.0),
        ]);
        let mut production = MatrixDoc::new(Default::default());
        production.metadata.run.window_s = Some(300.0);
        production.decode = vec![cell(8192, 2, 2.0, 300.0, 25.0)];
        let figures = headroom(&production, &sweep).unwrap();
        assert_eq!(figures.contexts[0].capacity, Some(8));
        assert!(figures.contexts[0].capacity_is_lower_bound);
        assert!(figures.capacity_is_lower_bound);
    }

    #[test]
    fn a_mix_of_contexts_combines_their_capacities_harmonically() {
        let sweep = report(vec![
            cell(8192, 8, 8.0, 30.0, 45.0),
            cell(8192, 16, 16.0, 30.0, 60.0),
            cell(32768, 2, 2.0, 30.0, 45.0),
            cell(32768, 4, 4.0, 30.0, 60.0),
        ]);
        let mut production = MatrixDoc::new(Default::default());
        production.metadata.run.window_s = Some(100.0);
        // One stream at 8K and one at 32K on average.
        production.decode = vec![
            cell(8192, 2, 2.0, 50.0, 25.0),
            cell(32768, 2, 2.0, 50.0, 40.0),
            cell(65536, 1, 1.0, 0.0, 40.0),
        ];
        let figures = headroom(&production, &sweep).unwrap();
        assert!((figures.load - 2.0).abs() < 1e-9);
        // Half the streams at a capacity of 8, half at 2: 1 ÷ (0.5/8 + 0.5/2) = 3.2.
        assert!((figures.capacity.unwrap() - 3.2).abs() < 1e-9);
        assert!((figures.headroom.unwrap() - (1.0 - 2.0 / 3.2)).abs() < 1e-9);
    }
}
