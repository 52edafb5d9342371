//! API errors, typed inside and rendered at the edge in the shape of the protocol that was
//! spoken: OpenAI's `{"error": {"message", "type", "param", "code"}}` (Perch's own routes too)
//! or Anthropic's `{"type": "error", "error": {"type", "message"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::EngineError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: invalid_request_error, authentication_error, not_found_error, ...
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400 naming the offending field.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            code: Some("invalid_value"),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    pub fn code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn model_not_found(id: &str) -> ApiError {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "not_found_error",
                format!("The model `{id}` does not exist (see GET /v1/models)"),
            )
        }
    }

    pub fn busy(queued: usize) -> ApiError {
        ApiError {
            code: Some("rate_limit_exceeded"),
            retry_after: Some(1),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!(
                    "The engine is busy: {queued} requests are already waiting. Retry shortly."
                ),
            )
        }
    }

    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        self.code.unwrap_or(self.kind)
    }
}

impl ApiError {
    /// An engine error in OpenAI's shape; `prompt_param` is the field that holds the prompt
    /// (`messages` or `prompt`), named by errors about the prompt.
    /// A turn whose events stopped before its end (its thread died): a 500.
    pub fn unfinished() -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "the generation ended without a result",
        )
    }

    pub fn engine(e: &EngineError, prompt_param: &str) -> ApiError {
        match e {
            EngineError::ModelNotFound(id) => ApiError::model_not_found(id),
            EngineError::InvalidModel(e) => ApiError::invalid("model", e.to_string()),
            EngineError::InvalidRequest(msg) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", msg.clone())
            }
            EngineError::EmptyPrompt => ApiError::invalid(prompt_param, e.to_string()),
            EngineError::BadField { field, .. } => ApiError::invalid(field, e.to_string()),
            // A template's `raise_exception` rejects the conversation (roles out of order, a
            // tool result without its call); a template that fails otherwise (its budget, its
            // syntax) is the model's fault and stays a 500.
            EngineError::TemplateRejected(_) => {
                ApiError::invalid(prompt_param, e.to_string()).code("template_error")
            }
            EngineError::ContextOverflow { .. } => {
                ApiError::invalid(prompt_param, e.to_string()).code("context_length_exceeded")
            }
            // Only a list of token ids can hold an id outside the vocabulary.
            EngineError::TokenOutOfVocabulary { .. } => ApiError::invalid("prompt", e.to_string()),
            EngineError::Busy(queued) => ApiError::busy(*queued),
            // A lost rank is the server's state, not the request's fault; a client may retry
            // once the group is restarted.
            EngineError::ShardLost(_) => ApiError {
                code: Some("shard_unavailable"),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", e.to_string())
            },
            other => {
                tracing::error!(error = %other, "engine error");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", other.to_string())
            }
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        ApiError::engine(&e, "prompt")
    }
}

/// Which protocol a request spoke, so its errors come back in that protocol's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
    /// Ollama's `{"error": "message"}`.
    Ollama,
}

impl Dialect {
    /// The protocol a route belongs to (the guard's errors come before any handler).
    pub fn of_path(path: &str) -> Dialect {
        if path == "/v1/messages" || path.starts_with("/v1/messages/") {
            Dialect::Anthropic
        } else if path.starts_with("/api/") {
            Dialect::Ollama
        } else {
            Dialect::OpenAi
        }
    }
}

impl ApiError {
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }

    /// Anthropic's error type and status for this error: a full queue is `overloaded_error`
    /// (529), which Anthropic's clients retry.
    fn anthropic(&self) -> (StatusCode, &'static str) {
        let busy = self.status == StatusCode::TOO_MANY_REQUESTS && self.kind == "rate_limit_error";
        if busy {
            return (StatusCode::from_u16(529).unwrap_or(self.status), "overloaded_error");
        }
        let kind = match self.status.as_u16() {
            400 | 415 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            _ => "api_error",
        };
        (self.status, kind)
    }

    /// The body in `dialect`'s shape.
    pub fn body_as(&self, dialect: Dialect) -> serde_json::Value {
        match dialect {
            Dialect::OpenAi => self.body(),
            Dialect::Anthropic => {
                json!({"type": "error", "error": {"type": self.anthropic().1, "message": self.message}})
            }
            Dialect::Ollama => json!({"error": self.message}),
        }
    }

    /// The response in `dialect`'s shape.
    pub fn into_response_as(self, dialect: Dialect) -> Response {
        let status = match dialect {
            Dialect::OpenAi => self.status,
            Dialect::Anthropic => self.anthropic().0,
            // Ollama answers a full queue with 503.
            Dialect::Ollama if self.status == StatusCode::TOO_MANY_REQUESTS => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Dialect::Ollama => self.status,
        };
        let mut r = (status, axum::Json(self.body_as(dialect))).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.into_response_as(Dialect::OpenAi)
    }
}
