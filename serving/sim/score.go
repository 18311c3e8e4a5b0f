package sim

import (
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"time"
)

// Rerank and score answer as a cross-encoder does: one relevance score in
// (0, 1) per (query, document) pair, drawn from the pair's hash; a pair
// counts 3 + ⌈len(query)/4⌉ + ⌈len(document)/4⌉ prompt tokens (the query,
// the document and three separators). Shapes:
// vllm/entrypoints/pooling/scoring/protocol.py@004706d8 (RerankResponse,
// ScoreResponse), routes: scoring/api_router.py@facb56e2.

// rerankSpecs: RerankRequest.
var rerankSpecs = []fspec{
	{name: "model", typ: tStr, nullable: true},
	{name: "query", typ: tAny, required: true},
	{name: "documents", typ: tAny, required: true},
	{name: "top_n", typ: tInt},
	{name: "truncate_prompt_tokens", typ: tInt, nullable: true},
	{name: "use_activation", typ: tBool, nullable: true},
	{name: "user", typ: tStr, nullable: true},
}

// scorePair is one scored pair.
type scorePair struct {
	query, doc string
	tokens     int
	score      float64
}

func newPair(q, d string) scorePair {
	h := fnvString(fnvString(fnvOffset, q), "\x00"+d)
	u := float64(mix(h, 0x51ed27)) / (1 << 32)
	return scorePair{query: q, doc: d, tokens: 3 + ceilQuarter(len(q)) + ceilQuarter(len(d)), score: 0.0001 + 0.9998*u}
}

// pairs matches queries with documents: one query against every document,
// or the i-th query with the i-th document.
func pairs(queries, docs []string) ([]scorePair, *apiError) {
	switch {
	case len(queries) == 0 || len(docs) == 0:
		return nil, badRequest("", "At least one query and one document are required.")
	case len(queries) != 1 && len(queries) != len(docs):
		return nil, badRequest("", "Input lengths must be either 1:1, 1:N or N:N")
	}
	out := make([]scorePair, len(docs))
	for i, d := range docs {
		q := queries[0]
		if len(queries) > 1 {
			q = queries[i]
		}
		out[i] = newPair(q, d)
	}
	return out, nil
}

// readTexts reads a ScoreInputs field: a string or a list of strings.
func (r *reader) readTexts(name string) []string {
	v, ok := r.raw[name]
	if !ok {
		return nil
	}
	if s, ok := asString(v); ok {
		return []string{s}
	}
	var list []string
	if len(v) > 0 && v[0] == '[' && json.Unmarshal(v, &list) == nil {
		return list
	}
	loc := r.loc + "." + name
	r.errs = append(r.errs,
		pyErr{typ: "string_type", loc: loc, msg: "Input should be a valid string", input: summarize(v)},
		pyErr{typ: "list_type", loc: loc, msg: "Input should be a valid list", input: summarize(v)})
	return nil
}

