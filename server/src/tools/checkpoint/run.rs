//! Running a call that passed the gates: its secrets filled in, its executor called within the
//! tool's timeout and circuit breaker, retried with backoff, the result checked and bounded.

use std::time::Instant;

use serde_json::Value;

use super::{CallContext, Checked, Checkpoint, ToolCode, ToolError, ToolFailure, ToolSuccess, fail, idempotency_key};
use crate::tools::{Catalog, catalog::{Provider, ToolSpec}, hooks::{self, Hook}};

/// Logs the `AgentToolConnectorFailed` event (seed §17) for a connector call that ends in
/// failure: the tool, the provider's code and the attempts, never the arguments or the answer.
fn connector_failed(spec: &ToolSpec, ctx: &CallContext, e: &ToolError, attempts: u32) {
    if spec.provider == Provider::Connector {
        tracing::warn!(event = "AgentToolConnectorFailed", correlation_id = %ctx.correlation_id, tool = %spec.name, code = %e.code, attempts, retryable = e.retryable, "connector call failed");
    }
}

impl Checkpoint {
    /// Executes a call that passed the gates. `catalog` is the version the call started with:
    /// its hooks apply, even if a reload happens meanwhile.
    pub(super) async fn run<'c>(
        &self,
        catalog: &'c Catalog,
        checked: Checked,
        ctx: &CallContext,
        attempts: &mut u32,
        notify: &mut Vec<&'c Hook>,
    ) -> Result<ToolSuccess, ToolFailure> {
        let Checked { tool, mut input, .. } = checked;
        let spec = &tool.spec;
        // The key is of the call as checked, before secrets are filled in: it derives from none.
        let key = idempotency_key(&spec.name, &Value::Object(input.clone()), ctx);
        let mut sent_secrets = Vec::with_capacity(spec.secret_fields.len());
        for (field, var) in &spec.secret_fields {
            let Some(value) = self.secrets.get(var) else { return Err(fail(ToolCode::SecretMissing.as_str(), format!("the secret for {field:?} is not set"))) };
            input.insert(field.clone(), Value::String(value.clone()));
            sent_secrets.push(value);
        }
        let input = Value::Object(input);
        let executor = self.executor(spec).ok_or_else(|| fail(ToolCode::NoExecutor.as_str(), format!("nothing in this build runs {}", spec.name)))?;

        let mut delay = spec.retry.backoff;
        loop {
            // Dropped with this future (a job's budget ended, its lease was lost), the trial
            // gives its slot back.
            let trial = match self.breakers.try_acquire(&spec.name, Instant::now()) {
                Ok(trial) => trial,
                Err(wait) => {
                    return Err(ToolFailure { retryable: true, ..fail(ToolCode::CircuitOpen.as_str(), format!("{} failed repeatedly; next try in {} s", spec.name, wait.as_secs().max(1))) });
                }
            };
            *attempts += 1;
            let result = match tokio::time::timeout(spec.timeout, executor.call_keyed(&tool, &input, &key)).await {
                Ok(result) => result,
                Err(_) => Err(ToolError::new(ToolCode::Timeout.as_str(), format!("no answer within {:?}", spec.timeout), true)),
            };
            match result {
                Ok(mut output) => {
                    trial.succeeded();
                    // A result that echoes a secret the call was sent keeps it to itself.
                    crate::redact::blank_values(&mut output, &sent_secrets);
                    if let Some(validator) = &tool.output_validator
                        && let Some(err) = validator.iter_errors(&output).next()
                    {
                        // The call was made: whatever it did stands.
                        return Err(ToolFailure { maybe_applied: true, ..fail(ToolCode::ResultInvalid.as_str(), format!("the result does not match the output schema at {:?}", err.instance_path().to_string())) });
                    }
                    // The hooks see the whole result, before a large one is stored: what is
                    // read back later has been through them too.
                    hooks::after(&catalog.hooks, &spec.name, &mut output, notify);
                    let output = self.bound_size(spec, output, ctx).await.map_err(|f| ToolFailure { maybe_applied: true, ..f })?;
                    return Ok(ToolSuccess { tool: spec.name.clone(), version: tool.version.clone(), output, attempts: *attempts });
                }
                Err(e) if e.refused => {
                    // Refused before reaching anything: says nothing of the provider.
                    drop(trial);
                    connector_failed(spec, ctx, &e, *attempts);
                    return Err(fail(&e.code, e.message));
                }
                Err(e) => {
                    if e.of_target {
                        trial.succeeded();
                    } else {
                        trial.failed(Instant::now());
                    }
                    // A call that may have taken effect is not sent again within this run unless
                    // a repeat is safe (it reads, or carries its idempotency key).
                    let repeat_unsafe = !e.unsent && !self.repeats_safely(&tool);
                    if !e.retryable || *attempts >= spec.retry.max_attempts || repeat_unsafe {
                        connector_failed(spec, ctx, &e, *attempts);
                        // A definite answer (a 4xx) says it was not done; a timeout, a server
                        // error or a connection lost during the call may hide that it was.
                        let maybe_applied = !e.unsent && (e.retryable || e.outcome_unknown || e.code == ToolCode::Timeout.as_str());
                        if e.code == ToolCode::Timeout.as_str() {
                            return Err(ToolFailure { retryable: true, maybe_applied, ..fail(ToolCode::Timeout.as_str(), e.message) });
                        }
                        // The provider's own code stays visible inside the message.
                        return Err(ToolFailure { retryable: e.retryable, maybe_applied, ..fail(ToolCode::ProviderError.as_str(), format!("{}: {}", e.code, e.message)) });
                    }
                    tokio::time::sleep(delay).await;
                    delay = delay.saturating_mul(2);
                }
            }
        }
    }
}
