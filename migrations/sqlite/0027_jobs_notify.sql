-- On PostgreSQL this migration adds the trigger that notifies workers of new jobs; a SQLite
-- database has one process, whose workers are woken in memory after the enqueue commits, so
-- nothing changes here but the version, which keeps both backends' migrations numbered alike.
SELECT 1;
