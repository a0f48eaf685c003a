-- A fork's copy waits on exactly the copies of its source's waited
-- children (issue 24). The task guard (fsm.ForkRules) checks a copy's
-- wait_ids as the copy is inserted, when its children are not inserted
-- yet (the fork inserts a tree owners first, in one statement): it can
-- only refuse ids that are not above the copy's own. An id above it that
-- names no copy — a task of another conversation created later, in the
-- same transaction or after, or nothing at all — passed, so a copy could
-- be made to wait on a foreign task. And the guard required as many ids
-- as the source's, so the fork of a turn whose task was aborted while it
-- waited on a background child still live (not copied: a fork copies
-- settled tasks) was refused. At the commit of a transaction that
-- inserted a copy with a wait (a deferred constraint trigger, so that the
-- copy's children are in), every id it waits on must name a task of the
-- copy's conversation that the copy owns and that is a copy of one of its
-- source's waited tasks, and every such copy must be waited on: the
-- source's wait, less what was not copied. Else the commit fails with
-- AB008 (fsm.SQLStateFork, ErrInvalidTransition). A primary-key probe per
-- waited id, and one look at the copy's children (tasks_owner_idx).
CREATE FUNCTION {schema}.fork_wait_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    src_waits bigint[];
BEGIN
    SELECT s.wait_ids INTO src_waits FROM {schema}.tasks s WHERE s.id = NEW.forked_from;
    IF EXISTS (SELECT 1 FROM unnest(NEW.wait_ids) w(id)
               WHERE NOT EXISTS (SELECT 1 FROM {schema}.tasks c
                                 WHERE c.id = w.id AND c.conversation_id = NEW.conversation_id AND c.owner_task_id = NEW.id
                                   AND c.forked_from = ANY(src_waits)))
       OR EXISTS (SELECT 1 FROM {schema}.tasks c
                  WHERE c.conversation_id = NEW.conversation_id AND c.owner_task_id = NEW.id
                    AND c.forked_from = ANY(src_waits) AND NOT c.id = ANY(NEW.wait_ids)) THEN
        RAISE EXCEPTION 'arbor: task % (a fork''s copy of task %) waits on %: not the copies of its source''s waited children',
            NEW.id, NEW.forked_from, NEW.wait_ids
            USING ERRCODE = 'AB008';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER fork_wait_guard AFTER INSERT ON {schema}.tasks
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.forked_from IS NOT NULL AND NEW.wait_ids IS NOT NULL)
    EXECUTE FUNCTION {schema}.fork_wait_guard();

-- A holder's deadline is at most a day away (issue 24): a lease is at
-- most 24 h (RunnerConfig.ConversationLease, LeaseConfig.Duration), and a
-- renewal keeps the greater of the old deadline and now + the lease. A
-- deadline written by hand years ahead was accepted, and then nothing
-- could free the conversations it held: no take-over before it passes,
-- the guard itself refusing a deadline brought back, and the holder's row
-- undeletable while it holds them. The rest of 021's holder guard is as
-- it was.
CREATE OR REPLACE FUNCTION {schema}.holder_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF EXISTS (SELECT 1 FROM {schema}.conversations c WHERE c.holder_id = OLD.id) THEN
            RAISE EXCEPTION 'arbor: holder % (%) is deleted only once it holds no conversation', OLD.id, OLD.name
                USING ERRCODE = 'AB006';
        END IF;
        RETURN OLD;
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NEW.created_at <> now() OR NEW.renewed_at <> now() OR NEW.expires_at < now() THEN
            RAISE EXCEPTION 'arbor: a holder is inserted live, stamped now'
                USING ERRCODE = 'AB009';
        END IF;
        IF NEW.expires_at > now() + interval '24 hours' THEN
            RAISE EXCEPTION 'arbor: holder % (%): a lease is at most a day, not until %', NEW.id, NEW.name, NEW.expires_at
                USING ERRCODE = 'AB009';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.id <> OLD.id OR NEW.name <> OLD.name OR NEW.created_at <> OLD.created_at THEN
        RAISE EXCEPTION 'arbor: holder % (%): only its renewal ever changes', OLD.id, OLD.name
            USING ERRCODE = 'AB009';
    END IF;
    IF NEW.expires_at = OLD.expires_at AND NEW.renewed_at = OLD.renewed_at THEN
        RETURN NEW;
    END IF;
    IF OLD.expires_at < now() OR NEW.expires_at < OLD.expires_at OR NEW.renewed_at <> now() THEN
        RAISE EXCEPTION 'arbor: holder % (%) is renewed only while live, stamped now, and its deadline never comes closer', OLD.id, OLD.name
            USING ERRCODE = 'AB009';
    END IF;
    IF NEW.expires_at > now() + interval '24 hours' THEN
        RAISE EXCEPTION 'arbor: holder % (%): a lease is at most a day, not until %', OLD.id, OLD.name, NEW.expires_at
            USING ERRCODE = 'AB009';
    END IF;
    RETURN NEW;
END
$guard$;
