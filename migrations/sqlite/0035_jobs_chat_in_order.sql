-- A chat's unfinished jobs by kind and queue, in order: the claim keeps jobs of a chat whose kind runs one
-- at a time per chat (a person's messages) in order, and looks here for one running or due
-- before it. Finished jobs leave the index, so a long chat's history does not slow the claim.
CREATE INDEX jobs_chat_in_order ON jobs(chat_id, kind, queue, id)
    WHERE chat_id IS NOT NULL AND state IN ('available', 'scheduled', 'retryable', 'running');
