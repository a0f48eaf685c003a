package faultharness

import "time"

// The run log: one row per call of a handler, written by the handler's
// wrapper (workload.go) on its own pool — which goes to the database
// directly even when arbor's pool of its process is cut off (a blackholed
// route): it stands for the outside world, which sees every call — in
// statements of its own, not in arbor's transactions.
//
// started_at is the call's entry (the wrapper's first act, before anything
// of the call happens) and returned_at its return (the wrapper's last act,
// after everything of the call happened), both read from the clock at that
// moment (see requireOneClock); returned_at is null when the process died
// first (chaos_faults says when). cancelled_at is when the call's context
// was cancelled, if before it returned, and cause is context.Cause then.
// stubborn marks the kind that ignores its context. refused counts the
// writes of the call that arbor refused.
const runLogDDL = `CREATE TABLE {s}.run_log (
	id              bigint PRIMARY KEY,
	task_id         bigint NOT NULL,
	conversation_id text NOT NULL,
	token           bigint NOT NULL,
	node            text NOT NULL,
	kind            text NOT NULL,
	stubborn        boolean NOT NULL,
	attempt         integer NOT NULL,
	started_at      timestamptz NOT NULL,
	returned_at     timestamptz,
	cancelled_at    timestamptz,
	cause           text,
	outcome         text,
	refused         integer NOT NULL DEFAULT 0);
CREATE INDEX ON {s}.run_log (task_id);
CREATE INDEX ON {s}.run_log (token)`

// side_effects: every side effect of a call (a tool's work step, a call
// upstream), recorded before it happens, on the same pool as the run log.
// checked_at is the moment the call decided to do it: for a well-behaved
// call, right after it found its context not cancelled; at is when the
// record reached the database (later than checked_at when the process was
// frozen, or the server restarting, in between).
const sideEffectsDDL = `CREATE TABLE {s}.side_effects (
	id         bigint PRIMARY KEY,
	call_id    bigint NOT NULL,
	task_id    bigint NOT NULL,
	node       text NOT NULL,
	what       text NOT NULL,
	stubborn   boolean NOT NULL,
	checked_at timestamptz NOT NULL,
	at         timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX ON {s}.side_effects (task_id)`

// chaos_faults: every fault the scenario made, with its window, by the
// test's clock: "kill" (a node's process gone; from_at = to_at, the moment
// the test saw it gone), "freeze" (SIGSTOP to SIGCONT, shorter than the
// lease), "freeze_past_lease" (longer: another node took over meanwhile),
// "cut" (the node's route to the database blackholed, to healed), "lock" (a
// conversation row locked by the test), "restart" (the database server
// restarted: it explains the abandoned_on_restart of a run it cut, no
// other recovery), "failover" (the primary failed over: it explains
// nothing). They are what explains a restart (see recoveriesSQL) and what
// ends a killed call.
const faultsDDL = `CREATE TABLE {s}.chaos_faults (
	id              serial PRIMARY KEY,
	kind            text NOT NULL,
	node            text,
	conversation_id text,
	from_at         timestamptz NOT NULL,
	to_at           timestamptz NOT NULL)`

// Fault records a fault of kind and its window: of node (a runner's
// NodeID) or of conv (a conversation), "" for none (see faultsDDL).
func (s *Scenario) Fault(kind, node, conv string, from, to time.Time) {
	s.T.Helper()
	s.Exec(`INSERT INTO {s}.chaos_faults (kind, node, conversation_id, from_at, to_at) VALUES ($1, nullif($2, ''), nullif($3, ''), $4, $5)`,
		kind, node, conv, from, to)
}

