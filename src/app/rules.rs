//! `tokentap rules`: the error-budget burn-rate alerts of the configuration's `[slo]` as
//! Prometheus rule groups (YAML), and with `--tests` the promtool unit tests of every alert
//! (`telemetry::budget` writes both; docs/metrics.md, "Error budgets").

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;

use crate::telemetry::budget;

/// Arguments of `tokentap rules`.
#[derive(Debug, clap::Args)]
pub struct RulesArgs {
    /// TOML configuration file, as `tokentap serve` reads it (its `[slo]` section gives the
    /// objectives and targets). Environment variables `TOKENTAP_<SECTION>__<KEY>` override it.
    #[arg(long, short = 'c', value_name = "FILE", env = "TOKENTAP_CONFIG")]
    pub config: Option<PathBuf>,
    /// Set any key of config/tokentap.toml, e.g. --set slo.objective=0.995 (repeatable; over the
    /// file and the environment).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
    /// Write the rules here instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Also write promtool unit tests of every alert here (`promtool test rules FILE`): they
    /// name the rule file, so --output is needed.
    #[arg(long, value_name = "FILE", requires = "output")]
    pub tests: Option<PathBuf>,
}

pub fn run(args: RulesArgs) -> anyhow::Result<ExitCode> {
    let config = super::serve::config_layers(args.config.as_deref(), &args.set)?.load()?;
    let scopes = budget::scopes(&config.metering.slo, &config.metering.objectives);
    let rules = budget::rules(&scopes);
    let Some(output) = &args.output else {
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(rules.as_bytes())
            .and_then(|()| stdout.flush())
            .context("cannot write the rules to stdout")?;
        return Ok(ExitCode::SUCCESS);
    };
    write_creating_folder(output, &rules, "the rules")?;
    if let Some(tests) = &args.tests {
        let rule_file = rule_file_from(tests, output)?;
        write_creating_folder(
            tests,
            &budget::unit_tests(&scopes, &rule_file),
            "the unit tests",
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `text` to `path`, making the folders above it first (`--output rules/x.yml` in a
/// checkout without `rules/`).
fn write_creating_folder(path: &Path, text: &str, what: &str) -> anyhow::Result<()> {
    if let Some(folder) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(folder)
            .with_context(|| format!("cannot make the folder {} for {what}", folder.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {what} to {}", path.display()))
}

/// How the tests file names the rule file: its name when both lie in one directory (promtool
/// reads it relative to the tests file), else its absolute path.
fn rule_file_from(tests: &Path, rules: &Path) -> anyhow::Result<String> {
    let current = std::env::current_dir().context("cannot read the current directory")?;
    let absolute = |path: &Path| {
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            current.join(path)
        }
    };
    let (tests, rules) = (absolute(tests), absolute(rules));
    anyhow::ensure!(
        tests != rules,
        "--tests and --output name the same file, {}",
        rules.display()
    );
    let named = match rules.file_name() {
        Some(name) if tests.parent() == rules.parent() => PathBuf::from(name),
        _ => rules.clone(),
    };
    named
        .to_str()
        .map(str::to_owned)
        .with_context(|| format!("the rule file's path {} is not UTF-8", rules.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tests_name_the_rule_file_beside_them_by_name() {
        assert_eq!(
            rule_file_from(Path::new("/d/t.yml"), Path::new("/d/r.yml")).unwrap(),
            "r.yml"
        );
        assert_eq!(
            rule_file_from(Path::new("/e/t.yml"), Path::new("/d/r.yml")).unwrap(),
            "/d/r.yml"
        );
        assert!(rule_file_from(Path::new("/d/r.yml"), Path::new("/d/r.yml")).is_err());
    }
}
