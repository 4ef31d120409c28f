-- The per-chat rate limit counts a chat's traces within a window.
CREATE INDEX traces_chat_started ON traces(chat_id, started_at);
