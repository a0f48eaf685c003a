-- A fork's copy waits only on its own copied children (issue 24). The
-- task guard (fsm.ForkRules) checks a copy's wait_ids as the copy is
-- inserted, when its children are not inserted yet (the fork inserts a
-- tree owners first, in one statement): it can only refuse ids that are
-- not above the copy's own. An id above it that names no copy — a task of
-- another conversation created later, in the same transaction or after,
-- or nothing at all — passed, so a copy could be made to wait on a
-- foreign task. At the commit of a transaction that inserted a copy with
-- a wait (a deferred constraint trigger, so that the copy's children are
-- in), every id it waits on must name a task of the copy's conversation
-- that the copy owns. Else the commit fails with AB008 (fsm.SQLStateFork,
-- ErrInvalidTransition). One primary-key probe per waited id.
CREATE FUNCTION {schema}.fork_wait_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(NEW.wait_ids) w(id)
               WHERE NOT EXISTS (SELECT 1 FROM {schema}.tasks c
                                 WHERE c.id = w.id AND c.conversation_id = NEW.conversation_id AND c.owner_task_id = NEW.id)) THEN
        RAISE EXCEPTION 'arbor: task % (a fork''s copy of task %) waits on % : not all of them are its own copied children',
            NEW.id, NEW.forked_from, NEW.wait_ids
            USING ERRCODE = 'AB008';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER fork_wait_guard AFTER INSERT ON {schema}.tasks
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.forked_from IS NOT NULL AND NEW.wait_ids IS NOT NULL AND cardinality(NEW.wait_ids) > 0)
    EXECUTE FUNCTION {schema}.fork_wait_guard();
