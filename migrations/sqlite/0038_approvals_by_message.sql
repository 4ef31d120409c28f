-- A message handled again finds the approval request it made, whatever became of it (see
-- db::approvals::insert_or_reuse).
CREATE INDEX approvals_by_message ON approvals(message_id, channel);
