package refresh

import "slices"

// states lists every State in the order help and docs show them: the one
// list `status --help` prints and the tests hold docs/states/ to. A new
// State constant goes here too (TestStates_ListsEveryStateConstant).
var states = []State{
	StatePinned, StateDrifted, StateFirstObserved, StateLockedOut, StateNotSettled,
	StateStalePin, StateTagFlapping, StateWaiting, StateWindowClosed, StateQueued,
	StateQuarantined, StateRolledBack, StateUnverified, StatePlatformMissing, StatePinMissing, StateSuspended,
	StateRunningStale, StateInert, StateUnreadable, StateError,
}

// States lists every state a `status` row can show.
func States() []State { return slices.Clone(states) }
