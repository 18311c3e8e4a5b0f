package router

// Class is a request's priority class as the router sees it, ordered: a
// higher Class is more urgent. The zero Class is standard, so a caller that
// does not say is standard. The gateway maps its priority classes
// (interactive, standard, batch) onto these.
//
// The router keeps each replica's in-flight attempts per class, and a hedge
// of a request never goes to a replica that has attempts of a higher class
// in flight: a hedge is extra load, and it must not land in the engine
// batch that more urgent requests are waiting in.
type Class int8

// The priority classes, lowest first.
const (
	ClassBatch       Class = -1
	ClassStandard    Class = 0
	ClassInteractive Class = 1

	numClasses = int(ClassInteractive-ClassBatch) + 1
)

func (c Class) String() string {
	switch c {
	case ClassBatch:
		return "batch"
	case ClassInteractive:
		return "interactive"
	}
	return "standard"
}

// slot is c's index in per-class arrays; a Class out of range counts as the
// nearest one.
func (c Class) slot() int { return int(min(max(c, ClassBatch), ClassInteractive) - ClassBatch) }
