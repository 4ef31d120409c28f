-- A large result belongs to the chat whose call made it: `read_result` reads it back only
-- there. Results from calls without a chat (the console, the command line) have none.
ALTER TABLE tool_results ADD COLUMN chat_id TEXT;
CREATE INDEX tool_results_chat ON tool_results(chat_id, id);
