-- The durable job queue. States follow River: available, scheduled, running, retryable,
-- completed, cancelled, discarded, plus pending (waiting for an owner).

CREATE TABLE jobs (
    id                  BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind                TEXT    NOT NULL,
    queue               TEXT    NOT NULL DEFAULT 'default',
    state               TEXT    NOT NULL,
    priority            BIGINT  NOT NULL DEFAULT 0,
    dedupe_key          TEXT,
    chat_id             TEXT,
    sender_id           TEXT,
    message_id          TEXT,
    original_text       TEXT,
    tool_name           TEXT,
    args                TEXT    NOT NULL DEFAULT '{}',
    attempt             BIGINT  NOT NULL DEFAULT 0,
    max_attempts        BIGINT  NOT NULL,
    created_at          BIGINT  NOT NULL,
    updated_at          BIGINT  NOT NULL,
    scheduled_at        BIGINT  NOT NULL,
    started_at          BIGINT,
    completed_at        BIGINT,
    -- A job still queued after this time is cancelled by the maintainer (TTL).
    expires_at          BIGINT,
    lease_owner         TEXT,
    lease_expires_at    BIGINT,
    last_error_code     TEXT,
    last_error_message  TEXT,
    result_preview      TEXT,
    correlation_id      TEXT    NOT NULL
);

-- At most one unfinished job per dedupe key.
CREATE UNIQUE INDEX jobs_dedupe_unfinished ON jobs(dedupe_key)
    WHERE dedupe_key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'retryable', 'pending');
CREATE INDEX jobs_due ON jobs(queue, priority DESC, scheduled_at, id)
    WHERE state IN ('available', 'scheduled', 'retryable');
CREATE INDEX jobs_running_lease ON jobs(lease_expires_at) WHERE state = 'running';
CREATE INDEX jobs_state_updated ON jobs(state, updated_at);
CREATE INDEX jobs_chat ON jobs(chat_id, id);
CREATE INDEX jobs_tool ON jobs(tool_name, id);

-- The timeline of each job's state changes, for the console and for audits.
CREATE TABLE job_events (
    id          BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      BIGINT  NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    at          BIGINT  NOT NULL,
    state       TEXT    NOT NULL,
    attempt     BIGINT  NOT NULL,
    error_code  TEXT,
    message     TEXT
);
CREATE INDEX job_events_job ON job_events(job_id, id);
