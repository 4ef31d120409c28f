//! What a run of a `tool.call` job came to ([`Answer`]), and what its trace steps say of it.

use serde_json::{Value, json};

use crate::lane::summarizer::Writer;

/// What a run of a call came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// What the person is told: the summary, or the configured failure text.
    pub text: String,
    /// `None` when the call succeeded; else its code.
    pub failure: Option<String>,
    /// A failure another attempt may fix.
    pub retryable: bool,
    /// What wrote it, for the trace; `None` for an answer an earlier run kept, whose own run
    /// traced that.
    pub by: Option<Writer>,
    /// Why the summarizer's model was not used, when it was tried (an `LLM_*` or `SUMMARY_*`
    /// code).
    pub fallback_code: Option<String>,
    /// The call's result, when it succeeded: the next step of a chain is planned from it.
    pub output: Option<Value>,
    /// Sent again as an earlier attempt kept it: the call did not run this time.
    pub replayed: bool,
    /// The tool context this run stored for the chat's follow-ups, if it stored one.
    pub context_id: Option<i64>,
    /// A kept answer the lane took, for the reply to the message that asked (or, as a chain's
    /// earlier step, to plan the next): its job sends nothing, and the message handled again
    /// takes it again instead of running the call ([`super::Processor::keep`]).
    pub in_reply: bool,
}

impl Answer {
    /// A call that failed with `code` (or was not made), told in `text`.
    pub(super) fn failed(text: String, code: &str) -> Self {
        Self { text, failure: Some(code.into()), retryable: false, by: Some(Writer::LaneText), fallback_code: None, output: None, replayed: false, context_id: None, in_reply: false }
    }

    /// What a trace step of the run that came to this answer says of it besides its event: the
    /// job, what wrote the reply and, for a summary written without the model, why.
    pub fn detail(&self, job_id: i64) -> Value {
        let mut detail = json!({ "job_id": job_id });
        match self.by {
            Some(by) => detail["reply_by"] = by.as_str().into(),
            None => detail["replayed"] = true.into(),
        }
        if let Some(code) = &self.fallback_code {
            detail["summary_fallback"] = code.as_str().into();
        }
        detail
    }

    /// The trace event of a run that came to this answer, and its reason code.
    pub fn event(&self) -> (&'static str, &str) {
        match &self.failure {
            None => ("AgentToolExecutionSucceeded", "OK"),
            Some(code) => ("AgentToolExecutionFailed", code.as_str()),
        }
    }

    /// The `AgentToolContextStored` step's decision, code and detail, when this run stored a
    /// tool context: the trace names the context a later follow-up reads.
    pub fn context_stored(&self, job_id: i64) -> Option<(&'static str, &'static str, Value)> {
        self.context_id.map(|id| ("stored", "OK", json!({ "context_id": id.to_string(), "job_id": job_id })))
    }
}
