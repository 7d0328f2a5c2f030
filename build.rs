//! Build script: the git commit for `tokentap --version`, as `TOKENTAP_GIT_COMMIT`.
//!
//! Taken from the `TOKENTAP_GIT_COMMIT` environment variable when it is set (the Docker build
//! passes it as a build argument: the image's context has no `.git`), else from
//! `git rev-parse --short HEAD`, else `unknown` (no git, no repository: a source tarball).
//! Reruns when HEAD moves: the HEAD file and the branch ref it names.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=TOKENTAP_GIT_COMMIT");
    let given = std::env::var("TOKENTAP_GIT_COMMIT")
        .ok()
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty());
    let commit = match given {
        Some(commit) => commit,
        None => {
            // HEAD and the ref it points to (a worktree's HEAD lives in its own git dir).
            for path in [
                git(&["rev-parse", "--git-path", "HEAD"]),
                git(&["symbolic-ref", "-q", "HEAD"])
                    .and_then(|name| git(&["rev-parse", "--git-path", &name])),
            ]
            .into_iter()
            .flatten()
            {
                if std::path::Path::new(&path).exists() {
                    println!("cargo:rerun-if-changed={path}");
                }
            }
            git(&["rev-parse", "--short=10", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    // Without any rerun-if-changed on a file, cargo would rerun this on every change of the
    // package; with one, only when it changes.
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=TOKENTAP_GIT_COMMIT={commit}");
}
