//! Typed errors of the core. Every variant names the field (or preset kind) and the offending
//! value, so that every front end (Python, CLI, gRPC) can print one clear line and map the failure
//! to its own vocabulary (exception class, exit code, status code) from one table.
//!
//! Values that come from the caller are echoed bounded: at most
//! [`MAX_ECHO_CHARS`](crate::limits::MAX_ECHO_CHARS) characters and `…` (see [`echo`]), and the
//! longer texts (reasons, what is allowed) at most [`MAX_DETAIL_CHARS`] — in the message and in
//! [`Error::context`] — so a 20,000-character preset name cannot make a 20 KB message (gRPC
//! carries status messages in a 16 KiB header).

use thiserror::Error;

use crate::limits::MAX_ECHO_CHARS;

/// Characters of a reason or an `allowed` text kept in a message (ours, but they may quote
/// caller input: a parser's complaint about a data file).
pub const MAX_DETAIL_CHARS: usize = 1024;

/// `text` cut to its first `max` characters and `…` when longer.
pub fn clip(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => std::borrow::Cow::Borrowed(text),
        Some((end, _)) => std::borrow::Cow::Owned(format!("{}…", &text[..end])),
    }
}

/// A caller's value as echoed in a message: at most [`MAX_ECHO_CHARS`] characters and `…`.
pub fn echo(text: &str) -> std::borrow::Cow<'_, str> {
    clip(text, MAX_ECHO_CHARS)
}

/// A reason or `allowed` text as kept in a message: at most [`MAX_DETAIL_CHARS`] characters.
pub fn detail(text: &str) -> std::borrow::Cow<'_, str> {
    clip(text, MAX_DETAIL_CHARS)
}

/// Everything that can go wrong in the core.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum Error {
    /// A field has a value outside its allowed range or set.
    #[error("invalid {}: {} (allowed: {})", echo(.field), echo(.value), detail(.allowed))]
    InvalidField {
        field: String,
        value: String,
        allowed: String,
    },
    /// A preset name that is not in the built-in tables.
    #[error("unknown {kind} preset '{}' (available: {})", echo(.name), detail(.available))]
    UnknownPreset {
        kind: &'static str,
        name: String,
        available: String,
    },
    /// A Hugging Face config.json that cannot be mapped onto the model descriptor.
    #[error("cannot import Hugging Face config: {}: {}", echo(.field), detail(.reason))]
    HfConfig { field: String, reason: String },
    /// A data file (preset table, calibration file) that does not parse.
    #[error("cannot parse {}: {}", detail(.what), detail(.reason))]
    DataFile { what: String, reason: String },
    /// A validation case (published run) that does not fit the case schema.
    #[error("validation case {index} ({}): {}", echo(.id), detail(.reason))]
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
    /// The caller's cancel flag was raised (a search, evaluation or explanation).
    #[error("cancelled")]
    Cancelled,
    /// The caller's deadline passed before the call finished.
    #[error("deadline exceeded after {elapsed_s:.3} s")]
    DeadlineExceeded { elapsed_s: f64 },
}

impl Error {
    /// Shorthand for [`Error::InvalidField`]; the value is kept bounded ([`echo`]).
    pub fn invalid(
        field: impl Into<String>,
        value: impl ToString,
        allowed: impl Into<String>,
    ) -> Self {
        Error::InvalidField {
            field: field.into(),
            value: echo(&value.to_string()).into_owned(),
            allowed: allowed.into(),
        }
    }

    /// Every [`Error::kind`], in the order of the variants: the bindings' error tables must
    /// cover exactly these (checked by their tests).
    pub const KINDS: [&'static str; 9] = [
        "invalid_field",
        "unknown_preset",
        "hf_config",
        "data_file",
        "invalid_case",
        "space_too_large",
        "too_many_plans",
        "cancelled",
        "deadline_exceeded",
    ];

