package sim

import (
	"container/list"
	"sync"
	"time"
)

// Automatic prefix caching as vLLM v1 does it, and the prefill time it
// saves.
//
// A prompt is the token ids the simulator's tokenizer gives it (see
// tokenize.go): a chat request's messages rendered by its chat template
// (<|im_start|> role \n content <|im_end|> per message, then the generation
// prompt <|im_start|> assistant \n), so turn k+1 of a conversation starts
// with turn k's whole prompt, as with a real template; a completions
// prompt is <s> and its text. The ids are cut into blocks of blockTokens
// (vLLM's default block_size, 16) and each full block's hash chains its
// parent's, as vllm/v1/core/kv_cache_utils.py's hash_block_tokens hashes
// (parent_block_hash, block_token_ids, extra_keys): a block hits only
// after the same whole prefix. The request's cache_salt is the first
// block's extra key, as there (generate_block_hash_extra_keys adds
// request.cache_salt when start_token_idx == 0), so differently salted
// prompts share nothing: the gateway salts each tenant's requests with its
// own, so tenants share no cached block. The salt is read on chat and
// completions requests, a non-empty string or refused as vLLM refuses it
// (vllm/entrypoints/openai/protocol.py, check_cache_salt_support).
// The hash is FNV-1a over 64 bits (vLLM's is sha256 or xxhash; only
// equality matters here). A partial last block is never cached.
//
// When a request is scheduled, vLLM's KVCacheManager.get_computed_blocks
// (vllm/v1/core/kv_cache_manager.py) looks up its leading blocks, at most
// (prompt tokens − 1) / block_size of them, since the last prompt token is
// always computed to get logits, and counts
// vllm:prefix_cache_queries_total += prompt tokens and
// vllm:prefix_cache_hits_total += the hit blocks' tokens (nothing when
// prefix caching is off: no lookup, no count). The simulator
// does the same, then prefills only the tokens that missed
// ([Config.PrefillPerToken] each).
//
// The cache holds a bounded number of blocks ([Config.PrefixCacheBlocks])
// and forgets the least recently used first, as vLLM's free block queue
// does (vllm/v1/core/block_pool.py, FreeKVCacheBlockQueue): a request's
// blocks are released in reverse order, so a prompt's tail is evicted
// before its head, which more prompts share. Unlike vLLM, the cache is not
// carved out of the KV cache that admission reserves ([Config.KVCacheTokens]),
// and blocks of generated tokens are not cached.

const (
	blockTokens = 16
	// defaultPrefixBlocks bounds the cache when neither PrefixCacheBlocks
	// nor KVCacheTokens says how large it is: a million tokens.
	defaultPrefixBlocks = 1 << 16
)

const (
	fnv64Offset = 14695981039346656037
	fnv64Prime  = 1099511628211
)

// blockHasher cuts a prompt's token ids into blocks and chains their
// hashes. Text is fed as bytes and becomes four-byte tokens, as
// appendTextTokens makes them.
type blockHasher struct {
	chain  uint64
	n      int     // ids in the current block
	text   [4]byte // pending bytes of the current text token
	fill   int
	blocks []uint64
}

// salt makes the first block's hash depend on s (vLLM's cache_salt).
func (b *blockHasher) salt(s string) {
	b.start()
	for i := 0; i < len(s); i++ {
		b.fold(s[i])
	}
	b.fold(0xff) // no salt is a prefix of another
}

func (b *blockHasher) start() {
	if b.chain == 0 {
		b.chain = fnv64Offset
	}
}

func (b *blockHasher) fold(c byte) {
	b.chain ^= uint64(c)
	b.chain *= fnv64Prime
}

// id adds one token.
func (b *blockHasher) id(v int64) {
	b.start()
	for range 8 {
		b.fold(byte(v))
		v >>= 8
	}
	if b.n++; b.n == blockTokens {
		b.blocks = append(b.blocks, b.chain)
		b.n = 0
	}
}

// write adds text; call endText where the text ends.
func (b *blockHasher) write(s string) {
	for i := 0; i < len(s); i++ {
		b.text[b.fill] = s[i]
		if b.fill++; b.fill == 4 {
			b.endText()
		}
	}
}

// endText adds the last, partial token of the text written.
func (b *blockHasher) endText() {
	if b.fill == 0 {
		return
	}
	v := int64(0)
	for i := range b.fill {
		v = v<<8 | int64(b.text[i])
	}
	b.id(chunkOffsets[b.fill] + v)
	b.fill = 0
}

// beginMessage adds a chat message's opening: <|im_start|> role \n.
func (b *blockHasher) beginMessage(role string) {
	r, ok := roleTokens[role]
	if !ok {
		r = tokRoleAny
	}
	b.id(tokImStart)
	b.id(r)
	b.id(tokNewline)
}

// endMessage adds a chat message's end: its text's last token, <|im_end|>.
func (b *blockHasher) endMessage() {
	b.endText()
	b.id(tokImEnd)
}

// generationPrompt adds <|im_start|> assistant \n.
func (b *blockHasher) generationPrompt() { b.beginMessage("assistant") }

// prefixCache remembers the blocks of recent prompts, least recently used
// first out.
type prefixCache struct {
	capacity int // 0: caching is off

	mu  sync.Mutex
	lru list.List // of uint64 block hashes, most recent at the front
	at  map[uint64]*list.Element
}

func newPrefixCache(capacity int) *prefixCache {
	return &prefixCache{capacity: max(capacity, 0), at: map[uint64]*list.Element{}}
}

// query returns how many of a prompt's promptTokens hit the cache, in
// whole blocks and never the last token, and makes all of the prompt's
// blocks the most recently used, its first block last so that eviction
// takes its tail first.
func (c *prefixCache) query(blocks []uint64, promptTokens int) (hits int) {
	if c.capacity == 0 {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	limit := max(0, promptTokens-1) / blockTokens
	n := 0
	for n < len(blocks) && n < limit {
		if _, ok := c.at[blocks[n]]; !ok {
			break
		}
		n++
	}
	for i := len(blocks) - 1; i >= 0; i-- {
		h := blocks[i]
		if el, ok := c.at[h]; ok {
			c.lru.MoveToFront(el)
			continue
		}
		c.at[h] = c.lru.PushFront(h)
		if c.lru.Len() > c.capacity {
			old := c.lru.Back()
			c.lru.Remove(old)
			delete(c.at, old.Value.(uint64))
		}
	}
	return n * blockTokens
}

// len returns the number of blocks cached.
func (c *prefixCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// prefill looks the scheduled request's prompt up in the prefix cache,
// records the lookup as vLLM does, and returns how long the prompt's
// uncached tokens take to prefill. With prefix caching off there is no
// lookup to record: vLLM's KVCacheManager.record_prefix_cache_stats skips
// a request that did not look the cache up, so both counters stay at 0.
func (e *Engine) prefill(j *job) time.Duration {
	hits := 0
	if e.prefix.capacity > 0 {
		hits = e.prefix.query(j.blocks, j.promptTokens)
		e.metrics.scheduled(j.promptTokens, hits)
	}
	running, _ := e.sched.load()
	return e.lane.take(j.promptTokens-hits, running-1, time.Now())
}
