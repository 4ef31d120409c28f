-- The live view (server/src/events) reads trace steps and job events after a position. On
-- PostgreSQL this migration adds the triggers that wake other processes; a SQLite database has
-- one process, woken in memory by the writers, so nothing changes here but the version, which
-- keeps both backends' migrations numbered alike.
SELECT 1;
