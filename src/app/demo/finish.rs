//! The demo's last step: the report assembled and shown (stdout in the chosen format), the
//! matrices, the workload trace and report.html written, and what to try next.

use std::time::Duration;

use anyhow::Context as _;
use tokio::time::Instant;

use super::args::DemoArgs;
use super::report::DemoReport;
use super::start::Demo;
use crate::app::output::OutputFormat;
use crate::app::sweep::write_matrix;
use crate::matrix::render_markdown;
use crate::matrix::MatrixDoc;

/// Step 4/4: prints `report` on stdout, writes every matrix (`production`: all the proxy
/// measured since start, as /matrix shows it), the trace and the page under `--out`.
pub async fn finish(
    args: &DemoArgs,
    demo: &Demo,
    began: Instant,
    report: &DemoReport<'_>,
    production: Option<&MatrixDoc>,
) -> anyhow::Result<()> {
    let synthetic = report.synthetic;
    match args.format.resolve() {
        format @ (OutputFormat::Table | OutputFormat::List) => {
            println!("{}", format.matrix(synthetic));
            println!("{}", report.terminal());
        }
        OutputFormat::Json => println!("{}", report.json(production)),
        OutputFormat::Llmd => {
            // Every matrix of the demo as llm-d reports, one array (each its own experiment).
            let reports: Vec<serde_json::Value> =
                [Some(synthetic), production, report.steady, report.mixed]
                    .into_iter()
                    .flatten()
                    .flat_map(crate::matrix::llmd::reports)
                    .collect();
            println!("{}", serde_json::to_string_pretty(&reports)?);
        }
        _ => {
            println!("{}", render_markdown(synthetic));
            println!("{}", report.markdown());
        }
    }
    let mut written = write_matrix(&args.out, "synthetic", synthetic)?;
    for (stem, doc) in [
        ("production", production),
        ("steady", report.steady),
        ("mixed", report.mixed),
    ] {
        if let Some(doc) = doc {
            written.extend(write_matrix(&args.out, stem, doc)?);
        }
    }
    // The demo's production traffic as a trace, for `tokentap replay` (docs/what-if.md).
    if let Some(capture) = &demo.server.admin.workload {
        let trace = capture.export(Duration::from_secs(24 * 3600)).await?;
        let path = args.out.join("workload.jsonl");
        std::fs::write(&path, trace.to_jsonl())
            .with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path.display().to_string());
    }
    let report_path = args.out.join("report.html");
    std::fs::write(&report_path, report.html())
        .with_context(|| format!("cannot write {}", report_path.display()))?;
    eprintln!();
    eprintln!("4/4 Done in {:.0} s.", began.elapsed().as_secs_f64());
    eprintln!(
        "    Open {} in a browser (heat map, charts, both phases beside the sweep, every measurement).",
        report_path.display()
    );
    // Within 120 columns: the list wraps, each line indented under the first.
    let also = super::report::wrap(&format!("Also written: {}", written.join(", ")), 116);
    for line in also.lines() {
        eprintln!("    {line}");
    }
    eprintln!();
    eprintln!("Try next:");
    eprintln!("    tokentap serve --upstream http://YOUR-SGLANG:30000     # meter your own server; clients use :8000");
    eprintln!("    tokentap sweep --target http://YOUR-SGLANG:30000 --contexts 8K,32K --cell-duration 10s");
    eprintln!(
        "    tokentap matrix diff <seed page or matrix> {}   # compare two matrices cell by cell",
        args.out.join("synthetic.json").display()
    );
    eprintln!("    tokentap simulate --profile glm-5.3-flash-nvfp4-4x-rtx-pro-6000   # a simulated sglang on :30000");
    eprintln!("    tokentap demo --keep-running    # keep the proxy and admin API up to explore");
    Ok(())
}
