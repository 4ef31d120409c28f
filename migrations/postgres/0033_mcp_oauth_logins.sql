-- Which login a row's tokens belong to: each completed login counts one. A verdict that a login
-- is lost (its refresh token refused, its tokens unreadable) names the login it is about and
-- applies only while the row still holds it, so a login that lands meanwhile, in this process or
-- another, is never undone by a reader that looked before it.
ALTER TABLE mcp_oauth ADD COLUMN logins BIGINT NOT NULL DEFAULT 0;
