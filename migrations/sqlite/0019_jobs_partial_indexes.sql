-- Most jobs belong to no chat and call no tool (message handling, notices, maintenance). Their
-- rows no longer enter the chat and tool indexes, which every enqueue had to update; the lists
-- that filter by chat or tool (chat_id = ?, tool_name = ?) still use them.
DROP INDEX jobs_chat;
DROP INDEX jobs_tool;
CREATE INDEX jobs_chat ON jobs(chat_id, id) WHERE chat_id IS NOT NULL;
CREATE INDEX jobs_tool ON jobs(tool_name, id) WHERE tool_name IS NOT NULL;
