-- Job events without a foreign key to their job. The key made every inserted event row run
-- `SELECT 1 FROM jobs ... FOR KEY SHARE` on its job, and PostgreSQL logs that row lock: in an
-- enqueue of 500 jobs, 500 extra lock lookups and WAL records (pg_stat_statements counted
-- 80,900 such calls in one `gatehouse bench jobs` run). Events are only ever written by the
-- statement that wrote or moved their job, in the same transaction, and jobs are only deleted
-- with their queue, which deletes the events first (db::jobs::delete_queue), so the key guarded
-- nothing the code does not already keep; readers join events to jobs and skip any orphan.
ALTER TABLE job_events DROP CONSTRAINT IF EXISTS job_events_job_id_fkey;
