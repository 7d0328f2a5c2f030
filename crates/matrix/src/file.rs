//! Reading a matrix file (or standard input) for the CLI and for other modules such as
//! `simulate --from-matrix`. The only part of `matrix/` that touches the file system.
use std::io::Read;
use std::path::{Path, PathBuf};

use super::doc::MatrixDoc;
use super::import::{parse_any, ImportError};

/// Files larger than this are refused: a matrix is a few hundred kilobytes at most.
pub const MAX_MATRIX_BYTES: u64 = 64 * 1024 * 1024;

/// Why a matrix file could not be loaded; the display names the file, the source names the line.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is larger than {MAX_MATRIX_BYTES} bytes; a matrix is far smaller", path.display())]
    TooLarge { path: PathBuf },
    #[error("{} is not UTF-8 text", path.display())]
    NotText { path: PathBuf },
    #[error("cannot import {}", path.display())]
    Import {
        path: PathBuf,
        #[source]
        source: ImportError,
    },
}

/// Reads a whole file as UTF-8 text; `-` means standard input.
pub fn read_text(path: &Path) -> Result<String, LoadError> {
    let read_error = |source| LoadError::Read {
        path: path.to_owned(),
        source,
    };
    let mut bytes = Vec::new();
    if path == Path::new("-") {
        std::io::stdin()
            .take(MAX_MATRIX_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
    } else {
        std::fs::File::open(path)
            .map_err(read_error)?
            .take(MAX_MATRIX_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
    }
    if bytes.len() as u64 > MAX_MATRIX_BYTES {
        return Err(LoadError::TooLarge {
            path: path.to_owned(),
        });
    }
    String::from_utf8(bytes).map_err(|_| LoadError::NotText {
        path: path.to_owned(),
    })
}

/// Loads a matrix from a seed page, our Markdown or our JSON (detected from the content).
pub fn load(path: &Path) -> Result<MatrixDoc, LoadError> {
    let text = read_text(path)?;
    parse_any(&text).map_err(|source| LoadError::Import {
        path: path.to_owned(),
        source,
    })
}
