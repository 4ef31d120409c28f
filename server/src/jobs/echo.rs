//! `system.echo`: a diagnostic job for operators to check the queue end to end
//! (`gatehouse jobs enqueue system.echo --args '{"message":"hi"}'`). It completes with its
//! message as the result, or fails permanently when asked to with `fail_with`.

use super::{Handler, JobContext, JobError, JobKind, JobOutput};

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Echo {
    #[serde(default)]
    pub message: String,
    /// When set, the job fails permanently with this message.
    pub fail_with: Option<String>,
}

impl JobKind for Echo {
    const KIND: &'static str = "system.echo";
}

pub struct EchoHandler;

#[async_trait::async_trait]
impl Handler<Echo> for EchoHandler {
    async fn run(&self, args: Echo, _ctx: &JobContext) -> Result<JobOutput, JobError> {
        if let Some(reason) = args.fail_with {
            return Err(JobError::permanent("JOB_ECHO_FAILED", reason.chars().take(200).collect::<String>()));
        }
        Ok(JobOutput { preview: Some(args.message.chars().take(200).collect()), snooze: None })
    }
}
