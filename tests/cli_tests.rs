#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]
//! The built `tokentap` binary as a person meets it: shell completions, `--version` with the
//! commit, error texts that say their cause once, help texts that match what is accepted, and
//! the aligned table a sweep ends with (at most 120 columns, one progress line per cell and no
//! escape codes when stderr is not a terminal).

use std::path::Path;
use std::process::{Command, Output, Stdio};

use tokentap::sim::{Profile, SimOptions, SimServer};

fn tokentap(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tokentap"))
        .args(args)
        .env_remove("TOKENTAP_ADMIN__TOKEN")
        .env_remove("TOKENTAP_CONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

fn widest_line(text: &str) -> usize {
    text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
}

/// The embedded simulator with the Step-3.7 seed page's profile, on a loopback port.
async fn step_simulator() -> tokentap::sim::SimHandle {
    SimServer::start(
        Profile::builtin("step-3.7-flash-fp8-4x-rtx-pro-6000").unwrap(),
        SimOptions::default(),
    )
    .await
    .unwrap()
}

/// A two-request Mooncake trace in `dir` (the second shares the first's prefix blocks 0 and 1).
fn two_request_trace(dir: &std::path::Path) -> std::path::PathBuf {
    let trace = dir.join("trace.jsonl");
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"input_length\": 2000, \"output_length\": 20, \"hash_ids\": [0, 1, 2, 3]}\n\
         {\"timestamp\": 100, \"input_length\": 2000, \"output_length\": 20, \"hash_ids\": [0, 1, 5, 6]}\n",
    )
    .unwrap();
    trace
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tokentap-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn completions_for_bash_zsh_and_fish() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef tokentap"),
        ("fish", "complete -c tokentap"),
    ] {
        let output = tokentap(&["completions", shell]);
        assert!(output.status.success(), "{shell}: {output:?}");
        let script = stdout(&output);
        assert!(script.contains(marker), "{shell}: {script}");
        for command in ["serve", "sweep", "demo", "reference", "completions"] {
            assert!(script.contains(command), "{shell} lacks {command}");
        }
        assert!(script.contains("log-format"), "{shell}: the global flag");
    }
    let unknown = tokentap(&["completions", "tcsh"]);
    assert!(!unknown.status.success());
    assert!(stderr(&unknown).contains("bash"), "{}", stderr(&unknown));
}

