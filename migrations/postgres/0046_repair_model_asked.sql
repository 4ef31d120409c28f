-- The question the repair model was last asked about a case: a hash of the case and of the
-- tools.toml it read (repairs::Proposer::question_key). The periodic cycle asks the model once
-- per question, whatever came of it (an edit that fixes nothing, one another proposal already
-- holds), instead of asking again, and paying again, every cycle.
ALTER TABLE eval_cases ADD COLUMN repair_asked TEXT;
