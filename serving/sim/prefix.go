package sim

import "sync"

// Prefix caching as vLLM counts it (vllm:prefix_cache_queries and
// vllm:prefix_cache_hits, in tokens): the prompt is cut into blocks of
// blockTokens tokens, each block's hash chains its predecessors', and a
// prompt hits the cache for its leading blocks that a recent prompt had.
// The simulator hashes the prompt's text (4 bytes a token, so 64 bytes a
// block) without the chat template; hits are counted, not rewarded: they
// change no latency.

const (
	blockTokens = 16
	blockBytes  = 4 * blockTokens
	// maxCachedBlocks bounds what the cache remembers; the oldest blocks
	// are forgotten first.
	maxCachedBlocks = 1 << 16
)

// blockHasher cuts text into blocks and chains their hashes.
type blockHasher struct {
	chain  uint32
	fill   int // bytes of the current block so far
	blocks []uint32
}

func (b *blockHasher) write(s string) {
	if b.chain == 0 {
		b.chain = fnvOffset
	}
	for i := 0; i < len(s); i++ {
		b.chain ^= uint32(s[i])
		b.chain *= fnvPrime
		if b.fill++; b.fill == blockBytes {
			b.blocks = append(b.blocks, b.chain)
			b.fill = 0
		}
	}
}

// prefixCache remembers recent prompts' block hashes.
type prefixCache struct {
	mu   sync.Mutex
	seen map[uint32]struct{}
	ring []uint32 // insertion order, for forgetting
	next int
}

func newPrefixCache() *prefixCache {
	return &prefixCache{seen: map[uint32]struct{}{}}
}

// query returns how many of a prompt's promptTokens hit the cache, and
// remembers its blocks. As in vLLM, the last prompt token is always
// computed, even when every block hit.
func (c *prefixCache) query(blocks []uint32, promptTokens int) (hits int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for n < len(blocks) {
		if _, ok := c.seen[blocks[n]]; !ok {
			break
		}
		n++
	}
	for _, h := range blocks[n:] {
		if len(c.ring) < maxCachedBlocks {
			c.ring = append(c.ring, h)
		} else {
			delete(c.seen, c.ring[c.next])
			c.ring[c.next] = h
			c.next = (c.next + 1) % maxCachedBlocks
		}
		c.seen[h] = struct{}{}
	}
	return max(0, min(n*blockTokens, promptTokens-1))
}
