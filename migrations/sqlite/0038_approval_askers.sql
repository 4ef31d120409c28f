-- Every message that asked for an approval request, the one that stored it and those that found
-- it pending alike: a message handled again (a retry after a crash that stored its request but
-- not its reply) finds the request it asked for, whatever became of it (see
-- db::approvals::insert_or_reuse).
CREATE TABLE approval_askers (
    channel TEXT NOT NULL,
    message_id TEXT NOT NULL,
    call_key TEXT NOT NULL,
    approval_id BIGINT NOT NULL REFERENCES approvals(id) ON DELETE CASCADE,
    PRIMARY KEY (channel, message_id, call_key)
);
