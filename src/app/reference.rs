//! `tokentap reference pin|show|clear`: the reference matrix of a running proxy, through its
//! admin API (`/reference`), the way `tokentap sweep --admin` starts sweeps. Prints the answer;
//! an error answer becomes a failed exit with the proxy's message.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand, ValueEnum};
use http::Method;

use super::sweep::Admin;

/// Arguments of `tokentap reference` (the command's help text is on its `Command` variant).
#[derive(Debug, Args)]
pub struct ReferenceArgs {
    #[command(subcommand)]
    pub command: ReferenceCommand,
    /// The admin API of the running `tokentap serve` (its admin.listen).
    #[arg(
        long,
        value_name = "URL",
        default_value = "http://127.0.0.1:9464",
        global = true
    )]
    pub admin: String,
    /// Bearer token of the admin API (that proxy's admin.token); pin and clear need it.
    /// Default: the TOKENTAP_ADMIN__TOKEN environment variable.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "TOKENTAP_ADMIN__TOKEN",
        hide_env_values = true,
        global = true
    )]
    pub token: Option<String>,
}

/// Which reference to pin: the model production traffic names, and the upstream it is pinned
/// for.
#[derive(Debug, Args)]
pub struct Target {
    /// The model as clients send it. Default: the matrix's served model.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// The upstream (its configured name). Default: the one the proxy routes the model to.
    #[arg(long, value_name = "NAME")]
    pub upstream: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum ReferenceCommand {
    /// Pin a reference: the latest finished sweep, or a matrix file (seed page text, tokentap
    /// Markdown or JSON). Replaces the one pinned for the same upstream and model.
    Pin {
        #[command(flatten)]
        target: Target,
        /// Pin the latest finished sweep of the proxy.
        #[arg(
            long,
            value_enum,
            value_name = "WHAT",
            conflicts_with = "file",
            required_unless_present = "file"
        )]
        from: Option<PinFrom>,
        /// Pin this matrix file (read here, sent to the proxy).
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
    },
    /// Show the pinned references: all of them (provenance only), or, with --model, that
    /// model's reference with its matrix. Needs the token only when the proxy has one.
    Show {
        /// Show this model's reference (as clients send the model name), with its matrix.
        /// Default: list every pinned reference.
        #[arg(long, value_name = "NAME")]
        model: Option<String>,
        /// With --model: the upstream it is pinned for (its configured name). Default: the one
        /// the proxy routes the model to.
        #[arg(long, value_name = "NAME", requires = "model")]
        upstream: Option<String>,
        /// With --model: status (provenance and the matrix as JSON), json, md or html (the
        /// matrix alone).
        #[arg(long, value_enum, value_name = "FORMAT", default_value_t = ShowFormat::Status, requires = "model")]
        format: ShowFormat,
    },
    /// Unpin the reference of a model (drift is then no longer measured for it). Needs the
    /// token.
    Clear {
        /// The model whose reference is unpinned (as clients send it; `tokentap reference show`
        /// lists them).
        #[arg(long, value_name = "NAME", required = true)]
        model: Option<String>,
        /// The upstream it is pinned for (its configured name). Default: the one the proxy
        /// routes the model to.
        #[arg(long, value_name = "NAME")]
        upstream: Option<String>,
    },
}

/// `reference show --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShowFormat {
    /// Provenance and the matrix, as JSON.
    Status,
    /// The matrix alone, as JSON.
    Json,
    /// The matrix alone, as Markdown.
    Md,
    /// The matrix alone, as an HTML page.
    Html,
}

impl ShowFormat {
    fn as_str(self) -> &'static str {
        match self {
            ShowFormat::Status => "status",
            ShowFormat::Json => crate::matrix::Format::Json.name(),
            ShowFormat::Md => crate::matrix::Format::Markdown.name(),
            ShowFormat::Html => crate::matrix::Format::Html.name(),
        }
    }
}

/// Where `pin --from` takes the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PinFrom {
    /// The newest sweep that finished on the proxy.
    LatestSweep,
}

/// Percent-encodes a query value (model names hold `/` and more).
fn encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

fn path(target: &Target, extra: &[(&str, String)]) -> String {
    let mut pairs: Vec<String> = Vec::new();
    if let Some(model) = &target.model {
        pairs.push(format!("model={}", encode(model)));
    }
    if let Some(upstream) = &target.upstream {
        pairs.push(format!("upstream={}", encode(upstream)));
    }
    for (key, value) in extra {
        pairs.push(format!("{key}={}", encode(value)));
    }
    if pairs.is_empty() {
        "/reference".to_owned()
    } else {
        format!("/reference?{}", pairs.join("&"))
    }
}

/// Runs the command.
pub async fn run(args: ReferenceArgs) -> anyhow::Result<ExitCode> {
    let admin = Admin::new(&args.admin, args.token.clone());
    let (method, path, body) = match &args.command {
        ReferenceCommand::Pin { target, from, file } => match (from, file) {
            (_, Some(file)) => {
                let text = std::fs::read_to_string(file)
                    .with_context(|| format!("cannot read {}", file.display()))?;
                let source = format!("file {}", file.display());
                (Method::PUT, path(target, &[("source", source)]), Some(text))
            }
            (Some(PinFrom::LatestSweep), None) => (
                Method::PUT,
                path(target, &[]),
                Some("{\"from\":\"latest-sweep\"}".to_owned()),
            ),
            (None, None) => anyhow::bail!("say what to pin: --from latest-sweep or --file FILE"),
        },
        ReferenceCommand::Show {
            model,
            upstream,
            format,
        } => {
            let target = Target {
                model: model.clone(),
                upstream: upstream.clone(),
            };
            let extra = if model.is_some() {
                vec![("format", format.as_str().to_owned())]
            } else {
                Vec::new()
            };
            (Method::GET, path(&target, &extra), None)
        }
        ReferenceCommand::Clear { model, upstream } => {
            let target = Target {
                model: model.clone(),
                upstream: upstream.clone(),
            };
            anyhow::ensure!(
                target.model.is_some(),
                "say which reference to clear with --model (see `tokentap reference show`)"
            );
            (Method::DELETE, path(&target, &[]), None)
        }
    };
    let pinning = method == Method::PUT;
    let method_shown = method.clone();
    let (status, answer) = admin.send(method, &path, body).await?;
    if !status.is_success() {
        return Err(admin.refusal(&method_shown, &path, status, &answer));
    }
    if pinning {
        // Said on stderr as well: a pinned reference with cells drift will not compare.
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&answer) {
            for warning in value["warnings"].as_array().into_iter().flatten() {
                if let Some(text) = warning.as_str() {
                    eprintln!("warning: {text}");
                }
            }
        }
    }
    print!("{}", String::from_utf8_lossy(&answer));
    Ok(ExitCode::SUCCESS)
}
