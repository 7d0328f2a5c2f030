//! The scraper's timing, in paused time against a scripted page (`start_paused`: every wait of
//! the scraper advances the clock at once, so a minute of back-off costs no wall time): it
//! reads every interval while the page answers; while it fails the state is unknown and the
//! wait doubles from the interval up to [`BACKOFF_MAX`]; a mended page is read after the
//! back-off and the interval starts over; a kick reads at once; the task ends with the proxy.
//! The real page over a real socket is `tests/server_state_tests.rs`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::scrape::{scrape_with, BACKOFF_MAX};
use crate::config::ConfigLoader;
use crate::meter::buckets::Ladder;
use crate::meter::server_state::ScrapeOutcome;
use crate::meter::Meter;
use crate::proxy::upstream::Upstream;

const PAGE: &str = "sglang:num_running_reqs{model_name=\"m\"} 3\n";

/// One scripted read: the page, or why not.
type Read = Result<String, ScrapeOutcome>;

/// The page the fake upstream answers, read by read (the last answer repeats), and when each
/// read came (in paused time).
#[derive(Default)]
struct ScriptedPage {
    answers: Mutex<VecDeque<Read>>,
    reads: Mutex<Vec<Instant>>,
}

impl ScriptedPage {
    fn new(answers: impl IntoIterator<Item = Read>) -> Arc<Self> {
        Arc::new(Self {
            answers: Mutex::new(answers.into_iter().collect()),
            reads: Mutex::default(),
        })
    }

    fn read(&self) -> Read {
        self.reads.lock().unwrap().push(Instant::now());
        let mut answers = self.answers.lock().unwrap();
        if answers.len() > 1 {
            answers.pop_front().unwrap()
        } else {
            answers.front().cloned().unwrap()
        }
    }

    /// The waits between consecutive reads so far.
    fn gaps(&self) -> Vec<Duration> {
        let reads = self.reads.lock().unwrap();
        reads.windows(2).map(|w| w[1] - w[0]).collect()
    }
}

/// An upstream scraped every `interval` (its address is never dialled: reads are scripted).
fn upstream(interval: &str) -> Arc<Upstream> {
    let config = ConfigLoader::new()
        .text(
            &format!(
                "[upstream]\nurl = \"http://127.0.0.1:9\"\nmetrics_interval = \"{interval}\"\n"
            ),
            "test.toml",
        )
        .unwrap()
        .load()
        .unwrap();
    let upstream_config = config.upstreams.into_iter().next().unwrap();
    Arc::new(Upstream::new(upstream_config, 1 << 16, Arc::default()).unwrap())
}

fn meter() -> Arc<Meter> {
    Meter::new(
        Ladder::contexts(&[1024]).unwrap(),
        Ladder::concurrency(&[1]).unwrap(),
    )
}

/// Starts the scraper of `upstream` on `page`.
fn scrape(
    upstream: &Arc<Upstream>,
    meter: &Arc<Meter>,
    page: &Arc<ScriptedPage>,
) -> tokio::task::JoinHandle<()> {
    meter.server_state().watch(&upstream.name);
    let page = Arc::clone(page);
    tokio::spawn(scrape_with(
        Arc::downgrade(upstream),
        Arc::downgrade(meter),
        async move |_, _| page.read(),
    ))
}

/// What the registry holds for model `m` now: its running requests.
fn running(meter: &Meter) -> Option<Option<f64>> {
    meter
        .server_state()
        .current()
        .into_iter()
        .find(|row| &*row.model == "m")
        .map(|row| row.values[0])
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

#[tokio::test(start_paused = true)]
async fn a_failing_page_is_asked_less_often_up_to_a_minute_and_read_again_once_mended() {
    let upstream = upstream("1s");
    let meter = meter();
    // Read, then eight failures of every kind, then mended.
    let failures = [
        ScrapeOutcome::Status,
        ScrapeOutcome::Unreadable,
        ScrapeOutcome::TooLarge,
        ScrapeOutcome::Timeout,
        ScrapeOutcome::Unreachable,
        ScrapeOutcome::Status,
        ScrapeOutcome::Status,
        ScrapeOutcome::Status,
    ];
    let page = ScriptedPage::new(
        std::iter::once(Ok(PAGE.to_owned()))
            .chain(failures.iter().map(|f| Err(*f)))
            .chain(std::iter::once(Ok(PAGE.to_owned()))),
    );
    let task = scrape(&upstream, &meter, &page);
    // The first read is at once and holds the page's value.
    tokio::time::sleep(secs(0.5)).await;
    assert_eq!(running(&meter), Some(Some(3.0)));
    // The first failure comes at the interval: the value is unknown from then on.
    tokio::time::sleep(secs(1.0)).await;
    assert_eq!(
        running(&meter),
        Some(None),
        "no value held across a failure"
    );
    // 1 + 2 + 4 + … s of back-off, then 60 s at most: the mended page (the tenth read) comes
    // 1 + 1 + 2 + 4 + 8 + 16 + 32 + 60 + 60 s after the first.
    tokio::time::sleep(secs(200.0)).await;
    let gaps = page.gaps();
    assert!(gaps.len() >= 11, "the mended page was read: {gaps:?}");
    let expected: Vec<Duration> = [1.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 1.0, 1.0]
        .into_iter()
        .map(secs)
        .collect();
    assert_eq!(gaps[..11], expected[..], "the waits between reads");
    assert_eq!(BACKOFF_MAX, Duration::from_secs(60));
    // Mended: the value is held again and the interval starts over.
    assert_eq!(running(&meter), Some(Some(3.0)));
    let registry = meter.server_state();
    assert_eq!(registry.scrapes("default", ScrapeOutcome::Status), 4);
    for outcome in [
        ScrapeOutcome::Unreadable,
        ScrapeOutcome::TooLarge,
        ScrapeOutcome::Timeout,
        ScrapeOutcome::Unreachable,
    ] {
        assert_eq!(registry.scrapes("default", outcome), 1, "{outcome:?}");
    }
    // The task ends with the proxy.
    drop(upstream);
    tokio::time::timeout(secs(5.0), task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_interval_past_a_minute_is_the_back_off_and_a_kick_reads_at_once() {
    let upstream = upstream("90s");
    let meter = meter();
    let page = ScriptedPage::new([Err(ScrapeOutcome::Status)]);
    let _task = scrape(&upstream, &meter, &page);
    tokio::time::sleep(secs(400.0)).await;
    // Never more often than the interval, even while it fails.
    let gaps = page.gaps();
    assert!(gaps.len() >= 3, "{gaps:?}");
    assert!(gaps.iter().all(|g| *g == secs(90.0)), "{gaps:?}");
    // A kick (a sweep between cells) reads now, whatever the back-off.
    let reads = page.reads.lock().unwrap().len();
    let before = meter.server_state().scrape_now("default").unwrap();
    tokio::time::sleep(secs(0.001)).await;
    assert_eq!(page.reads.lock().unwrap().len(), reads + 1);
    assert_eq!(meter.server_state().scrapes_done("default"), before + 1);
}
