-- The sender whose message made a tool context's call. In a group, a member's follow-up is
-- offered only the contexts their own messages made: a result holds more than the summary the
-- group read. Contexts kept before this have none, and are offered in direct chats only.
ALTER TABLE tool_contexts ADD COLUMN requester TEXT;
