-- A running job an owner cancels keeps its lease until its run has stopped (its worker lets go
-- of it then; maintenance once the lease has run out), and while it keeps it, the later jobs of
-- its chat wait: cancelling a reply must not start the next message's reply beside it. The index
-- the claim reads for a chat's order holds such a job too, and a small one finds the leases to
-- let go. A cancelled job's lease from before is let go now.
DROP INDEX jobs_chat_in_order;
UPDATE jobs SET lease_owner = NULL, lease_expires_at = NULL WHERE state = 'cancelled' AND lease_expires_at IS NOT NULL;
CREATE INDEX jobs_chat_in_order ON jobs(chat_id, kind, queue, id)
    WHERE chat_id IS NOT NULL AND (state IN ('available', 'scheduled', 'retryable', 'running') OR (state = 'cancelled' AND lease_expires_at IS NOT NULL));
CREATE INDEX jobs_cancelled_lease ON jobs(lease_expires_at) WHERE state = 'cancelled' AND lease_expires_at IS NOT NULL;
