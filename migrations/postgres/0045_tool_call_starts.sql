-- The run of a call that changes something and carries no idempotency key (an MCP or built-in
-- write, a connector action over GET or with its own Idempotency-Key header), marked in its own
-- transaction before the call is made. A later attempt of the job that finds the mark and no
-- kept answer (tool_answers) cannot know whether the call took effect (the run stopped, or could
-- not keep its answer), so it never makes the call again: the person and the owners are told the
-- outcome is unknown. A failure that surely did not take effect (refused, never sent) removes
-- the mark; one that may have (a timeout, an error answer from the system) is an unknown
-- outcome at once.
CREATE TABLE tool_call_starts (
    job_id BIGINT PRIMARY KEY,
    at BIGINT NOT NULL
);
