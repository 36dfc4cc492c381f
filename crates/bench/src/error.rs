//! The one error type of the benchmark. A failed fio *step* is not an error: it is recorded in the
//! report as a failed step. `BenchError` is for what stops the whole run (no fio, no target, no
//! output directory).

use std::path::PathBuf;

/// Why `basalt bench` could not run (or finish writing its report).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    #[error("cannot run {program}: {source}; install it (Debian: apt-get install {package})")]
    ToolMissing {
        program: String,
        package: String,
        source: std::io::Error,
    },
    #[error("{what} at {path}: {source}")]
    Io {
        what: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("fio output is not valid JSON ({reason}); the raw output is kept at {path}")]
    FioOutput { reason: String, path: PathBuf },
    #[error("the target could not be started: {0}")]
    TargetStart(String),
    #[error("the target has no volume #{index}: {hint}")]
    NotEnoughVolumes { index: usize, hint: String },
    #[error("invalid option: {0}")]
    InvalidOption(String),
    #[error("network probe failed: {0}")]
    Net(String),
    #[error("writing the report failed: {0}")]
    Report(String),
}

impl BenchError {
    /// Wraps an I/O error with what was being done and where.
    pub fn io(what: impl Into<String>, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BenchError::Io {
            what: what.into(),
            path: path.into(),
            source,
        }
    }
}