#[test]
fn version_names_the_commit() {
    let output = tokentap(&["--version"]);
    assert!(output.status.success());
    let text = stdout(&output);
    let line = text.trim();
    let commit = line
        .strip_prefix(&format!("tokentap {} (commit ", env!("CARGO_PKG_VERSION")))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{line}"));
    let git = Command::new("git")
        .args(["rev-parse", "--short=10", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    match git {
        Ok(git) if git.status.success() => {
            assert_eq!(commit, String::from_utf8(git.stdout).unwrap().trim());
        }
        _ => assert_eq!(commit, "unknown"),
    }
    // Subcommands say the same.
    let sub = stdout(&tokentap(&["sweep", "--version"]));
    assert!(sub.trim().ends_with(&format!("(commit {commit})")), "{sub}");
}

#[test]
fn a_missing_or_broken_config_file_is_explained_once() {
    let missing = tokentap(&["serve", "-c", "/nonexistent/tokentap.toml"]);
    assert!(!missing.status.success());
    let text = stderr(&missing);
    assert!(
        text.contains("cannot read config file /nonexistent/tokentap.toml"),
        "{text}"
    );
    assert_eq!(
        text.matches("No such file or directory").count(),
        1,
        "{text}"
    );

    let dir = temp_dir("config");
    let broken = dir.join("broken.toml");
    std::fs::write(&broken, "[proxy]\nlisten = [\n").unwrap();
    let output = tokentap(&["serve", "-c", broken.to_str().unwrap()]);
    assert!(!output.status.success());
    let text = stderr(&output);
    assert!(text.contains("is not valid TOML"), "{text}");
    assert_eq!(text.matches("TOML parse error").count(), 1, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn help_texts_match_what_is_accepted() {
    // `sweep` needs one of --target and --admin, and says so.
    let bare = tokentap(&["sweep"]);
    assert!(!bare.status.success());
    let text = stderr(&bare);
    assert!(text.contains("--target <URL>|--admin <URL>"), "{text}");
    // `--window 7d` is offered by `workload export` and accepted: what fails is the store.
    let help = stdout(&tokentap(&["workload", "export", "--help"]));
    assert!(help.contains("7d"), "{help}");
    let dir = temp_dir("window");
    let export = tokentap(&[
        "workload",
        "export",
        "--window",
        "7d",
        "--store",
        dir.join("absent").to_str().unwrap(),
    ]);
    assert!(!export.status.success());
    assert!(!stderr(&export).contains("--window"), "{}", stderr(&export));
    let _ = std::fs::remove_dir_all(&dir);
    // `reference show` and `clear` describe their own --model.
    let show = stdout(&tokentap(&["reference", "show", "--help"]));
    assert!(!show.contains("Default for pin"), "{show}");
    assert!(
        show.contains("possible values") || show.contains("status"),
        "{show}"
    );
    let clear = tokentap(&["reference", "clear"]);
    assert!(!clear.status.success());
    assert!(stderr(&clear).contains("--model"), "{}", stderr(&clear));
    let clear_help = stdout(&tokentap(&["reference", "clear", "--help"]));
    assert!(!clear_help.contains("Default for pin"), "{clear_help}");
}

#[test]
fn matrix_show_prints_the_seed_grid_within_120_columns_and_by_default_on_a_terminal() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/seeds");
    for entry in std::fs::read_dir(seeds).unwrap() {
        let path = entry.unwrap().path();
        let doc = tokentap::matrix::load(&path).unwrap();
        let grid = stdout(&tokentap(&[
            "matrix",
            "show",
            "--format",
            "table",
            path.to_str().unwrap(),
        ]));
        assert!(widest_line(&grid) <= 120, "{}\n{grid}", path.display());
        assert!(!grid.contains('|') && !grid.contains('\u{1b}'), "{grid}");
        // Contexts as rows, concurrency as columns, as on the seed page.
        let header = grid
            .lines()
            .skip_while(|l| !l.starts_with("Sustained decode"))
            .find(|l| l.starts_with("Context"))
            .expect("the decode grid's header");
        let columns: Vec<String> = doc.concurrencies().iter().map(u32::to_string).collect();
        assert_eq!(
            header.split_whitespace().skip(1).collect::<Vec<_>>(),
            columns,
            "{grid}"
        );
        for context in doc.contexts() {
            let label = tokentap::matrix::units::context_label(context);
            let row = grid
                .lines()
                .skip_while(|l| !l.starts_with("Sustained decode"))
                .find(|l| l.split_whitespace().next() == Some(label.as_str()))
                .unwrap_or_else(|| panic!("a row for {label}: {grid}"));
            let cell = doc.cell(context, 1).unwrap();
            let rate = tokentap::matrix::units::format_rate(cell.total_tok_s.unwrap());
            assert_eq!(row.split_whitespace().nth(1), Some(rate.as_str()), "{row}");
        }
        // Status words stand in for figures, and the legend names only the statuses shown.
        let over = doc
            .decode
            .iter()
            .any(|c| c.status == tokentap::matrix::CellStatus::OverCapacity);
        assert_eq!(grid.contains("over cap:"), over, "{grid}");
        assert!(
            !grid.contains("error:") && !grid.contains("off target"),
            "{grid}"
        );
        assert!(grid.contains("Prefill · prompt tok/s over TTFT"), "{grid}");

        // On a terminal it is the default; written to a pipe, the page's Markdown.
        let on_terminal = Command::new("script")
            .args(["-qec"])
            .arg(format!(
                "{} matrix show {}",
                env!("CARGO_BIN_EXE_tokentap"),
                path.display()
            ))
            .arg("/dev/null")
            .env("COLUMNS", "120")
            .stdin(Stdio::null())
            .output()
            .expect("script (util-linux) gives the command a terminal");
        let on_terminal = stdout(&on_terminal);
        assert!(
            on_terminal.contains("Sustained decode · total tok/s"),
            "{on_terminal}"
        );
        let piped = stdout(&tokentap(&["matrix", "show", path.to_str().unwrap()]));
        assert!(piped.contains("| Context |"), "{piped}");

        // With a capacity query, the capacity table fits too, "≥" where no cell above missed.
        let capacity = stdout(&tokentap(&[
            "matrix",
            "show",
            "--format",
            "table",
            "--slo",
            "ttft=1s",
            path.to_str().unwrap(),
        ]));
        assert!(widest_line(&capacity) <= 120, "{capacity}");
        assert!(capacity.contains("Capacity under an SLO"), "{capacity}");

        // Every figure of every cell stays available as the flat list.
        let output = tokentap(&["matrix", "show", "--format", "list", path.to_str().unwrap()]);
        assert!(output.status.success(), "{output:?}");
        let text = stdout(&output);
        assert!(widest_line(&text) <= 120, "{}\n{text}", path.display());
        assert!(
            text.contains("Total tok/s") && text.contains("Valid"),
            "{text}"
        );
        assert!(!text.contains('|') && !text.contains('\u{1b}'), "{text}");
        // Aligned: every row of the decode table is as long as its rule or shorter.
        let decode = &text[text.find("Context").unwrap()..];
        let rule = decode.lines().nth(1).unwrap();
        assert!(rule.chars().all(|c| c == '-' || c == ' '), "{rule}");
        let columns: Vec<usize> = rule
            .char_indices()
            .filter(|(i, c)| *c == ' ' && rule[i + 1..].starts_with('-'))
            .map(|(i, _)| i)
            .collect();
        for row in decode.lines().skip(2).take_while(|l| !l.is_empty()) {
            for at in &columns {
                assert_eq!(
                    row.chars().nth(*at),
                    Some(' '),
                    "column gap at {at} in {row:?}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_ends_with_an_aligned_table_and_logs_one_line_per_cell_off_a_terminal() {
    let sim = step_simulator().await;
    let dir = temp_dir("sweep");
    let url = sim.base_url();
    let out = dir.join("out");
    let output = tokio::task::spawn_blocking(move || {
        tokentap(&[
            "sweep",
            "--target",
            &url,
            "--contexts",
            "8K",
            "--concurrency",
            "1,2",
            "--cell-duration",
            "500ms",
            "--max-output",
            "64",
            "--format",
            "list",
            "--out",
            out.to_str().unwrap(),
        ])
    })
    .await
    .unwrap();
    assert!(output.status.success(), "{output:?}");
    let table = stdout(&output);
    assert!(widest_line(&table) <= 120, "{table}");
    let decode = &table[table.find("Total tok/s").unwrap()..];
    let rows: Vec<&str> = decode
        .lines()
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("8K "))
        .collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(rows.iter().all(|r| r.contains("Valid")), "{table}");
    // The tails of every decode cell follow.
    let tails = &table[table.find("Tails per cell").expect("the tails table")..];
    assert!(
        tails.contains("TTFT p99") && tails.contains("ITL p90"),
        "{table}"
    );
    assert_eq!(
        tails.lines().filter(|l| l.starts_with("8K ")).count(),
        2,
        "{table}"
    );
    let log = stderr(&output);
    eprintln!("{log}\n{table}");
    assert!(!log.contains('\r') && !log.contains('\u{1b}'), "{log:?}");
    // One line per cell (the scout and two decode cells), not one per phase or per second.
    let running = log.lines().filter(|l| l.starts_with("running")).count();
    assert!((1..=4).contains(&running), "{log}");
    for cell in ["8K × 1", "8K × 2"] {
        assert_eq!(
            log.lines().filter(|l| l.contains(cell)).count(),
            1,
            "{cell}: {log}"
        );
    }
    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The first line of a child's piped stderr that `wanted` takes, within 30 s; the child is
/// stopped before returning.
fn stderr_line_then_stop(
    mut child: std::process::Child,
    wanted: impl Fn(&str) -> bool + Send + 'static,
) -> Option<String> {
    use std::io::{BufRead, BufReader};
    let stderr = child.stderr.take()?;
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if wanted(&line) {
                let _ = send.send(line);
                break;
            }
        }
    });
    let line = receive
        .recv_timeout(std::time::Duration::from_secs(30))
        .ok();
    let _ = child.kill();
    let _ = child.wait();
    line
}

/// `tokentap [global flags] serve … [serve flags]` on loopback (no store, no metrics scrape),
/// its stderr a pipe, logging at info.
fn spawn_serve(global: &[&str], serve: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_tokentap"))
        .args(global)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--set",
            "upstream.metrics_interval=0",
            "--set",
            "upstream.sends_usage_unasked=no",
            "--set",
            "store.data_dir=",
        ])
        .args(serve)
        .env_remove("NO_COLOR")
        .env_remove("TOKENTAP_CONFIG")
        .env_remove("TOKENTAP_ADMIN__TOKEN")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The first line of `tokentap [global flags] serve …` on loopback whose stderr is a pipe, once
/// it is forwarding; the process is stopped before returning.
fn first_serve_line(global: &[&str], serve: &[&str]) -> String {
    let child = spawn_serve(global, serve);
    // The first line it logs at all.
    let line =
        stderr_line_then_stop(child, |_| true).expect("tokentap serve logged a line within 30 s");
    assert!(
        line.contains("tokentap is forwarding"),
        "the first line says where it forwards: {line}"
    );
    line
}

#[test]
fn serve_logs_the_slo_and_the_evidence_rule_it_judges_with() {
    let child = spawn_serve(&[], &["--set", "slo.ttft=2s"]);
    let line = stderr_line_then_stop(child, |l| l.contains("judging:"))
        .expect("tokentap serve logged what it judges with within 30 s");
    assert!(line.contains("SLO TTFT ≤ 2 s on "), "{line}");
    assert!(line.contains("completed requests"), "{line}");
}

#[test]
fn logs_off_a_terminal_have_no_colour_codes_and_json_is_one_object_per_line() {
    let text = first_serve_line(&[], &[]);
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(text.contains(" INFO "), "{text}");
    // One short line: the page (no token: `/`), the data port, the admin port, the upstream.
    assert!(text.contains("; page http://127.0.0.1:"), "{text}");
    assert!(
        text.contains(" proxy=127.0.0.1:") && text.contains(" admin=127.0.0.1:"),
        "{text}"
    );
    assert!(text.contains(" upstream=http://"), "{text}");
    assert!(
        text.chars().count() <= 240,
        "{} characters: {text}",
        text.len()
    );
    // With a token, the page is opened at its login.
    let guarded = first_serve_line(&[], &["--set", "admin.token=first-line-token"]);
    assert!(guarded.contains("/login proxy="), "{guarded}");
    let json = first_serve_line(&["--log-format", "json"], &[]);
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["level"], "INFO", "{json}");
    assert!(
        value["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("tokentap is forwarding")),
        "{json}"
    );
    assert!(value["fields"]["proxy"].as_str().is_some(), "{json}");
}

/// `tokentap args…` with `env` set, killed if it has not ended within `limit` (a `serve` whose
/// listener did bind would run on; the test then fails): its output.
fn tokentap_within(args: &[&str], env: &[(&str, &str)], limit: std::time::Duration) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tokentap"));
    command
        .args(args)
        .env_remove("TOKENTAP_ADMIN__TOKEN")
        .env_remove("TOKENTAP_CONFIG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    if crate::common::wait::child_exit(&mut child, limit).is_none() {
        let _ = child.kill();
        let output = child.wait_with_output().unwrap();
        panic!("still running after {limit:?}: {output:?}");
    }
    child.wait_with_output().unwrap()
}

/// A loopback port nothing listens on (bound, then let go).
fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[test]
fn a_sweep_at_a_dead_port_says_nothing_listens_there_in_one_line() {
    let url = format!("http://127.0.0.1:{}", dead_port());
    let limit = std::time::Duration::from_secs(30);
    for extra in [&[][..], &["--dry-run"][..]] {
        let mut args = vec!["sweep", "--target", url.as_str()];
        args.extend_from_slice(extra);
        let output = tokentap_within(&args, &[], limit);
        assert!(!output.status.success(), "{extra:?}: {output:?}");
        let text = stderr(&output);
        assert_eq!(
            text,
            format!("error: nothing is listening at {url} (connection refused): is the inference server up, and is this its port? (sglang listens on 30000 by default, vLLM on 8000)\n"),
            "{extra:?}: one line, no warnings before it"
        );
    }
    // `replay --target` checks its server the same way.
    let dir = temp_dir("replay-dead");
    let trace = dir.join("trace.jsonl");
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 8, \"hash_ids\": [0]}\n",
    )
    .unwrap();
    let output = tokentap_within(
        &[
            "replay",
            trace.to_str().unwrap(),
            "--target",
            url.as_str(),
            "--out",
            dir.join("out").to_str().unwrap(),
        ],
        &[],
        limit,
    );
    assert!(!output.status.success(), "{output:?}");
    assert!(
        stderr(&output).contains(&format!(
            "nothing is listening at {url} (connection refused)"
        )),
        "{}",
        stderr(&output)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_given_an_inference_server_as_admin_says_what_admin_takes() {
    let upstream = crate::common::ScriptedUpstream::start(|_| {
        crate::common::Script::json(404, r#"{"detail":"Not Found"}"#)
    })
    .await;
    let sim = step_simulator().await;
    let cases = [
        (upstream.url(), vec![], "POST /sweeps"),
        (
            upstream.url(),
            vec!["--dry-run"],
            "POST /sweeps?dry_run=true",
        ),
        (sim.base_url(), vec![], "POST /sweeps"),
    ];
    for (url, extra, asked) in cases {
        let output = tokio::task::spawn_blocking({
            let url = url.clone();
            move || {
                let mut args = vec!["sweep", "--admin", url.as_str()];
                args.extend(extra);
                tokentap_within(&args, &[], std::time::Duration::from_secs(60))
            }
        })
        .await
        .unwrap();
        assert!(!output.status.success(), "{url}: {output:?}");
        let url = url.trim_end_matches('/');
        assert_eq!(
            stderr(&output),
            format!("error: {url} is not a tokentap admin listener (it answered 404 to {asked}: {{\"detail\":\"Not Found\"}}); --admin takes the proxy's admin address (default 127.0.0.1:9464), --target takes the inference server\n"),
        );
    }
    sim.shutdown().await;
}

/// `reference` shares the sweep's admin client: an inference server given as `--admin` is named
/// as such, tokentap's own 404 ("no reference pinned …") is not mistaken for one, and an admin
/// address where nothing listens says so for both commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_client_says_when_admin_is_not_tokentap_or_not_there() {
    let upstream = crate::common::ScriptedUpstream::start(|_| {
        crate::common::Script::json(404, r#"{"detail":"Not Found"}"#)
    })
    .await;
    let url = upstream.url().trim_end_matches('/').to_owned();
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        format!("http://{addr}")
    };
    let run = |args: Vec<String>| async move {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            tokentap_within(&args, &[], std::time::Duration::from_secs(60))
        })
        .await
        .unwrap()
    };
    let output = run(vec![
        "reference".into(),
        "show".into(),
        "--admin".into(),
        url.clone(),
    ])
    .await;
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains(&format!("{url} is not a tokentap admin listener")),
        "{}",
        stderr(&output)
    );
    for args in [
        vec!["reference", "show", "--admin", dead.as_str()],
        vec!["sweep", "--admin", dead.as_str()],
    ] {
        let output = run(args.iter().map(|a| (*a).to_owned()).collect()).await;
        assert!(!output.status.success());
        let text = stderr(&output);
        assert!(
            text.starts_with(&format!("error: cannot connect to {dead} (")),
            "{args:?}: {text}"
        );
        assert!(
            text.contains("is `tokentap serve` running there?"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 1, "one line: {text}");
    }
}

#[test]
fn serve_says_which_flag_chooses_a_busy_port_and_names_vllm_only_for_8000() {
    use tokentap::app::serve::{bind_error, Listener};
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let port = busy.local_addr().unwrap().port();
    let serve = |listen: &str, admin: &str| {
        tokentap_within(
            &[
                "serve",
                "--upstream",
                "http://127.0.0.1:1",
                "--listen",
                listen,
                "--admin",
                admin,
                "--set",
                "upstream.metrics_interval=0",
                "--set",
                "store.data_dir=",
            ],
            &[],
            std::time::Duration::from_secs(30),
        )
    };
    let data = serve(&addr, "127.0.0.1:0");
    assert!(!data.status.success(), "{data:?}");
    assert_eq!(
        stderr(&data),
        format!("error: cannot listen on {addr}: another process holds port {port}; choose another with --listen or proxy.listen\n")
    );
    let admin = serve("127.0.0.1:0", &addr);
    assert!(!admin.status.success(), "{admin:?}");
    assert_eq!(
        stderr(&admin),
        format!("error: cannot listen on {addr}: another process holds port {port}; choose another with --admin or admin.listen\n")
    );
    drop(busy);

    // Port 8000 itself may be anyone's on the machine running the tests: the message alone.
    let in_use = std::io::Error::from(std::io::ErrorKind::AddrInUse);
    let at = |text: &str| text.parse::<std::net::SocketAddr>().unwrap();
    assert_eq!(
        bind_error(Listener::Data, at("0.0.0.0:8000"), &in_use, None),
        "cannot listen on 0.0.0.0:8000: another process holds port 8000 (vLLM also listens on 8000 by default); choose another with --listen or proxy.listen, e.g. --listen 0.0.0.0:8100"
    );
    // The host asked for is kept: 127.0.0.1 is not told to open 0.0.0.0 (issue 61.10).
    assert!(
        bind_error(Listener::Data, at("127.0.0.1:8000"), &in_use, None)
            .ends_with(", e.g. --listen 127.0.0.1:8100"),
    );
    assert!(bind_error(Listener::Data, at("[::1]:8000"), &in_use, None)
        .ends_with(", e.g. --listen [::1]:8100"));
    assert!(!bind_error(Listener::Data, at("0.0.0.0:8001"), &in_use, None).contains("vLLM"));
    assert!(!bind_error(Listener::Admin, at("127.0.0.1:8000"), &in_use, None).contains("vLLM"));
    assert_eq!(
        bind_error(
            Listener::Admin,
            at("127.0.0.1:8100"),
            &in_use,
            Some(at("127.0.0.1:8100"))
        ),
        "cannot listen on 127.0.0.1:8100: the data listener (--listen or proxy.listen) is on port 8100; give the admin listener another with --admin or admin.listen"
    );
    let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
    assert!(bind_error(Listener::Data, at("0.0.0.0:80"), &denied, None)
        .starts_with("cannot listen on 0.0.0.0:80 (chosen by --listen or proxy.listen): "),);
}

#[test]
fn a_duration_without_a_unit_fails_alike_from_a_flag_a_file_and_the_environment() {
    let dir = temp_dir("no-unit");
    let file = dir.join("slo.toml");
    std::fs::write(&file, "[slo]\nttft = 500\n").unwrap();
    let file = file.to_str().unwrap();
    let serve = ["serve", "--upstream", "http://127.0.0.1:1"];
    let limit = std::time::Duration::from_secs(30);
    let reason = "key `slo.ttft`: `500` has no unit: write e.g. 500ms, 2s or 1m\n";
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, String);
    let cases: Vec<Case> = vec![
        (
            [&serve[..], &["--set", "slo.ttft=500"]].concat(),
            vec![],
            format!("error: flag --set slo.ttft: {reason}"),
        ),
        (
            [&serve[..], &["-c", file]].concat(),
            vec![],
            format!("error: config file {file}: {reason}"),
        ),
        (
            serve.to_vec(),
            vec![("TOKENTAP_SLO__TTFT", "500")],
            format!("error: environment variable TOKENTAP_SLO__TTFT: {reason}"),
        ),
        (
            vec![
                "sweep",
                "--target",
                "http://127.0.0.1:1",
                "--set",
                "slo.ttft=500",
            ],
            vec![],
            format!("error: flag --set slo.ttft: {reason}"),
        ),
    ];
    for (args, env, want) in cases {
        let output = tokentap_within(&args, &env, limit);
        assert!(!output.status.success(), "{args:?}: {output:?}");
        assert_eq!(stderr(&output), want, "{args:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tokentap simulate` says which server it imitates as `--dialect` spells it.
#[test]
fn the_simulator_names_its_dialect_as_the_flag_spells_it() {
    for dialect in ["sglang", "vllm"] {
        let child = Command::new(env!("CARGO_BIN_EXE_tokentap"))
            .args(["simulate", "--listen", "127.0.0.1:0", "--dialect", dialect])
            .env_remove("TOKENTAP_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let line = stderr_line_then_stop(child, |line| line.contains("listening on"))
            .expect("the simulator says where it listens within 30 s");
        assert!(line.contains(&format!("({dialect} dialect)")), "{line}");
    }
}

/// `matrix capacity` and `matrix diff` print the terminal table on a terminal (within 120
/// columns, no Markdown escapes) and Markdown in a pipe, as `matrix show` does.
#[test]
fn capacity_and_diff_choose_the_table_on_a_terminal_and_markdown_in_a_pipe() {
    let seeds = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/seeds");
    let mut pages: Vec<_> = std::fs::read_dir(seeds)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    pages.sort();
    let (a, b) = (
        pages[0].display().to_string(),
        pages[1].display().to_string(),
    );
    let on_a_terminal = |args: &str| {
        let output = Command::new("script")
            .args(["-qec"])
            .arg(format!("{} {args}", env!("CARGO_BIN_EXE_tokentap")))
            .arg("/dev/null")
            .env("COLUMNS", "120")
            .env_remove("TOKENTAP_CONFIG")
            .stdin(Stdio::null())
            .output()
            .expect("script (util-linux) gives the command a terminal");
        assert!(output.status.success(), "{output:?}");
        stdout(&output)
    };
    for args in [
        format!("matrix capacity {a} --slo ttft=2s,tbt=50ms"),
        format!("matrix diff {a} {b}"),
    ] {
        let shown = on_a_terminal(&args);
        assert!(widest_line(&shown) <= 120, "{args}:\n{shown}");
        assert!(
            !shown.contains("| ") && !shown.contains("\\>"),
            "{args}: Markdown on a terminal:\n{shown}"
        );
        let words: Vec<&str> = args.split(' ').collect();
        let piped = stdout(&tokentap(&words));
        assert!(
            piped.contains("| "),
            "{args}: not Markdown in a pipe:\n{piped}"
        );
    }
}

/// Runs `tokentap ARGS` (one shell word list) on a terminal (`script` gives it a pty, 120
/// columns) and returns what the terminal showed (stdout and stderr together).
fn on_a_pty(args: &str) -> String {
    on_a_pty_raw(args).replace('\r', "")
}

/// What a command printed on a terminal (stdout and stderr both), as the terminal got it:
/// live progress lines redraw with `\r` and escape sequences.
fn on_a_pty_raw(args: &str) -> String {
    let output = Command::new("script")
        .args(["-qec"])
        .arg(format!("{} {args}", env!("CARGO_BIN_EXE_tokentap")))
        .arg("/dev/null")
        .env("COLUMNS", "120")
        .env_remove("TOKENTAP_CONFIG")
        .env_remove("TOKENTAP_ADMIN__TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("script (util-linux) gives the command a terminal");
    assert!(output.status.success(), "{args}: {output:?}");
    stdout(&output)
}

/// Each line a terminal shows of `raw`: split at line feeds and carriage returns (a redrawn
/// progress line), escape sequences (colour, cursor moves, line clears) taken out.
fn screen_lines(raw: &str) -> Vec<String> {
    let mut lines = vec![String::new()];
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' | '\r' => lines.push(String::new()),
            '\u{1b}' => {
                // CSI: ESC [ parameters… final byte in @..~; other escapes are two characters.
                if chars.next_if_eq(&'[').is_some() {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                } else {
                    chars.next();
                }
            }
            c if c.is_control() => {}
            c => lines.last_mut().unwrap().push(c),
        }
    }
    lines
}

/// Issue 45.3: `fleet compare` and `replay` print the terminal table on a terminal, every line
/// within 120 columns and the files written one path a line (never wrapped mid-name), and
/// Markdown in a pipe, as `matrix show` and `matrix capacity` do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_compare_and_replay_choose_the_table_on_a_terminal_and_markdown_in_a_pipe() {
    use crate::common::{Script, ScriptedUpstream};
    // A stand-in Prometheus: every query answers one sample, model m in the 8K × 1 cell.
    let prometheus = ScriptedUpstream::start(|_| {
        Script::json(
            200,
            r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"model":"m","context_bucket":"8K","concurrency_bucket":"1","outcome":"ok","slo":"met"},"value":[1700000000,"12"]}]}}"#,
        )
    })
    .await;
    let compare = format!(
        "fleet compare --prometheus {} --baseline 3f2a9c01b7de --candidate 77aa01bc02de --window 10m",
        prometheus.url()
    );
    let dir = temp_dir("pty-45");
    let trace = two_request_trace(&dir);
    // A long output folder: the written paths would pass 120 columns side by side.
    let out = dir.join("an-output-folder-with-a-long-name-for-the-replay-of-this-trace");
    let replay = format!(
        "replay {} --simulate step-3.7-flash-fp8-4x-rtx-pro-6000 --quiet --max-duration 10s --out {}",
        trace.display(),
        out.display()
    );
    let (compare_pty, compare_pipe, replay_pipe, replay_pty) = {
        let (compare, replay, baseline) = (
            compare.clone(),
            replay.clone(),
            out.join("replay.json").display().to_string(),
        );
        tokio::task::spawn_blocking(move || {
            let words = |args: &str| args.split(' ').map(str::to_owned).collect::<Vec<_>>();
            let piped = |args: &str| {
                let words = words(args);
                let words: Vec<&str> = words.iter().map(String::as_str).collect();
                let output = tokentap(&words);
                assert!(output.status.success(), "{args}: {output:?}");
                stdout(&output)
            };
            let compare_pty = on_a_pty(&compare);
            let compare_pipe = piped(&compare);
            let replay_pipe = piped(&replay);
            let replay_pty = on_a_pty(&format!("{replay} --baseline {baseline}"));
            (compare_pty, compare_pipe, replay_pipe, replay_pty)
        })
        .await
        .unwrap()
    };
    for (what, shown) in [("fleet compare", &compare_pty), ("replay", &replay_pty)] {
        assert!(widest_line(shown) <= 120, "{what}:\n{shown}");
        assert!(
            !shown.contains("| "),
            "{what}: Markdown on a terminal:\n{shown}"
        );
    }
    assert!(
        compare_pty.contains("Canary comparison: 77aa01bc02de ÷ 3f2a9c01b7de")
            && compare_pty.contains("Tok/s/stream"),
        "{compare_pty}"
    );
    assert!(compare_pipe.contains("| Context |"), "{compare_pipe}");
    assert!(
        replay_pipe.contains("| "),
        "not Markdown in a pipe:\n{replay_pipe}"
    );
    // The matrix, the diff, then each file on its own line.
    assert!(replay_pty.contains("Each figure is B ÷ A"), "{replay_pty}");
    assert!(
        replay_pty.contains("tokentap replay: wrote\n"),
        "{replay_pty}"
    );
    for name in ["replay.json", "replay.md", "diff.json"] {
        let path = out.join(name).display().to_string();
        assert!(
            replay_pty.lines().any(|l| l.trim() == path),
            "{name} on a line of its own:\n{replay_pty}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 45.3: on a 120-column terminal no line passes 120 columns, progress and log lines on
/// stderr included: a sweep's live line and its "wrote" lines, a replay's opening lines, its
/// progress and summary (the table tests above run `--quiet`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_a_sweep_and_a_replay_show_on_a_terminal_fits_120_columns() {
    let sim = step_simulator().await;
    let dir = temp_dir("pty-stderr");
    let trace = two_request_trace(&dir);
    // Long folder names: the written paths are the longest lines either command prints.
    let sweep_out =
        dir.join("a-sweep-output-folder-with-a-long-name-to-show-where-paths-would-wrap");
    let replay_out =
        dir.join("a-replay-output-folder-with-a-long-name-to-show-where-paths-would-wrap");
    let sweep = format!(
        "sweep --target {} --contexts 8K --concurrency 1,2 --cell-duration 500ms --max-output 64 --out {}",
        sim.base_url(),
        sweep_out.display()
    );
    let replay = format!(
        "replay {} --simulate step-3.7-flash-fp8-4x-rtx-pro-6000 --max-duration 10s --out {}",
        trace.display(),
        replay_out.display()
    );
    let shown = tokio::task::spawn_blocking(move || {
        [sweep, replay].map(|args| (args.clone(), on_a_pty_raw(&args)))
    })
    .await
    .unwrap();
    for (args, raw) in &shown {
        let lines = screen_lines(raw);
        let widest = lines.iter().map(|l| l.chars().count()).max().unwrap_or(0);
        assert!(
            widest <= 120,
            "{args}: a line of {widest} columns:\n{}",
            lines.join("\n")
        );
        assert!(
            lines.iter().any(|l| l.contains("tokentap ")),
            "{args}: its log lines were not on the terminal:\n{raw}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
