//! The errors the fake API server answers with, rendered as `meta/v1` `Status` objects with the
//! HTTP code and `reason` a real server uses for the same failure.

use serde_json::{Value, json};

use super::apply::Conflict;
use super::validation::FieldError;

/// Every failure a request can end in.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ApiError {
    #[error("{resource} \"{name}\" not found")]
    NotFound { resource: String, name: String },
    #[error("{resource} \"{name}\" already exists")]
    AlreadyExists { resource: String, name: String },
    #[error("Operation cannot be fulfilled on {resource} \"{name}\": {detail}")]
    Conflict {
        resource: String,
        name: String,
        detail: String,
    },
    #[error("Apply failed with {} conflict{}: {}", conflicts.len(), if conflicts.len() == 1 { "" } else { "s" }, conflicts.iter().map(|c| format!("conflict with {:?}: {}", c.manager, c.path)).collect::<Vec<_>>().join("\n"))]
    ApplyConflict { conflicts: Vec<Conflict> },
    #[error("{kind} \"{name}\" is invalid: {}", render_field_errors(errors))]
    Invalid {
        kind: String,
        name: String,
        errors: Vec<FieldError>,
    },
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Expired(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("Too large resource version: {requested}, current: {current}")]
    TooLargeResourceVersion { requested: u64, current: u64 },
    #[error("Internal error occurred: {0}")]
    Internal(String),
    /// A plain storage error the real server passes through as 500 with reason `Unknown`.
    #[error("{0}")]
    Unknown(String),
}

fn render_field_errors(errors: &[FieldError]) -> String {
    match errors {
        [one] => one.to_string(),
        many => format!(
            "[{}]",
            many.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

impl ApiError {
    pub fn code(&self) -> u16 {
        match self {
            Self::NotFound { .. } => 404,
            Self::AlreadyExists { .. } | Self::Conflict { .. } | Self::ApplyConflict { .. } => 409,
            Self::Invalid { .. } => 422,
            Self::BadRequest(_) => 400,
            Self::Expired(_) => 410,
            Self::UnsupportedMediaType(_) => 415,
            Self::MethodNotAllowed(_) => 405,
            Self::TooLargeResourceVersion { .. } => 504,
            Self::Internal(_) | Self::Unknown(_) => 500,
        }
    }

    /// The `Status.reason` of this error.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound { .. } => "NotFound",
            Self::AlreadyExists { .. } => "AlreadyExists",
            Self::Conflict { .. } | Self::ApplyConflict { .. } => "Conflict",
            Self::Invalid { .. } => "Invalid",
            Self::BadRequest(_) => "BadRequest",
            Self::Expired(_) => "Expired",
            Self::UnsupportedMediaType(_) => "UnsupportedMediaType",
            Self::MethodNotAllowed(_) => "MethodNotAllowed",
            Self::TooLargeResourceVersion { .. } => "Timeout",
            Self::Internal(_) => "InternalError",
            Self::Unknown(_) => "Unknown",
        }
    }

    /// The `Status` object a real server sends for this error.
    pub fn to_status(&self) -> Value {
        let details = match self {
            Self::NotFound { resource, name }
            | Self::AlreadyExists { resource, name }
            | Self::Conflict { resource, name, .. } => {
                let (kind, group) = resource.split_once('.').unwrap_or((resource, ""));
                json!({"name": name, "group": group, "kind": kind})
            }
            Self::ApplyConflict { conflicts } => json!({
                "causes": conflicts.iter().map(|c| json!({
                    "reason": "FieldManagerConflict",
                    "message": format!("conflict with {:?}", c.manager),
                    "field": c.path,
                })).collect::<Vec<_>>()
            }),
            Self::Invalid { kind, name, errors } => json!({
                "name": name,
                "kind": kind,
                "causes": errors.iter().map(|e| json!({
                    "reason": e.kind.as_str(),
                    "message": e.to_string(),
                    "field": e.field,
                })).collect::<Vec<_>>()
            }),
            Self::TooLargeResourceVersion { .. } => json!({
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1
            }),
            _ => Value::Null,
        };
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        if !details.is_null()
            && let Some(m) = status.as_object_mut()
        {
            m.insert("details".into(), details);
        }
        status
    }
}
