-- A conversation's lease changes hands only as arbor's own paths change it
-- (issue 24: a release by hand was accepted):
--   - a release (its holder to none) leaves none of its tasks running:
--     every release of arbor's recovers the holder's runs first, in the
--     same transaction (a Lease's Release, a runner's release at shutdown
--     or for room, one by one), or frees only conversations with nothing
--     running (the idle release);
--   - a new holder takes the lease from none or from a holder whose row
--     has expired, never from a live one (an open and a Lease's take-over
--     test the same, freeToTake in internal/store/lease.go).
-- Either by hand would let another node claim a task whose run the live
-- holder's handler is still making: two calls of the task at once.
-- Checked after the row is written, as the conversation guard is, and
-- only when a holder gives way (the WHEN clause, evaluated without calling
-- the function: a conversation's first open, from none, costs nothing).
-- now() is the transaction's start, as in the statements it checks.
CREATE FUNCTION {schema}.conversation_handover_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF NEW.holder_id IS NULL THEN
        IF EXISTS (SELECT 1 FROM {schema}.tasks t WHERE t.conversation_id = NEW.id AND t.status = 'running') THEN
            RAISE EXCEPTION 'arbor: conversation %: released with a task running (a release recovers its holder''s runs first)', NEW.id
                USING ERRCODE = 'AB007';
        END IF;
    ELSIF EXISTS (SELECT 1 FROM {schema}.holders h WHERE h.id = OLD.holder_id AND h.expires_at >= now()) THEN
        RAISE EXCEPTION 'arbor: conversation %: taken from %, whose lease is live', NEW.id, OLD.holder
            USING ERRCODE = 'AB007';
    END IF;
    RETURN NULL;
END
$guard$;

CREATE TRIGGER "Arbor_conversation_handover_guard"
    AFTER UPDATE OF holder_id ON {schema}.conversations
    FOR EACH ROW WHEN (OLD.holder_id IS NOT NULL AND OLD.holder_id IS DISTINCT FROM NEW.holder_id)
    EXECUTE FUNCTION {schema}.conversation_handover_guard();
