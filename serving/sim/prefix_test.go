package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// chatBody renders a chat request of alternating user and assistant turns.
func chatBody(t testing.TB, system string, turns ...string) []byte {
	t.Helper()
	msgs := []map[string]string{{"role": "system", "content": system}}
	for i, text := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": text})
	}
	b, err := json.Marshal(map[string]any{"messages": msgs, "max_tokens": 1})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// schedule parses a chat body and runs its prefix-cache lookup, as
// generate does when the request takes its slot; it returns the prompt's
// tokens and the computed (simulated, not measured) prefill time.
func schedule(t testing.TB, e *Engine, body []byte) (int, time.Duration) {
	t.Helper()
	j, aerr := e.parseChat(body)
	if aerr != nil {
		t.Fatalf("parse: %s", aerr.msg)
	}
	return j.promptTokens, e.prefill(j)
}

// TestRepeatedPrefixPrefillsFaster: the next turn of a conversation, and
// the same prompt again, prefill only what the cache did not hold, in
// whole 16-token blocks and never the prompt's last token, as vLLM.
func TestRepeatedPrefixPrefillsFaster(t *testing.T) {
	const per = time.Millisecond
	e, err := New(Config{PrefillPerToken: per}, nil)
	if err != nil {
		t.Fatal(err)
	}
	system := strings.Repeat("You answer questions about the weather. ", 12)
	turn1 := chatBody(t, system, "Is it raining in Paris?")
	turn2 := chatBody(t, system, "Is it raining in Paris?", "No, it is sunny.", "And in Rome?")

	n1, cold := schedule(t, e, turn1)
	if cold != time.Duration(n1)*per {
		t.Fatalf("a cold prompt of %d tokens prefilled in %v, want every token", n1, cold)
	}
	n2, warm := schedule(t, e, turn2)
	// Turn 2's prompt begins with all of turn 1's (the chat template puts
	// the assistant's answer after turn 1's generation prompt), so turn 1's
	// whole blocks hit.
	if want := time.Duration(n2-n1/blockTokens*blockTokens) * per; warm != want {
		t.Errorf("turn 2 (%d tokens after %d) prefilled in %v, want %v", n2, n1, warm, want)
	}
	if warm >= time.Duration(n2)*per/2 {
		t.Errorf("turn 2 prefilled in %v, no faster than a cold %v", warm, time.Duration(n2)*per)
	}
	// On another replica, which never saw turn 1, turn 2 prefills whole:
	// the cache is the replica's own.
	other, err := New(Config{PrefillPerToken: per}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, d := schedule(t, other, turn2); d != time.Duration(n2)*per || d <= warm {
		t.Errorf("turn 2 on another replica prefilled in %v, want all %d tokens (%v), slower than the warm replica's %v", d, n2, time.Duration(n2)*per, warm)
	}
	_, again := schedule(t, e, turn2)
	if want := time.Duration(n2-(n2-1)/blockTokens*blockTokens) * per; again != want {
		t.Errorf("the same prompt again prefilled in %v, want %v (the last token's block is recomputed)", again, want)
	}

	// A fresh prompt, or the same one under another cache_salt, shares nothing.
	n3, fresh := schedule(t, e, chatBody(t, strings.Repeat("Another system prompt entirely. ", 12), "Hi"))
	if fresh != time.Duration(n3)*per {
		t.Errorf("a fresh prompt prefilled in %v, want %v", fresh, time.Duration(n3)*per)
	}
	var salted map[string]any
	_ = json.Unmarshal(turn2, &salted)
	salted["cache_salt"] = "tenant-b"
	body, _ := json.Marshal(salted)
	if _, d := schedule(t, e, body); d != time.Duration(n2)*per {
		t.Errorf("a salted prompt prefilled in %v, want all %d tokens", d, n2)
	}
}

// TestPromptBlocksAreTheTokenizersTokens: the blocks hashed are those of
// the ids /tokenize returns for the same messages, so a turn's prompt is a
// token prefix of the next turn's.
func TestPromptBlocksAreTheTokenizersTokens(t *testing.T) {
	e, srv := start(t, Config{})
	system := strings.Repeat("Be brief. ", 9)
	var ids [][]int64
	for _, body := range [][]byte{chatBody(t, system, "Hello there"), chatBody(t, system, "Hello there", "Hi!", "How are you?")} {
		status, _, b := post(t, srv.URL+"/tokenize", string(body))
		if status != http.StatusOK {
			t.Fatalf("tokenize: %d %s", status, b)
		}
		var tok struct {
			Tokens []int64 `json:"tokens"`
		}
		if err := json.Unmarshal(b, &tok); err != nil {
			t.Fatal(err)
		}
		var bh blockHasher
		for _, id := range tok.Tokens {
			bh.id(id)
		}
		j, aerr := e.parseChat(body)
		if aerr != nil {
			t.Fatal(aerr.msg)
		}
		if len(tok.Tokens) != j.promptTokens || len(bh.blocks) != len(j.blocks) {
			t.Fatalf("tokenize gave %d ids (%d blocks), the prompt has %d tokens (%d blocks)", len(tok.Tokens), len(bh.blocks), j.promptTokens, len(j.blocks))
		}
		for i := range bh.blocks {
			if bh.blocks[i] != j.blocks[i] {
				t.Fatalf("block %d differs from the tokenizer's", i)
			}
		}
		ids = append(ids, tok.Tokens)
	}
	for i, id := range ids[0] {
		if ids[1][i] != id {
			t.Fatalf("turn 2's token %d is %d, turn 1's %d: not a prefix", i, ids[1][i], id)
		}
	}
}

// TestPrefixCacheEvictsLeastRecentlyUsed: a full cache forgets the blocks
// used longest ago, and of one prompt its tail before its head.
func TestPrefixCacheEvictsLeastRecentlyUsed(t *testing.T) {
	// Prompts of exactly 4 whole blocks (and one token more, so the last
	// block can hit).
	prompt := func(c byte) []uint64 {
		var bh blockHasher
		bh.write(strings.Repeat(string(c), 4*4*blockTokens))
		bh.endText()
		return bh.blocks
	}
	const tokens = 4*blockTokens + 1
	a, b, c := prompt('a'), prompt('b'), prompt('c')

	cache := newPrefixCache(8)
	cache.query(a, tokens)
	cache.query(b, tokens)
	if hits := cache.query(a, tokens); hits != 4*blockTokens { // a is now the most recent
		t.Fatalf("a hit %d tokens in a cache holding it, want %d", hits, 4*blockTokens)
	}
	cache.query(c, tokens) // evicts b, the least recently used
	if got := cache.len(); got != 8 {
		t.Errorf("cache holds %d blocks, want its capacity 8", got)
	}
	if hits := cache.query(b, tokens); hits != 0 {
		t.Errorf("b hit %d tokens after eviction, want 0", hits)
	}
	// b's return evicted the least recent: a's blocks, tail first. With
	// capacity 6 a prompt's head survives its tail.
	small := newPrefixCache(6)
	small.query(a, tokens)
	small.query(b, tokens) // room for 2 of a's 4 blocks
	if hits := small.query(a, tokens); hits != 2*blockTokens {
		t.Errorf("a hit %d tokens, want its first 2 blocks (%d): the tail goes first", hits, 2*blockTokens)
	}

	off := newPrefixCache(0)
	off.query(a, tokens)
	if hits := off.query(a, tokens); hits != 0 {
		t.Errorf("a disabled cache hit %d tokens", hits)
	}
}

// TestPrefixCacheMetricsCountTokens: vllm:prefix_cache_queries_total counts
// every prompt token looked up, vllm:prefix_cache_hits_total the tokens of
// the blocks that hit, and each request observes one prefill time, as
// vLLM's series do.
func TestPrefixCacheMetricsCountTokens(t *testing.T) {
	_, srv := start(t, Config{Model: "m", PrefixCacheBlocks: -1})
	body := string(chatBody(t, strings.Repeat("x", 400), "q"))
	for range 2 {
		if status, _, b := post(t, srv.URL+"/v1/chat/completions", body); status != http.StatusOK {
			t.Fatalf("status %d: %s", status, b)
		}
	}
	_, m := get(t, srv.URL+"/metrics")
	n := ChatPromptTokens(strings.Repeat("x", 400), "q")
	for series, want := range map[string]float64{
		// Caching off: vLLM looks nothing up and counts nothing
		// (KVCacheManager.record_prefix_cache_stats skips the request).
		`vllm:prefix_cache_queries_total{engine="0",model_name="m"}`:         0,
		`vllm:prefix_cache_hits_total{engine="0",model_name="m"}`:            0,
		`vllm:request_prefill_time_seconds_count{engine="0",model_name="m"}`: 2,
	} {
		if got := metricValue(t, m, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}

	_, srv = start(t, Config{Model: "m"})
	for range 2 {
		post(t, srv.URL+"/v1/chat/completions", body)
	}
	_, m = get(t, srv.URL+"/metrics")
	if got, want := metricValue(t, m, `vllm:prefix_cache_queries_total{engine="0",model_name="m"}`), float64(2*n); got != want {
		t.Errorf("queries = %v, want %v (both prompts' every token)", got, want)
	}
	if got, want := metricValue(t, m, `vllm:prefix_cache_hits_total{engine="0",model_name="m"}`), float64((n-1)/blockTokens*blockTokens); got != want {
		t.Errorf("hits = %v, want %v", got, want)
	}
}
