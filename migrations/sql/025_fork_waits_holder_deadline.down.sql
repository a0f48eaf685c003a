-- 021's holder guard, without the bound on the deadline.
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
    RETURN NEW;
END
$guard$;
DROP TRIGGER fork_wait_guard ON {schema}.tasks;
DROP FUNCTION {schema}.fork_wait_guard();