// The audit: a row for every task row version that matters, written by a
// trigger in the transaction that wrote the version — so it commits, or
// not, with it. For a write that carries a run's stamp ({"by": {token,
// node}} in a result, state or child input; "(token N)" ending an error
// message) it records that token next to the task's token at that moment
// (old_token; for a spawn, the owner's token and status): a write from a
// run whose token was no longer current would show as by_token ≠ old_token.
// For a start (→ running) it records the run's epoch next to the
// conversation's holder and epoch at that moment. For every change of
// status or token it records the transition, with the attempts before and
// after and the error code, so the moment each token died is known, and
// every recovery (attempt + 1, or abandoned_on_restart, or
// restart_limit_exceeded) is seen. app is the writer's application_name:
// which process wrote; server_port the port of the server that wrote it
// (inet_server_port(), null over a Unix socket): on a cluster, the node,
// which tells an old primary's writes from the new one's. Heartbeats (no
// status, token or document change) are left out.
const auditDDL = `CREATE TABLE {s}.chaos_audit (
	id            bigserial PRIMARY KEY,
	task_id       bigint NOT NULL,
	op            text NOT NULL,
	old_status    text,
	new_status    text NOT NULL,
	old_token     bigint,
	new_token     bigint,
	old_attempt   integer,
	new_attempt   integer NOT NULL,
	error_code    text,
	by_token      bigint,
	by_node       text,
	owner_status  text,
	owner_token   bigint,
	new_run_epoch bigint,
	conv_holder   text,
	conv_epoch    bigint,
	app           text NOT NULL,
	server_port   integer DEFAULT inet_server_port(),
	at            timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX ON {s}.chaos_audit (task_id);
CREATE INDEX ON {s}.chaos_audit (new_token);
CREATE FUNCTION {s}.chaos_audit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	v_doc     jsonb;
	v_by      bigint;
	v_node    text;
	v_otoken  bigint;
	v_ostatus text;
	v_holder  text;
	v_epoch   bigint;
BEGIN
	IF TG_OP = 'INSERT' THEN
		v_doc := NEW.input;
		IF NEW.owner_task_id IS NOT NULL THEN
			SELECT t.token, t.status INTO v_otoken, v_ostatus FROM {s}.tasks t WHERE t.id = NEW.owner_task_id;
		END IF;
	ELSIF NEW.result IS DISTINCT FROM OLD.result THEN
		v_doc := NEW.result;
	ELSIF NEW.state IS DISTINCT FROM OLD.state THEN
		v_doc := NEW.state;
	ELSIF NEW.error IS DISTINCT FROM OLD.error THEN
		v_by := substring(NEW.error->>'message' from '\(token ([0-9]+)\)$')::bigint;
	END IF;
	IF jsonb_typeof(v_doc) = 'object' AND jsonb_typeof(v_doc->'by') = 'object' THEN
		v_by := (v_doc->'by'->>'token')::bigint;
		v_node := v_doc->'by'->>'node';
	END IF;
	IF TG_OP = 'UPDATE' AND v_by IS NULL AND NEW.status = OLD.status AND NEW.token IS NOT DISTINCT FROM OLD.token
		AND NEW.attempt = OLD.attempt THEN
		RETURN NULL;
	END IF;
	IF NEW.status = 'running' AND (TG_OP = 'INSERT' OR OLD.status <> 'running') THEN
		SELECT c.holder, c.epoch INTO v_holder, v_epoch FROM {s}.conversations c WHERE c.id = NEW.conversation_id;
	END IF;
	INSERT INTO {s}.chaos_audit (task_id, op, old_status, new_status, old_token, new_token, old_attempt, new_attempt,
		error_code, by_token, by_node, owner_status, owner_token, new_run_epoch, conv_holder, conv_epoch, app)
	VALUES (NEW.id, lower(TG_OP), CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, NEW.status,
		CASE WHEN TG_OP = 'UPDATE' THEN OLD.token END, NEW.token, CASE WHEN TG_OP = 'UPDATE' THEN OLD.attempt END,
		NEW.attempt, NEW.error->>'code', v_by, v_node, v_ostatus, v_otoken,
		NEW.run_epoch, v_holder, v_epoch, current_setting('application_name'));
	RETURN NULL;
END $$;
CREATE TRIGGER chaos_audit AFTER INSERT OR UPDATE ON {s}.tasks FOR EACH ROW EXECUTE FUNCTION {s}.chaos_audit()`

// conversation_leases: each conversation with its holder and the holder's
// lease deadline (the holder row's: docs/design.md §3.8).
const leasesViewDDL = `CREATE VIEW {s}.conversation_leases AS
	SELECT c.id, c.holder, c.epoch, h.expires_at AS lease_expires_at
	FROM {s}.conversations c LEFT JOIN {s}.holders h ON h.id = c.holder_id`
