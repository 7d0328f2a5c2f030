//! Whether the upstreams answer, as `/readyz` asks it: a `GET
//! /v1/models` sent direct (`ask::head`), any HTTP response head within [`PROBE_DEADLINE`]
//! counting as answering (a 404 is a server that is up; the body is not waited for). One probe at a time, its answer reused for
//! [`PROBE_REUSE`], so a flood of `/readyz` costs the upstream at most a question a second.
//! Each answer says since when the upstream has answered that way (as far as the probes saw:
//! the first probe that found it so), for the verdict's availability clause.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use super::ask;
use super::upstream::Upstream;
use super::Proxy;

/// Longest wait for the upstream's answer: Kubernetes' default probe timeout is 1 s.
pub const PROBE_DEADLINE: Duration = Duration::from_millis(900);
/// How long one probe's answer is reused.
pub const PROBE_REUSE: Duration = Duration::from_secs(1);

/// The path asked: every engine tokentap knows answers it (sglang, vLLM, llama-server).
const PROBE_PATH: &str = "/v1/models";

/// One upstream's answer to the probe.
#[derive(Debug, Clone)]
pub struct UpstreamAnswer {
    pub name: Arc<str>,
    pub url: String,
    pub answering: bool,
    /// The first probe that found it `answering` as it is now (the first probe at all when
    /// it never changed): since when, as far as the probes know.
    pub since: Instant,
}

/// The probe's last answers, shared by every `/readyz`.
#[derive(Debug, Default)]
pub struct ReadinessProbe {
    last: Mutex<Option<(Instant, Arc<[UpstreamAnswer]>)>>,
}

impl ReadinessProbe {
    /// Every upstream's answer, probed now unless a probe within [`PROBE_REUSE`] answered.
    pub async fn upstreams(&self, proxy: &Proxy) -> Arc<[UpstreamAnswer]> {
        let mut last = self.last.lock().await;
        if let Some((at, answers)) = &*last {
            if at.elapsed() < PROBE_REUSE {
                return Arc::clone(answers);
            }
        }
        // Asked together: dead upstreams cost one deadline between them.
        let mut probes = tokio::task::JoinSet::new();
        for (index, upstream) in proxy.router.all().iter().enumerate() {
            let upstream = Arc::clone(upstream);
            probes.spawn(async move { (index, probe(&upstream).await) });
        }
        let mut answered = Vec::new();
        while let Some(Ok(answer)) = probes.join_next().await {
            answered.push(answer);
        }
        answered.sort_by_key(|(index, _)| *index);
        // An upstream answering as the last probe found it keeps that probe's `since`.
        let previous = last.as_ref().map(|(_, answers)| Arc::clone(answers));
        let answers: Arc<[UpstreamAnswer]> = answered
            .into_iter()
            .map(|(_, mut answer)| {
                if let Some(before) = previous
                    .iter()
                    .flat_map(|p| p.iter())
                    .find(|b| b.name == answer.name && b.answering == answer.answering)
                {
                    answer.since = before.since;
                }
                answer
            })
            .collect();
        *last = Some((Instant::now(), Arc::clone(&answers)));
        answers
    }
}

/// Asks one upstream.
pub async fn probe(upstream: &Upstream) -> UpstreamAnswer {
    UpstreamAnswer {
        name: Arc::clone(&upstream.name),
        url: upstream.config.url.to_string(),
        // A response head is an answer: a body that takes its time (or never ends) is a
        // server that is up all the same.
        answering: ask::head(upstream, PROBE_PATH, PROBE_DEADLINE)
            .await
            .is_some(),
        since: Instant::now(),
    }
}
