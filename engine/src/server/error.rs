//! API errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

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

impl ApiError {
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}
