-- On SQLite this migration adds a trigger that writes an enqueued job's first event in the
-- insert's own statement. PostgreSQL's enqueue already does, with a data-modifying CTE, so
-- nothing changes here but the version, which keeps both backends' migrations numbered alike.
SELECT 1;
