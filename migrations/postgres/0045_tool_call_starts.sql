-- The run of a call that changes something and carries no idempotency key (an MCP or built-in
-- write, a connector write over GET), marked in its own transaction before the call is made. A
-- later attempt of the job that finds the mark and no kept answer (tool_answers) cannot know
-- whether the call took effect (the run stopped, or could not keep its answer), so it never
-- makes the call again: the person and the owners are told the outcome is unknown. A known
-- failure that another attempt may clear removes the mark.
CREATE TABLE tool_call_starts (
    job_id BIGINT PRIMARY KEY,
    at BIGINT NOT NULL
);
