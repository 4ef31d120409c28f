-- On PostgreSQL this migration drops job_events' foreign key, whose per-row lock on the job
-- was most of an enqueue's cost there. SQLite checks a foreign key with one index lookup and
-- no lock, and dropping it would mean rebuilding the table, so nothing changes here but the
-- version, which keeps both backends' migrations numbered alike.
SELECT 1;
