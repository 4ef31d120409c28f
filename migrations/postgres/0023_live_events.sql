-- The live view: a process that commits trace steps, job events or an MCP server's health wakes
-- every other process's event reader. PostgreSQL delivers a NOTIFY when the writing transaction
-- commits (and drops it on rollback), and sends identical ones of one transaction once, so a
-- statement trigger costs each transaction one small message. The readers then read the
-- committed rows after their position (server/src/events).
CREATE FUNCTION gatehouse_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gatehouse_events', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER trace_steps_notify AFTER INSERT ON trace_steps
    FOR EACH STATEMENT EXECUTE FUNCTION gatehouse_events_notify();
CREATE TRIGGER job_events_notify AFTER INSERT ON job_events
    FOR EACH STATEMENT EXECUTE FUNCTION gatehouse_events_notify();
CREATE TRIGGER mcp_servers_notify AFTER INSERT OR UPDATE OF health ON mcp_servers
    FOR EACH STATEMENT EXECUTE FUNCTION gatehouse_events_notify();