func (e *Engine) handlePostRerank(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	rd, aerr := readJSONFields(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	rd.check(rerankSpecs)
	var query []string
	if q, ok := rd.raw["query"]; ok {
		if s, isStr := asString(q); isStr {
			query = []string{s}
		} else {
			rd.errs = append(rd.errs, pyErr{typ: "string_type", loc: "body.query", msg: "Input should be a valid string", input: summarize(q)})
		}
	}
	docs := rd.readTexts("documents")
	ps, aerr := e.readPairs(rd, query, docs)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	topN, _ := rd.int("top_n")
	id := requestID(r)
	prompt := pairTokens(ps)
	e.servePooled(w, r, prompt, arrived, func(b []byte) []byte {
		order := make([]int, len(ps))
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, c int) bool { return ps[order[a]].score > ps[order[c]].score })
		if topN > 0 && int(topN) < len(order) {
			order = order[:topN]
		}
		b = append(b, `{"id":`...)
		b = appendJSONString(b, "rerank-"+id)
		b = append(b, `,"model":`...)
		b = append(b, e.modelJSON...)
		b = append(b, `,"usage":{"prompt_tokens":`...)
		b = strconv.AppendInt(b, int64(prompt), 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, int64(prompt), 10)
		b = append(b, `},"results":[`...)
		for n, i := range order {
			if n > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"index":`...)
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, `,"document":{"text":`...)
			b = appendJSONString(b, ps[i].doc)
			b = append(b, `,"multi_modal":null},"relevance_score":`...)
			b = appendPyFloat(b, ps[i].score)
			b = append(b, '}')
		}
		return append(b, "]}"...)
	})
}

// scoreForms are the field pairs a score request may use, one per request
// model of the ScoreRequest union, in its order.
var scoreForms = []struct{ class, a, b string }{
	{"ScoreQueriesDocumentsRequest", "queries", "documents"},
	{"ScoreQueriesItemsRequest", "queries", "items"},
	{"ScoreDataRequest", "data_1", "data_2"},
	{"ScoreTextRequest", "text_1", "text_2"},
}

func (e *Engine) handlePostScore(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	rd, aerr := readJSONFields(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	rd.check(rerankSpecs[:1])
	var queries, docs []string
	found := false
	for _, f := range scoreForms {
		_, okA := rd.raw[f.a]
		_, okB := rd.raw[f.b]
		if okA && okB {
			queries, docs, found = rd.readTexts(f.a), rd.readTexts(f.b), true
			break
		}
	}
	if !found {
		// No union member matches: pydantic reports each member's missing
		// fields.
		for _, f := range scoreForms {
			for _, name := range []string{f.a, f.b} {
				if _, ok := rd.raw[name]; !ok {
					rd.errs = append(rd.errs, pyErr{typ: "missing", loc: "body." + f.class + "." + name, msg: "Field required", input: rd.summary()})
				}
			}
		}
	}
	ps, aerr := e.readPairs(rd, queries, docs)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	id := requestID(r)
	prompt := pairTokens(ps)
	e.servePooled(w, r, prompt, arrived, func(b []byte) []byte {
		b = append(b, `{"id":`...)
		b = appendJSONString(b, "score-"+id)
		b = append(b, `,"object":"list","created":`...)
		b = strconv.AppendInt(b, time.Now().Unix(), 10)
		b = append(b, `,"model":`...)
		b = append(b, e.modelJSON...)
		b = append(b, `,"data":[`...)
		for i, p := range ps {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"index":`...)
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, `,"object":"score","score":`...)
			b = appendPyFloat(b, p.score)
			b = append(b, '}')
		}
		b = append(b, `],"usage":`...)
		b = appendUsageCounts(b, prompt, 0)
		return append(b, `,"prompt_tokens_details":null,"completion_tokens_details":null}}`...)
	})
}

// readPairs ends the reading of a /rerank or /score body whose texts rd has
// read: the field errors found so far, then the model, then the pairs the
// queries and documents make, as vLLM checks them, in that order.
func (e *Engine) readPairs(rd *reader, queries, docs []string) ([]scorePair, *apiError) {
	if len(rd.errs) > 0 {
		return nil, validationError(rd.errs)
	}
	model, _ := rd.str("model")
	if aerr := e.checkModel(model); aerr != nil {
		return nil, aerr
	}
	ps, aerr := pairs(queries, docs)
	if aerr == nil {
		aerr = e.checkPairs(ps)
	}
	if aerr != nil {
		return nil, aerr
	}
	return ps, nil
}

func (e *Engine) checkPairs(ps []scorePair) *apiError {
	in := make([]poolInput, len(ps))
	for i, p := range ps {
		in[i].tokens = p.tokens
	}
	return e.checkLength(in)
}

func pairTokens(ps []scorePair) int {
	n := 0
	for _, p := range ps {
		n += p.tokens
	}
	return n
}
