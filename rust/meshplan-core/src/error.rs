//! Typed errors of the core. Every variant names the field (or preset kind) and the offending
//! value, so that every front end (Python, CLI, gRPC) can print one clear line and map the failure
//! to its own vocabulary (exception class, exit code, status code) from one table.

use thiserror::Error;

/// Everything that can go wrong in the core.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum Error {
    /// A field has a value outside its allowed range or set.
    #[error("invalid {field}: {value} (allowed: {allowed})")]
    InvalidField {
        field: String,
        value: String,
        allowed: String,
    },
    /// A preset name that is not in the built-in tables.
    #[error("unknown {kind} preset '{name}' (available: {available})")]
    UnknownPreset {
        kind: &'static str,
        name: String,
        available: String,
    },
    /// A Hugging Face config.json that cannot be mapped onto the model descriptor.
    #[error("cannot import Hugging Face config: {field}: {reason}")]
    HfConfig { field: String, reason: String },
    /// A data file (preset table, calibration file) that does not parse.
    #[error("cannot parse {what}: {reason}")]
    DataFile { what: String, reason: String },
    /// A validation case (published run) that does not fit the case schema.
    #[error("validation case {index} ({id}): {reason}")]
    InvalidCase {
        index: usize,
        id: String,
        reason: String,
    },
    /// The search space holds more candidates than the configured cap.
    #[error("search space too large: {candidates} candidates exceed the limit of {limit} (constrain the degrees or raise max_candidates)")]
    SpaceTooLarge { candidates: u64, limit: u64 },
    /// A whole-space query found more feasible plans than its cap.
    #[error("feasible space too large: more than {limit} feasible plans (constrain the space or raise max_plans)")]
    TooManyPlans { limit: u64 },
    /// The caller's cancel flag was raised.
    #[error("search cancelled")]
    Cancelled,
    /// The caller's deadline passed before the search finished.
    #[error("search deadline exceeded after {elapsed_s:.3} s")]
    DeadlineExceeded { elapsed_s: f64 },
}

impl Error {
    /// Shorthand for [`Error::InvalidField`].
    pub fn invalid(
        field: impl Into<String>,
        value: impl ToString,
        allowed: impl Into<String>,
    ) -> Self {
        Error::InvalidField {
            field: field.into(),
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }

    /// A short machine-readable name of the variant (used by the bindings' error tables).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidField { .. } => "invalid_field",
            Error::UnknownPreset { .. } => "unknown_preset",
            Error::HfConfig { .. } => "hf_config",
            Error::DataFile { .. } => "data_file",
            Error::InvalidCase { .. } => "invalid_case",
            Error::SpaceTooLarge { .. } | Error::TooManyPlans { .. } => "space_too_large",
            Error::Cancelled => "cancelled",
            Error::DeadlineExceeded { .. } => "deadline_exceeded",
        }
    }
}

/// Result alias of the core.
pub type Result<T> = std::result::Result<T, Error>;
