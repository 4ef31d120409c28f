//! `system.echo`: a diagnostic job for operators to check the queue end to end
//! (`gatehouse jobs enqueue system.echo --args '{"message":"hi"}'`). It completes with its
//! message as the result, or fails permanently when asked to with `fail_with`.

use super::{JobContext, JobError, JobHandler, JobOutput};

pub const KIND: &str = "system.echo";

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    #[serde(default)]
    message: String,
    /// When set, the job fails permanently with this message.
    fail_with: Option<String>,
}

pub struct Echo;

#[async_trait::async_trait]
impl JobHandler for Echo {
    async fn run(&self, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let args: Args = ctx.args()?;
        if let Some(reason) = args.fail_with {
            return Err(JobError::permanent("JOB_ECHO_FAILED", reason.chars().take(200).collect::<String>()));
        }
        Ok(JobOutput { preview: Some(args.message.chars().take(200).collect()), snooze: None })
    }
}
