-- Self-improvement (nothing here changes the bot by itself):
-- findings: a trace that shows a failure pattern, found by the scan or marked wrong by an owner;
-- eval_cases: regression cases made from findings, marks or by hand, replayed deterministically;
-- repairs: proposed configuration diffs, with their before/after replay, that only an owner
-- applies (and may roll back).
CREATE TABLE findings (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    trace_id    INTEGER NOT NULL,
    -- The failure pattern's code (evals::Pattern), e.g. 'WRONG_TOOL'.
    pattern     TEXT    NOT NULL,
    -- 'scan' (the periodic job) or 'owner' (marked wrong on the console or with /wrong).
    source      TEXT    NOT NULL,
    -- What should have happened, in the owner's words (owner marks), or what the scan saw.
    note        TEXT    NOT NULL,
    -- The expectation the case made from it checks, e.g. 'tool:web_search' (may be empty).
    expect      TEXT    NOT NULL,
    owner_id    INTEGER,
    case_id     INTEGER,
    created_at  BIGINT  NOT NULL
);
CREATE UNIQUE INDEX findings_trace_pattern ON findings(trace_id, pattern);

CREATE TABLE eval_cases (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    -- A stable name: kept across export and import, so a file in version control and the
    -- database agree on which case is which.
    name            TEXT    NOT NULL UNIQUE,
    message         TEXT    NOT NULL,
    actor           TEXT    NOT NULL,
    chat_type       TEXT    NOT NULL,
    -- JSON: the chat's recent tool contexts, as `gatehouse lane detect --context` takes them.
    contexts        TEXT    NOT NULL,
    memory_summary  TEXT,
    -- JSON: the expectation (evals::Expect).
    expect          TEXT    NOT NULL,
    -- JSON: where the case came from (manual, a trace, a finding, an import).
    origin          TEXT    NOT NULL,
    -- JSON array: the planner's answers recorded in the trace, replayed in order.
    recorded        TEXT    NOT NULL,
    created_at      BIGINT  NOT NULL
);

CREATE TABLE repairs (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    -- proposed | applied | rejected | rolled_back
    state           TEXT    NOT NULL DEFAULT 'proposed',
    -- Which strategy made it ('add_trigger', 'add_when_not_to_use', 'lower_threshold', ...).
    strategy        TEXT    NOT NULL,
    summary         TEXT    NOT NULL,
    -- The unified diff of the files under config/ it changes.
    diff            TEXT    NOT NULL,
    -- JSON: [{path, before, after}] whole file texts, relative to the config directory.
    files           TEXT    NOT NULL,
    -- JSON: the before/after replay over every eval case.
    results         TEXT    NOT NULL,
    fixes           INTEGER NOT NULL,
    regressions     INTEGER NOT NULL,
    -- JSON array: the failing cases it was proposed for.
    case_ids        TEXT    NOT NULL,
    created_at      BIGINT  NOT NULL,
    decided_at      BIGINT,
    decided_by      TEXT,
    reason          TEXT,
    rolled_back_at  BIGINT
);

-- The scan's cursor: traces up to this id have been looked at.
CREATE TABLE eval_scan (
    id           INTEGER PRIMARY KEY,
    after_trace  BIGINT  NOT NULL
);
