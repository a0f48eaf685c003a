-- The statements internal/store/inspect_log.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- A log entry is read as l, with its payload cut to $cut characters.


-- LogBefore reads up to limit entries of conv's log below seq before, the
-- newest first, payloads cut to cut characters.
--
-- Locks: none (a read).
-- name: LogBefore
SELECT l.seq, l.conversation_id, coalesce(l.task_id, 0), l.kind, coalesce(l.status, ''), coalesce(l.name, ''),
left(l.payload::text, $4), coalesce(octet_length(l.payload::text), 0), l.at FROM {schema}.conversation_log l
WHERE l.conversation_id = $1 AND l.seq < $2 ORDER BY l.seq DESC LIMIT $3;

-- LogAfter reads up to limit entries of conv's log after seq after, in
-- order, payloads cut to cut characters.
--
-- Locks: none (a read).
-- name: LogAfter
SELECT l.seq, l.conversation_id, coalesce(l.task_id, 0), l.kind, coalesce(l.status, ''), coalesce(l.name, ''),
left(l.payload::text, $4), coalesce(octet_length(l.payload::text), 0), l.at FROM {schema}.conversation_log l
WHERE l.conversation_id = $1 AND l.seq > $2 ORDER BY l.seq LIMIT $3;

-- A task's entries among the conversation's $5 entries below $2 (the log has
-- no index by task).
--
-- TaskLogBefore reads up to limit entries of task taskID among the scan
-- entries of conv's log below seq before, the newest first, payloads cut to
-- cut characters.
--
-- Locks: none (a read).
-- name: TaskLogBefore
SELECT l.seq, l.conversation_id, coalesce(l.task_id, 0), l.kind, coalesce(l.status, ''), coalesce(l.name, ''),
left(l.payload::text, $6), coalesce(octet_length(l.payload::text), 0), l.at FROM (
    SELECT * FROM {schema}.conversation_log w
    WHERE w.conversation_id = $1 AND w.seq < $2 ORDER BY w.seq DESC LIMIT $5) l
WHERE l.task_id = $3 ORDER BY l.seq DESC LIMIT $4;

-- LogWindow counts the entries of conv's log below seq before, up to scan of
-- them, and returns the lowest seq among those.
--
-- Locks: none (a read).
-- name: LogWindow
SELECT count(*), coalesce(min(w.seq), 0) FROM (
    SELECT seq FROM {schema}.conversation_log WHERE conversation_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3) w;

-- The last entry of every conversation's log: one probe of the primary key's
-- end.
--
-- LastLogSeq is the seq of the newest entry of any conversation's log (0:
-- none).
--
-- Locks: none (a read).
-- name: LastLogSeq
SELECT coalesce(max(seq), 0) FROM {schema}.conversation_log;

-- TaskEvents reads up to limit events addressed or delivered to taskID, the
-- newest first, payloads cut to cut characters.
--
-- Locks: none (a read).
-- name: TaskEvents
SELECT id, conversation_id, coalesce(task_id, 0), name, left(payload::text, $4),
    coalesce(octet_length(payload::text), 0), coalesce(idempotency_key, ''), queued, emitted_at,
    coalesce(delivered_to, 0), delivered_at
FROM {schema}.events WHERE conversation_id = $1 AND (task_id = $2 OR delivered_to = $2)
ORDER BY id DESC LIMIT $3;
