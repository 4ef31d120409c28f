-- Whether the lane took the answer for the reply to the message that asked (1: it waited for
-- it) or left it to its own job to send (0). Decided once, with the answer, so a job rerun after
-- a crash does not send an answer the reply already holds, and the message handled again
-- replies with the answer instead of running its call a second time.
ALTER TABLE tool_answers ADD COLUMN in_reply BIGINT NOT NULL DEFAULT 0;
