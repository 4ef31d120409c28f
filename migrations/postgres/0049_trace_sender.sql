-- Who sent a traced message in a group (the member; none in a direct chat, whose sender is the
-- chat), so that each member's messages count against the rate limit apart: one member sending
-- too much no longer silences the group.
ALTER TABLE traces ADD COLUMN sender TEXT;
CREATE INDEX traces_chat_sender_started ON traces(chat_id, sender, started_at);
