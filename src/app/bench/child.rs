//! The proxy under test: `tokentap serve` (this same binary) in a child process on loopback
//! ports, with the user's configuration, so its CPU time and resident memory are its own and
//! can be read from `/proc/<pid>`; killed when the self-check ends, however it ends.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio::time::Instant;

use crate::app::demo::http;

/// Linux's `USER_HZ`: `/proc/<pid>/stat` counts CPU time in these ticks on every architecture.
const TICKS_PER_SECOND: f64 = 100.0;

/// How long the child may take to answer `/readyz`.
const READY_LIMIT: Duration = Duration::from_secs(20);

/// A running `tokentap serve`; dropped, it is killed.
pub struct ProxyChild {
    child: Child,
    /// Its data listener, as a base URL.
    pub base_url: String,
    stderr_path: PathBuf,
}

impl ProxyChild {
    /// Starts `tokentap serve` in front of `upstream` with the configuration file and `--set`
    /// keys the user gave, its listeners moved to free loopback ports and its store off (the
    /// self-check writes nothing), and waits until it says it is ready.
    /// A free port can be taken by another process between the probe and the child's bind:
    /// then it is tried again on fresh ports (at most three times).
    pub async fn start(
        upstream: &str,
        config: Option<&Path>,
        set: &[String],
    ) -> anyhow::Result<Self> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start_once(upstream, config, set).await {
                Err(error) if attempt < 3 && format!("{error:#}").contains("holds port") => {}
                result => return result,
            }
        }
    }

    async fn start_once(
        upstream: &str,
        config: Option<&Path>,
        set: &[String],
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("finding this tokentap binary")?;
        let (data, admin) = (free_loopback_port()?, free_loopback_port()?);
        let stderr_path =
            std::env::temp_dir().join(format!("tokentap-bench-{}-{data}.log", std::process::id()));
        let stderr = std::fs::File::create(&stderr_path)
            .with_context(|| format!("creating {}", stderr_path.display()))?;
        let mut command = Command::new(exe);
        command.arg("serve");
        if let Some(config) = config {
            command.arg("--config").arg(config);
        }
        for key in set {
            command.arg("--set").arg(key);
        }
        command
            .args(["--upstream", upstream])
            .args(["--listen", &format!("127.0.0.1:{data}")])
            .args(["--admin", &format!("127.0.0.1:{admin}")])
            .args(["--set", "store.data_dir="])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = command.spawn().context("starting tokentap serve")?;
        let mut proxy = ProxyChild {
            child,
            base_url: format!("http://127.0.0.1:{data}"),
            stderr_path,
        };
        proxy
            .wait_ready(&format!("http://127.0.0.1:{admin}/readyz"))
            .await?;
        Ok(proxy)
    }

    async fn wait_ready(&mut self, readyz: &str) -> anyhow::Result<()> {
        let client = http::client();
        let deadline = Instant::now() + READY_LIMIT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!(
                    "tokentap serve exited ({status}) before it was ready: {}",
                    self.stderr_tail()
                );
            }
            if let Some(request) = http::get(readyz) {
                if http::succeeds(&client, request, Duration::from_secs(2)).await {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "tokentap serve did not say ready at {readyz} within {}s (does the upstream answer GET /v1/models?): {}",
            READY_LIMIT.as_secs(),
            self.stderr_tail()
        )
    }

    /// The last lines the child wrote on stderr.
    fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(5).collect();
        if lines.is_empty() {
            "it wrote nothing on stderr".to_owned()
        } else {
            lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
        }
    }

    /// CPU time the child has used (user + system), where `/proc` tells it.
    pub fn cpu_time(&self) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).ok()?;
        cpu_from_stat(&stat)
    }

    /// The child's resident memory in bytes, where `/proc` tells it.
    pub fn resident_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        resident_from_status(&status)
    }
}

impl Drop for ProxyChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr_path);
    }
}

/// A loopback port nothing listens on now (bound and released: the child binds it next).
fn free_loopback_port() -> anyhow::Result<u16> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?;
    Ok(listener
        .local_addr()
        .context("finding a free loopback port")?
        .port())
}

/// utime + stime of a `/proc/<pid>/stat` line. The command name (field 2) may hold spaces and
/// parentheses, so the fields are counted after its last `)`.
fn cpu_from_stat(stat: &str) -> Option<Duration> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // After the name: state (3) … utime (14), stime (15).
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_secs_f64(
        (utime + stime) as f64 / TICKS_PER_SECOND,
    ))
}

/// `VmRSS` of a `/proc/<pid>/status`, in bytes.
fn resident_from_status(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 2000 0 0 0 150 25 0 0 20 0 9 0 100 1000000 2000";
        assert_eq!(cpu_from_stat(stat), Some(Duration::from_millis(1750)));
        assert_eq!(cpu_from_stat("garbage"), None);
        assert_eq!(cpu_from_stat("1 (x) S 1"), None);
    }

    #[test]
    fn resident_memory_is_read_in_bytes() {
        let status = "Name:\ttokentap\nVmPeak:\t  99 kB\nVmRSS:\t   20480 kB\n";
        assert_eq!(resident_from_status(status), Some(20 * 1024 * 1024));
        assert_eq!(resident_from_status("Name: x\n"), None);
    }

    /// This test process's own files parse (Linux only: elsewhere `/proc` is absent).
    #[test]
    fn this_process_reads_its_own_figures() {
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
            assert!(cpu_from_stat(&stat).is_some(), "{stat}");
        }
        if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
            assert!(resident_from_status(&status).is_some_and(|bytes| bytes > 0));
        }
    }
}
