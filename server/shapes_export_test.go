package server

// ShapeMember is one member of an endpoint's request union as the tests
// see the table in shapes.go.
type ShapeMember struct {
	Path, Model string
	Keys        []string
	Pairs       bool // scored pair by pair
	Single      bool // the first key takes one input
	Runs        bool // the engine runs the model (not tokenize/detokenize)
}

// ShapeTable walks shapes: every path, every member, in vLLM's order.
func ShapeTable() []ShapeMember {
	var out []ShapeMember
	for _, sh := range shapes {
		for _, p := range sh.paths {
			for _, m := range sh.members {
				out = append(out, ShapeMember{Path: p, Model: m.model, Keys: m.keys, Pairs: m.size == sizePairs, Single: m.single, Runs: m.size != sizeNone})
			}
		}
	}
	return out
}
