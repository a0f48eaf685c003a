// Package arbortype holds the types of arbor's rows, as its packages return
// them: a task ([Task]) with its recorded error ([TaskError]) and failed-try
// history ([FailedTry]), its status ([Status]) and wait policy
// ([WaitPolicy]), and a conversation ([Conversation]); and the sentinel
// errors every arbor operation wraps ([ErrNotFound] and the rest) and the
// codes arbor records on a task it ends itself ([CodePanic] and the rest);
// and a create's parameters ([CreateParams]), which package tasks names
// arbortype.CreateParams and the engine takes as they are. Packages tasks and
// machine name many of these again (arbortype.ErrNotFound, arbortype.TurnSteer) so
// that code reads naturally; those are the same values, not copies.
//
// It imports nothing of arbor's, so any package — yours, a test helper, a
// UI — can name these types without pulling in the engine or the runner, as
// River's rivertype does for River.
package arbortype
