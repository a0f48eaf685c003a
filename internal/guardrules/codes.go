package guardrules

// Error codes (SQLSTATE) raised by the database guard. Class "AB" is arbor's.
const (
	SQLStateInvalidTransition = "AB001" // a status change that is not an edge of the table
	SQLStateSettled           = "AB002" // any change to a settled task
	SQLStateImmutable         = "AB003" // a change to id, conversation, owner, kind or background
	SQLStateInvalidInsert     = "AB004" // a task inserted other than as a fresh pending task
	SQLStateColumn            = "AB005" // a column changed outside its rule, or a row breaking a row rule
	SQLStateDelete            = "AB006" // a DELETE of tasks or a conversation off the prune path or of what is live (DeleteRules), or a TRUNCATE
	SQLStateConversation      = "AB007" // a conversation's identity or epoch forged
	SQLStateFork              = "AB008" // a forked row that is not a faithful copy of its source (ForkRules)
	// An event, log entry, budget or budget reservation written otherwise
	// than arbor writes it (RecordRules; a
	// delete of one off the prune path, or a TRUNCATE, is SQLStateDelete).
	SQLStateRecord = "AB009"
)
