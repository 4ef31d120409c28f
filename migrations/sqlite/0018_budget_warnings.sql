-- Spend-budget warnings already given: one row per period ('day:2026-12-01',
-- 'month:2026-12') and share of its budget, so each is given once, whichever process sees the
-- spend cross it first.
CREATE TABLE budget_warnings (
    period TEXT NOT NULL,
    percent INTEGER NOT NULL,
    at BIGINT NOT NULL,
    spent_micro_usd BIGINT NOT NULL,
    budget_micro_usd BIGINT NOT NULL,
    PRIMARY KEY (period, percent)
);
