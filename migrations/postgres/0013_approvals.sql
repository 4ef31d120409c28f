-- Owner approvals: one row per tool call that waits for an owner, bound to the exact call
-- (definition version, canonical arguments and their hash). A decision is one conditional
-- update from 'pending'; the approved call runs as one tool.call job keyed by the approval.
CREATE TABLE approvals (
    id              BIGSERIAL PRIMARY KEY,
    state           TEXT    NOT NULL DEFAULT 'pending',
    -- The call: tool, definition version, canonical arguments (as asked, before the managed
    -- fields, never with a secret) and their hash; call_key identifies the same call from
    -- the same chat and actor, so a repeated request reuses the pending row.
    tool            TEXT    NOT NULL,
    tool_version    TEXT    NOT NULL,
    args            TEXT    NOT NULL,
    args_hash       TEXT    NOT NULL,
    call_key        TEXT    NOT NULL,
    managed_fields  TEXT    NOT NULL,
    -- What an owner is shown: the arguments with secrets and personal data replaced.
    display         TEXT    NOT NULL,
    risk            TEXT    NOT NULL,
    reason_code     TEXT    NOT NULL,
    reason          TEXT    NOT NULL,
    -- Who asked, from where.
    actor           TEXT    NOT NULL,
    channel         TEXT    NOT NULL,
    chat_kind       TEXT    NOT NULL,
    chat_id         TEXT    NOT NULL,
    sender          TEXT    NOT NULL,
    message_id      TEXT    NOT NULL,
    request         TEXT    NOT NULL,
    correlation_id  TEXT    NOT NULL,
    trace_id        BIGINT,
    -- Secret part of the WhatsApp button ids: a press must carry it.
    nonce           TEXT    NOT NULL,
    created_at      BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL,
    decided_at      BIGINT,
    decided_by      TEXT,
    decider_owner_id BIGINT,
    decider_phone   TEXT,
    decided_via     TEXT,
    decision_note   TEXT,
    -- The run of the approved call.
    job_id          BIGINT,
    outcome_code    TEXT,
    outcome_at      BIGINT
);
CREATE UNIQUE INDEX approvals_one_pending_per_call ON approvals(call_key) WHERE state = 'pending';
CREATE INDEX approvals_state_created ON approvals(state, created_at);
