-- Version 22 is held for another branch's migration (issue 20/21's guard
-- work, under way beside the guard branch's 023). This step does nothing;
-- it exists only because versions must be contiguous. At the merge it is
-- dropped for that branch's 022, or, if there is none, 023 becomes 022.
SELECT 1;
