-- SQLite has no data-modifying CTE, so a claim and a completion wrote their job events with a
-- second statement each: on the one writer connection, a round trip to its thread per
-- transaction. These triggers write them in the same statement, as PostgreSQL's CTEs do.
-- They fire for a run under a lease only: a claim sets the lease's owner, and a completion
-- ends one. `at` is the time the statement wrote, and `attempt` the run's.
CREATE TRIGGER job_events_on_claim AFTER UPDATE OF state ON jobs
WHEN NEW.state = 'running' AND OLD.state <> 'running' AND NEW.lease_owner IS NOT NULL
BEGIN
    INSERT INTO job_events (job_id, at, state, attempt) VALUES (NEW.id, NEW.updated_at, 'running', NEW.attempt);
END;

CREATE TRIGGER job_events_on_completion AFTER UPDATE OF state ON jobs
WHEN NEW.state = 'completed' AND OLD.state = 'running' AND OLD.lease_owner IS NOT NULL
BEGIN
    INSERT INTO job_events (job_id, at, state, attempt) VALUES (NEW.id, NEW.updated_at, 'completed', NEW.attempt);
END;
