package load

// CheckSLO checks objs on every phase of rep, on the whole run ("all") and,
// when the requests carry more than one source label, on each source: the
// checks `tailgate bench --slo` prints, for callers that run the bench
// themselves (`tailgate tune`).
func CheckSLO(rep *Report, objs []Objective) []SLOCheck { return checkSLO(rep, objs) }