    /// A short machine-readable name of the variant (used by the bindings' error tables).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidField { .. } => "invalid_field",
            Error::UnknownPreset { .. } => "unknown_preset",
            Error::HfConfig { .. } => "hf_config",
            Error::DataFile { .. } => "data_file",
            Error::InvalidCase { .. } => "invalid_case",
            Error::SpaceTooLarge { .. } => "space_too_large",
            Error::TooManyPlans { .. } => "too_many_plans",
            Error::Cancelled => "cancelled",
            Error::DeadlineExceeded { .. } => "deadline_exceeded",
        }
    }

    /// The typed context of an error about one input field: `(field, value, allowed)`, each
    /// bounded as in the message, `None` where the error has no such part. A front end turns it
    /// into its own field-violation detail (Python exception attributes, gRPC `BadRequest`).
    pub fn context(&self) -> (Option<String>, Option<String>, Option<String>) {
        let own = |s: std::borrow::Cow<'_, str>| Some(s.into_owned());
        match self {
            Error::InvalidField {
                field,
                value,
                allowed,
            } => (own(echo(field)), own(echo(value)), own(detail(allowed))),
            Error::UnknownPreset {
                kind,
                name,
                available,
            } => (
                Some(format!("{kind}.preset")),
                own(echo(name)),
                own(detail(available)),
            ),
            Error::HfConfig { field, .. } => (own(echo(field)), None, None),
            Error::DataFile { .. }
            | Error::InvalidCase { .. }
            | Error::SpaceTooLarge { .. }
            | Error::TooManyPlans { .. }
            | Error::Cancelled
            | Error::DeadlineExceeded { .. } => (None, None, None),
        }
    }
}

/// Result alias of the core.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    /// One error of every variant (the match makes a new variant a compile error here).
    fn one_of_each() -> Vec<Error> {
        let all = vec![
            Error::invalid("model.layers", 0, "1..=65536"),
            Error::UnknownPreset {
                kind: "model",
                name: "x".into(),
                available: "y".into(),
            },
            Error::HfConfig {
                field: "model_type".into(),
                reason: "missing".into(),
            },
            Error::DataFile {
                what: "gpus.toml".into(),
                reason: "bad".into(),
            },
            Error::InvalidCase {
                index: 0,
                id: "x".into(),
                reason: "bad".into(),
            },
            Error::SpaceTooLarge {
                candidates: 2,
                limit: 1,
            },
            Error::TooManyPlans { limit: 1 },
            Error::Cancelled,
            Error::DeadlineExceeded { elapsed_s: 1.0 },
        ];
        for e in &all {
            match e {
                Error::InvalidField { .. }
                | Error::UnknownPreset { .. }
                | Error::HfConfig { .. }
                | Error::DataFile { .. }
                | Error::InvalidCase { .. }
                | Error::SpaceTooLarge { .. }
                | Error::TooManyPlans { .. }
                | Error::Cancelled
                | Error::DeadlineExceeded { .. } => {}
            }
        }
        all
    }

    #[test]
    fn kinds_are_listed_once_each_in_variant_order() {
        let kinds: Vec<&str> = one_of_each().iter().map(Error::kind).collect();
        assert_eq!(kinds, Error::KINDS.to_vec());
    }

    #[test]
    fn echoed_values_are_bounded() {
        let long = "x".repeat(20_000);
        let e = Error::invalid("model.name", &long, "anything");
        let text = e.to_string();
        assert!(text.len() < 200, "{}", text.len());
        assert!(text.contains(&format!("{}…", "x".repeat(MAX_ECHO_CHARS))));
        // Built without the shorthand, the message is bounded all the same.
        let e = Error::UnknownPreset {
            kind: "model",
            name: long.clone(),
            available: "llama3-8b".into(),
        };
        assert!(e.to_string().len() < 200);
        assert_eq!(e.context().1.unwrap().chars().count(), MAX_ECHO_CHARS + 1);
        let e = Error::HfConfig {
            field: "model_type".into(),
            reason: long,
        };
        assert!(e.to_string().len() < MAX_DETAIL_CHARS + 100);
        // Short values are left alone; clipping is idempotent and cuts on characters.
        assert_eq!(echo("abc"), "abc");
        let once = echo(&"é".repeat(100)).into_owned();
        assert_eq!(echo(&once), once);
    }

    #[test]
    fn context_names_field_value_and_allowed() {
        let e = Error::invalid("plan.pp", 2_147_483_648u64, "1..=1048576");
        assert_eq!(
            e.context(),
            (
                Some("plan.pp".into()),
                Some("2147483648".into()),
                Some("1..=1048576".into())
            )
        );
        assert_eq!(Error::Cancelled.context(), (None, None, None));
    }
}
