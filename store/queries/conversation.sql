-- The statements internal/store/conversation.go runs. The names in braces are filled in
-- once at start-up ({schema}, the column and status lists: see store.SQL).
--
-- A conversation row is read as conversation c (the alias is the
-- statement's); its lease deadline is its holder's.


-- Store.EnsureAndLockConversation creates the conversation if it does not
-- exist yet, then locks it.
--
-- Locks: row locks on what it writes (inserts into conversations), held
-- until the transaction ends.
-- name: EnsureConversation
INSERT INTO {schema}.conversations (id, tenant) VALUES ($1, $2) ON CONFLICT DO NOTHING;

-- Locking a conversation also announces it on ChangeChannel ($2): the
-- notification is delivered when the transaction commits (once, however
-- often it locked), and never if it rolls back, so the machine holding the
-- conversation hears of every multi-task change at no extra round trip.
--
-- LockConversation locks a conversation's row until the transaction ends:
-- the first lock of every transaction that can change more than one task
-- (docs/design.md §5). ErrNoRows when it does not exist.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects (of c), held until the
-- transaction ends.
-- name: LockConversation
SELECT c.id, coalesce(c.holder, ''), c.epoch,
(SELECT hd.expires_at FROM {schema}.holders hd WHERE hd.id = c.holder_id), c.created_at, c.tenant, pg_notify($2, c.id) FROM {schema}.conversations c WHERE c.id = $1 FOR NO KEY UPDATE OF c;

-- LockConversationOfTask locks the conversation of a task (as
-- LockConversation does, announcing it at commit) in one round trip: a
-- task's conversation never changes, so reading it in the same statement is
-- safe. ErrNoRows when the task does not exist.
--
-- Locks: FOR NO KEY UPDATE on the rows it selects (of c), held until the
-- transaction ends.
-- name: LockConversationOfTask
SELECT c.id, coalesce(c.holder, ''), c.epoch,
(SELECT hd.expires_at FROM {schema}.holders hd WHERE hd.id = c.holder_id), c.created_at, c.tenant, pg_notify($2, c.id) FROM {schema}.conversations c
WHERE c.id = (SELECT conversation_id FROM {schema}.tasks WHERE id = $1) FOR NO KEY UPDATE OF c;

-- GetConversation reads a conversation without locking it.
--
-- Locks: none (a read).
-- name: GetConversation
SELECT c.id, coalesce(c.holder, ''), c.epoch,
(SELECT hd.expires_at FROM {schema}.holders hd WHERE hd.id = c.holder_id), c.created_at, c.tenant FROM {schema}.conversations c WHERE c.id = $1;
