-- Each `tool.call` job's final answer, kept so that a retried job (say, its send failed) sends
-- the same answer again instead of running the tool and asking the summarizer twice; the
-- delivery ledger then skips parts already out.
CREATE TABLE tool_answers (
    job_id BIGINT PRIMARY KEY,
    answer TEXT NOT NULL,
    failure TEXT,
    used_model BIGINT NOT NULL,
    at BIGINT NOT NULL
);
