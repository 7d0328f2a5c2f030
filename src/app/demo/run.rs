//! `tokentap demo`: its steps in order.

use std::process::ExitCode;
use std::time::SystemTime;

use tokio::time::Instant;

use crate::aggregate::Window;
use crate::sweep::status::SweepState;

use super::args::DemoArgs;
use super::machine::{first_warning, TimingCheck};
use super::report::DemoReport;
use super::steady::steady_cells;
use super::{finish, mixed, start, steady, sweep};

/// `tokentap demo`: its steps in order.
pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let began = Instant::now();
    let steady_hold = crate::base::duration::parse_duration(&args.steady_duration)
        .map_err(|error| anyhow::anyhow!("--steady-duration: {error}"))?;
    let demo = start::start(&args, began, steady_hold).await?;
    // 1. The short sweep.
    let sweep = sweep::sweep(&demo, &args).await?;
    // Did this machine keep the simulator's timing? If not, nothing after it is a finding.
    let sweep_timing = TimingCheck::of(&demo.profile, &sweep.synthetic, "its sweep");
    if let Some(warning) = sweep_timing.as_ref().and_then(TimingCheck::warning) {
        eprint!(
            "{}",
            super::report::wrap(&format!("warning: {warning}"), 120)
        );
    }
    // 2. Steady traffic: ordinary clients reproduce a few of the sweep's cells.
    let cells = steady_cells(&sweep.synthetic);
    let steady = steady::steady(
        &demo,
        &sweep.model,
        &cells,
        steady_hold,
        &args.steady_duration,
    )
    .await;
    // The steady traffic is checked too: a machine can stall after the sweep.
    let steady_timing = steady
        .matrix
        .as_ref()
        .and_then(|m| TimingCheck::of(&demo.profile, m, "its steady traffic"));
    if sweep_timing
        .as_ref()
        .and_then(TimingCheck::warning)
        .is_none()
    {
        if let Some(warning) = steady_timing.as_ref().and_then(TimingCheck::warning) {
            eprint!(
                "{}",
                super::report::wrap(&format!("warning: {warning}"), 120)
            );
        }
    }
    // 3. Mixed traffic: cold prompts of many lengths at changing concurrency.
    let mixed = mixed::mixed(&demo, &sweep.model, args.requests).await;
    // Everything the proxy measured since start, as /matrix shows it.
    let production =
        demo.server
            .production
            .matrix(Window::All, Some(&sweep.model), SystemTime::now());
    // 4. The matrices and the report.
    let report = DemoReport {
        synthetic: &sweep.synthetic,
        steady: steady.matrix.as_ref(),
        mixed: mixed.matrix.as_ref(),
        steady_cells: &cells,
        too_busy: first_warning(&[sweep_timing, steady_timing]),
    };
    finish::finish(&args, &demo, began, &report, production.as_ref()).await?;

    if args.keep_running {
        eprintln!();
        eprintln!(
            "Still running: proxy http://{}, admin http://{} (token {}). Ctrl-C stops.",
            demo.server.proxy_addr, demo.server.admin_addr, demo.token
        );
        eprintln!(
            "    Open http://{}/login in a browser and give it the token: the live page, and a button that starts a sweep.",
            demo.server.admin_addr
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    demo.server.shutdown().await;
    demo.sim.shutdown().await;
    Ok(
        if sweep.state == SweepState::Finished && mixed.burst.failed == 0 && steady.failures == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}
