-- Whether the lane took the answer for the reply to the message that asked (1: it waited for
-- it, and marked it once it had it) or left it to its own job to send (0), so a job run again
-- after a crash does not send an answer the lane took, and the message handled again takes it
-- again instead of running its call a second time.
ALTER TABLE tool_answers ADD COLUMN in_reply INTEGER NOT NULL DEFAULT 0;
-- A chainable tool's result as a chain's next step is planned from (cleaned JSON), so the
-- message handled again plans its next step from the same result.
ALTER TABLE tool_answers ADD COLUMN output TEXT;
