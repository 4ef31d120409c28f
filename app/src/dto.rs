//! What the console shows, as plain serde types (no database types).

use serde::{Deserialize, Serialize};

/// The signed-in owner, as the layout needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShellInfo {
    pub owner_id: i64,
    pub display_name: String,
    pub login: String,
    /// Set when no LLM provider key is configured: the variable to set.
    pub degraded: Option<DegradedNotice>,
    /// Set when the database would not survive a restart (in memory, or a temporary file).
    pub storage_warning: Option<String>,
    /// Set when writes fail for want of room, or little room is left.
    pub disk: Option<DiskNotice>,
    /// Since when Meta refuses the WhatsApp access token (unix ms): replies wait meanwhile.
    pub whatsapp_token_rejected_since_ms: Option<i64>,
    /// Set when WhatsApp messages come in (the app secret is set) but no reply can go out: the
    /// setting that is missing (`whatsapp.phone_number_id` or `WHATSAPP_ACCESS_TOKEN`).
    pub whatsapp_sending_unset: Option<String>,
}

/// The database's room to write, when it needs the owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiskNotice {
    /// Writes fail for want of room since then (unix ms), and the last one failed then.
    pub full_since_ms: Option<i64>,
    pub last_full_ms: Option<i64>,
    /// Bytes free on the disk holding the SQLite file; `None` on PostgreSQL.
    pub free_bytes: Option<u64>,
    /// `database.low_space_mib`, the warning's threshold.
    pub low_space_mib: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DegradedNotice {
    pub provider: String,
    pub variable: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigrationInfo {
    pub version: i64,
    pub description: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DashboardInfo {
    pub version: String,
    pub started_at_ms: i64,
    pub uptime_secs: u64,
    pub database_backend: String,
    /// Bytes free on the disk holding the SQLite file; `None` on PostgreSQL.
    pub database_free_bytes: Option<u64>,
    pub config_path: String,
    pub listen_addr: String,
    pub public_url: String,
    pub migrations_applied: Vec<MigrationInfo>,
    pub migrations_known: usize,
    pub llm_provider: String,
    pub llm_key_variable: String,
    pub llm_configured: bool,
    pub owner_count: i64,
    /// Model spend today and this month (UTC), with the budget where one is set.
    pub spend: Vec<SpendInfo>,
    /// `warn_only` or `degraded`: what happens at 100% of a budget.
    pub budget_action: String,
    pub charts: Vec<Chart>,
}

/// What waits for an owner: approvals (with the oldest one's age), quarantined MCP tools, MCP
/// servers' forms and repair proposals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingInfo {
    pub approvals: i64,
    pub oldest_approval_age_ms: Option<i64>,
    pub mcp_tools: i64,
    pub mcp_forms: i64,
    pub repairs: i64,
}

/// A stacked bar chart of the dashboard, drawn by the page as SVG. `bars[i].values[j]` is
/// series `j` in bar `i`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chart {
    /// Stable, for tests and anchors: `messages`, `tool_calls`, `model_cost`, `jobs`.
    pub id: String,
    pub title: String,
    /// The list behind the chart, if the console has one.
    pub link: Option<String>,
    /// How a value reads: `count` or `usd_micro` (micro-dollars).
    pub unit: String,
    pub series: Vec<ChartSeries>,
    pub bars: Vec<ChartBar>,
    /// The bars are hours or days in order, so the axis names the first and the last; else
    /// each bar is a group its legend names, and the axis gives the scale alone.
    pub over_time: bool,
    /// Said instead of the chart when every value is zero.
    pub empty: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChartSeries {
    pub name: String,
    /// The filtered list of this series.
    pub link: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChartBar {
    pub label: String,
    pub values: Vec<i64>,
}

/// Model spend in one period, in US dollars with two decimals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpendInfo {
    /// "today" or "this month".
    pub period: String,
    pub spent_usd: String,
    /// None: no budget for this period.
    pub budget_usd: Option<String>,
    pub percent: Option<u32>,
    /// At or past the budget.
    pub exhausted: bool,
    /// Past the lowest warning share.
    pub warned: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SettingEntry {
    pub key: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecretEntry {
    pub variable: String,
    pub set: bool,
}

/// A secret the tool files name (a connector's header, an MCP server's environment or header).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSecretEntry {
    /// `None` for a name not written as variables are, which may be a pasted token: not shown.
    pub variable: Option<String>,
    /// What reads it: "connector shop", "MCP server github (disabled)".
    pub used_by: Vec<String>,
    pub set: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SettingsInfo {
    pub config_path: String,
    pub entries: Vec<SettingEntry>,
    pub secrets: Vec<SecretEntry>,
    pub tool_secrets: Vec<ToolSecretEntry>,
    pub my_phones: Vec<String>,
}

/// A new owner as the setup form or the CLI supplies it, before validation.
#[derive(Clone)]
pub struct NewOwner {
    pub display_name: String,
    pub login: String,
    pub password: String,
    pub phones: String,
}

impl std::fmt::Debug for NewOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewOwner").field("login", &self.login).field("password", &"[REDACTED]").finish_non_exhaustive()
    }
}

/// Filters of the Jobs page, as they appear in its URL.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobQuery {
    pub state: String,
    pub tool: String,
    pub chat: String,
    /// Only jobs created in the last this many minutes; 0 for any time.
    pub since_minutes: i64,
    /// Paging: only jobs older than this id.
    pub before: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateCount {
    pub state: String,
    pub count: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSummary {
    pub id: i64,
    pub kind: String,
    pub state: String,
    pub tool_name: Option<String>,
    pub chat_id: Option<String>,
    pub attempt: i64,
    pub max_attempts: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub last_error_code: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobsPage {
    pub counts: Vec<StateCount>,
    pub jobs: Vec<JobSummary>,
    /// Set when older jobs exist: the `before` value of the next page.
    pub next_before: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEventView {
    pub at: i64,
    pub state: String,
    pub attempt: i64,
    pub error_code: Option<String>,
    pub message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobDetail {
    pub summary: JobSummary,
    pub queue: String,
    pub priority: i64,
    pub dedupe_key: Option<String>,
    pub sender_id: Option<String>,
    pub message_id: Option<String>,
    pub correlation_id: String,
    /// Pretty JSON with secret-looking fields replaced by "[REDACTED]".
    pub args: String,
    pub scheduled_at: i64,
    pub started_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<i64>,
    pub last_error_message: Option<String>,
    pub result_preview: Option<String>,
    pub events: Vec<JobEventView>,
    pub can_retry: bool,
    pub can_cancel: bool,
    /// A tool call whose call gave no result (it failed, an owner cancelled it), which an owner
    /// may run again as a new job.
    pub can_run_again: bool,
    /// What an owner should know before running it again (its first run may have taken effect).
    pub run_again_warning: Option<String>,
    /// The job that last ran this job's call again, if one did.
    pub ran_again_as: Option<i64>,
    /// The job whose call this one runs again, if it does.
    pub again_of: Option<i64>,
}

/// Filters of the Tools page, as they appear in its URL ("" means any).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolsQuery {
    pub provider: String,
    pub audience: String,
    pub risk: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSummary {
    pub name: String,
    pub title: String,
    pub description: String,
    pub provider: String,
    pub operation: String,
    pub audience: String,
    pub risk: String,
    pub approval: String,
    pub enabled: bool,
    /// `sha256:` hash of the definition.
    pub version: String,
    /// closed, open or half_open.
    pub breaker: String,
    pub tags: Vec<String>,
}

/// One checkpoint decision from the tool-call audit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallView {
    pub at: i64,
    pub tool: String,
    pub version: Option<String>,
    pub actor: String,
    pub chat_type: String,
    pub chat_id: Option<String>,
    pub decision: String,
    pub reason_code: String,
    pub latency_us: i64,
    pub attempts: i64,
    pub correlation_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwnerNotice {
    pub at: i64,
    pub hook: String,
    pub tool: String,
    pub reason_code: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolsPage {
    pub approval_mode: String,
    /// Where the catalog is read from, for the empty state and the reload hint.
    pub catalog_path: String,
    /// Tools in the catalog before filtering.
    pub total: usize,
    pub tools: Vec<ToolSummary>,
    pub recent_calls: Vec<ToolCallView>,
    pub notices: Vec<OwnerNotice>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecretFieldView {
    pub field: String,
    pub variable: String,
    pub set: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDetail {
    pub summary: ToolSummary,
    pub when_to_use: String,
    pub when_not_to_use: String,
    pub aliases: Vec<String>,
    pub triggers: Vec<String>,
    pub chat_types: Vec<String>,
    /// Pretty JSON.
    pub input_schema: String,
    pub output_schema: Option<String>,
    pub managed_fields: Vec<String>,
    pub secret_fields: Vec<SecretFieldView>,
    pub timeout_ms: u64,
    pub retry: String,
    pub async_policy: String,
    pub chainable: bool,
    pub max_result_bytes: u64,
    /// The tool's own answer to a complete result (`answer_template`), if it has one; without
    /// it, the summarizer writes the reply.
    pub answer_template: Option<String>,
    /// For connector tools: connector, method and URL template.
    pub connector: Option<String>,
    /// What the checkpoint would decide for an owner and a customer before any hook runs.
    pub owner_policy: String,
    pub customer_policy: String,
    /// Hooks that apply to this tool, by name and point.
    pub hooks: Vec<String>,
    /// Arguments a "try it" call can start from: every required property, empty.
    pub example_args: String,
    pub recent_calls: Vec<ToolCallView>,
}

/// The outcome of a "try it" call from the console.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TryOutcome {
    pub tool: String,
    pub ok: bool,
    /// `OK` or the checkpoint's error code.
    pub code: String,
    pub message: String,
    /// Pretty JSON of the result, when there is one.
    pub output: Option<String>,
    pub attempts: u32,
    pub correlation_id: String,
    pub latency_ms: u64,
    /// The call needs an owner's approval: the request waiting on the Approvals page.
    #[serde(default)]
    pub approval_id: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReloadOutcome {
    pub tools: usize,
    pub changed: Vec<String>,
}

/// One MCP tool with its quarantine state, for the MCP servers page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpToolView {
    /// `<server>__<tool>`, the name in the catalog.
    pub catalog_name: String,
    pub name: String,
    /// The server's own description of the tool (untrusted text, shown as text), shortened.
    pub description: String,
    /// pending, approved or rejected.
    pub state: String,
    /// Offered to the planner and callable now.
    pub usable: bool,
    /// Still listed by the server.
    pub present: bool,
    pub definition_hash: String,
    /// Pretty JSON of the definition as the server gives it (untrusted text).
    pub definition: String,
    /// Line diff from the previous definition, when it changed: lines start with "+ ", "- " or "  ".
    pub diff: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpServerView {
    pub id: String,
    pub transport: String,
    /// The command or URL, without credentials.
    pub target: String,
    pub trust: String,
    pub enabled: bool,
    /// connected, degraded or down.
    pub health: String,
    pub last_error: Option<String>,
    pub last_seen_at: Option<i64>,
    pub tool_count: i64,
    pub pending: usize,
    /// "oauth" when the server is behind OAuth (an owner connects it), else "none".
    pub auth: String,
    /// Why an OAuth server needs an owner to log in; its tools are withheld until then.
    pub needs_login: Option<String>,
    pub tools: Vec<McpToolView>,
}

/// One field of a form an MCP server asked for. Titles, descriptions and choice labels come
/// from the server: untrusted text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpFormField {
    pub name: String,
    /// The server's title for it, or its name.
    pub label: String,
    pub description: Option<String>,
    /// string, number, integer, boolean or enum.
    pub kind: String,
    pub required: bool,
    /// The default, as the input shows it (pre-filled).
    pub default: Option<String>,
    /// For enum: (value, label).
    pub options: Vec<(String, String)>,
    /// For string: email, uri, date or date-time.
    pub format: Option<String>,
}

/// A form an MCP server asked the owners to fill in during a call (`elicitation = "owner"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpFormView {
    pub id: i64,
    pub server: String,
    /// The server's message: untrusted text, shown as text and labelled as the server's.
    pub message: String,
    pub fields: Vec<McpFormField>,
    pub created_at: i64,
    /// The call stops waiting then, and the server is told "cancel".
    pub expires_at: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpPage {
    pub config_path: String,
    /// Forms waiting for an owner, oldest first.
    pub forms: Vec<McpFormView>,
    pub servers: Vec<McpServerView>,
}

/// Filters of the Traces page, as they appear in its URL.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceQuery {
    pub chat: String,
    pub route: String,
    pub outcome: String,
    pub error_code: String,
    /// Only traces from the last this many minutes; 0 for any time.
    pub since_minutes: i64,
    /// Paging: only traces older than this id.
    pub before: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceSummary {
    pub id: i64,
    pub correlation_id: String,
    pub channel: String,
    pub chat_id: String,
    pub message_id: String,
    pub actor: String,
    pub route: String,
    pub outcome: String,
    pub error_code: Option<String>,
    pub started_at: i64,
    pub duration_us: i64,
    /// The start of the message's text on one line, as its channel keeps it (none for media).
    pub preview: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TracesPage {
    pub traces: Vec<TraceSummary>,
    pub next_before: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceStepView {
    pub step: String,
    pub decision: String,
    pub reason_code: String,
    pub duration_us: i64,
    /// Pretty JSON facts (model, tokens, lengths; text only when the config keeps it).
    pub detail: String,
    /// The tool-call job a lane step stored or ran.
    pub job_id: Option<i64>,
    /// The detector's candidates with their scores, best first (lane steps).
    pub candidates: Vec<CandidateView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateView {
    pub name: String,
    pub score: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceDetail {
    pub summary: TraceSummary,
    /// The message's text as its channel keeps it; none for a message without text (media, a
    /// location, a reaction). The customer's own words: shown as text, never as markup.
    pub text: Option<String>,
    pub steps: Vec<TraceStepView>,
    /// The tool calls made while the message was handled, from the checkpoint's audit.
    pub tool_calls: Vec<ToolCallView>,
    /// What owners have said or the scan has found about it.
    pub findings: Vec<FindingView>,
    /// The failure patterns an owner may name when marking it wrong (stable codes).
    pub patterns: Vec<String>,
    /// The tools an owner may name as what should have been called.
    pub tools: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatView {
    /// `whatsapp` or `simulator`.
    pub channel: String,
    pub chat_id: String,
    /// A WhatsApp customer's profile name: their own text, shown as text.
    pub name: Option<String>,
    pub messages: i64,
    pub last_at: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConversationsPage {
    pub chats: Vec<ChatView>,
    /// The signed-in owner's WhatsApp numbers, to simulate a chat as an owner.
    pub owner_numbers: Vec<String>,
    /// The simulator's first sender (`conversation.simulator_customer`).
    pub simulator_customer: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessageView {
    /// `in` (to the bot) or `out` (from the bot).
    pub direction: String,
    pub sender: String,
    pub text: String,
    /// received, queued, sent, delivered, read or failed.
    pub state: String,
    pub error_code: Option<String>,
    pub trace_id: Option<i64>,
    pub at: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatDetail {
    pub channel: String,
    pub chat_id: String,
    /// A WhatsApp customer's latest profile name.
    pub name: Option<String>,
    /// A group chat, as its latest incoming message says.
    pub group: bool,
    pub messages: Vec<ChatMessageView>,
}

/// One simulated message, as the console form or the JSON API sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimulateRequest {
    /// The sender's number; an owner's number makes the sender an owner.
    pub from: String,
    pub text: String,
    /// Defaults to a chat of its own per sender (or per group).
    #[serde(default)]
    pub chat_id: Option<String>,
    #[serde(default)]
    pub group: bool,
    /// In a group: the message mentions the bot.
    #[serde(default)]
    pub mention: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimulateOutcome {
    /// The number it was sent from, as the owner typed it (the form offers it again).
    pub from: String,
    pub chat_id: String,
    pub message_id: String,
    pub actor: String,
    pub route: String,
    pub reply: Option<String>,
    pub trace_id: Option<i64>,
    pub error_code: Option<String>,
}

/// One approval request, as the Approvals page shows it. `args` is the call's arguments with
/// secrets and personal data replaced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalView {
    pub id: i64,
    /// pending, approved, rejected or expired.
    pub state: String,
    pub tool: String,
    /// The definition version the request is bound to (shortened).
    pub version: String,
    pub args: String,
    pub risk: String,
    pub reason_code: String,
    pub reason: String,
    /// "customer +1555…" or "owner +1555…", or "console" for a try-it call.
    pub requester: String,
    pub channel: String,
    pub trace_id: Option<i64>,
    pub requested_at: i64,
    pub expires_at: i64,
    pub decided_at: Option<i64>,
    pub decided_by: Option<String>,
    pub decided_via: Option<String>,
    pub decision_note: Option<String>,
    pub job_id: Option<i64>,
    /// How the approved call's run ended: OK or its code.
    pub outcome: Option<String>,
    /// The run's job state while no outcome is recorded (`running`, or `cancelled` when an owner
    /// cancelled it, `discarded` when its attempts ran out).
    #[serde(default)]
    pub job_state: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalsPage {
    /// Waiting for a decision, oldest first.
    pub pending: Vec<ApprovalView>,
    /// The latest decided, expired or run, newest first.
    pub decided: Vec<ApprovalView>,
    /// The server's clock (unix ms), for the age of each request.
    pub now: i64,
    pub approval_mode: String,
}

/// One line of a repair's diff, side by side: the old file's line on the left, the new one's on
/// the right (a changed line has both; an added or removed line one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiffRow {
    /// `same`, `removed`, `added`, `changed`, or `gap` (lines left out between hunks).
    pub kind: String,
    pub old_no: Option<u32>,
    pub old: Option<String>,
    pub new_no: Option<u32>,
    pub new: Option<String>,
}

/// A case's line in a repair's before/after replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayRow {
    pub case: String,
    pub expect: String,
    pub before: String,
    pub before_pass: bool,
    pub after: String,
    pub after_pass: bool,
}

/// A trace that showed a failure pattern (the scan's or an owner's mark).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindingView {
    pub id: i64,
    pub trace_id: i64,
    pub pattern: String,
    /// `scan` or `owner`.
    pub source: String,
    pub note: String,
    /// The case's expectation, or empty when nobody has said what should have happened.
    pub expect: String,
    pub has_case: bool,
    pub created_at: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RepairView {
    pub id: i64,
    /// proposed, applied, rejected or rolled_back.
    pub state: String,
    pub strategy: String,
    pub summary: String,
    /// Per changed file: its path and its rows.
    pub files: Vec<(String, Vec<DiffRow>)>,
    /// The unified diff, as `gatehouse repair show` prints it.
    pub diff: String,
    /// The diff's fingerprint: an approval names the diff its owner was shown.
    pub seen: String,
    pub table: Vec<ReplayRow>,
    pub fixes: i64,
    pub regressions: i64,
    /// The findings behind the cases it was proposed for.
    pub findings: Vec<FindingView>,
    pub created_at: i64,
    pub decided_at: Option<i64>,
    pub decided_by: Option<String>,
    pub reason: Option<String>,
    /// When, and by whom, an applied repair was rolled back.
    pub rolled_back_at: Option<i64>,
    pub rolled_back_by: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RepairsPage {
    /// Newest first.
    pub repairs: Vec<RepairView>,
    /// The latest findings, newest first.
    pub findings: Vec<FindingView>,
    pub cases: usize,
    /// `evals.scan_every`, e.g. "10m" ("0s": the periodic scan is off).
    pub scan_every: String,
}

/// What an owner says about a trace that went wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceMark {
    pub trace_id: i64,
    /// normal_chat, guard, clarify, or tool:NAME[,NAME].
    pub expect: String,
    /// A failure pattern's code, or empty to let the expectation imply it.
    pub pattern: String,
    pub note: String,
}
