-- PLACEHOLDER, DROP AT MERGE: version 3 belongs to another branch of issue
-- 40; this empty file only fills the gap the migrations package refuses,
-- so that 004_budget_windows can be applied on this branch.
SELECT 1;
