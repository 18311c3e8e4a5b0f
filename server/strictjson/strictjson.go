// Package strictjson checks that a request body is JSON that every reader
// reads the same way: well formed, no object with a repeated key, and
// nesting no deeper than a bound. The gateway and the engine behind it
// (vLLM's pydantic, which keeps the last copy of a repeated key) must never
// disagree on what a body says, so a body that could be read two ways is
// refused instead of forwarded.
//
// [Check] runs in one pass over the bytes without recursion, so no input can
// exhaust the stack, and allocates only for objects with many keys or keys
// with escapes. It does not build values; callers read fields with gjson
// once the body passed.
package strictjson

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// DefaultMaxDepth is the nesting bound callers use unless they have a
// reason: far deeper than any chat request (tool schemas included), far
// shallower than what hurts.
const DefaultMaxDepth = 64

// SyntaxError: the body is not one well-formed JSON value.
type SyntaxError struct {
	Offset int // byte offset of the problem
	Msg    string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at byte %d: %s", e.Offset, e.Msg)
}

// DuplicateKeyError: an object holds the same key twice.
type DuplicateKeyError struct {
	Key  string // the key, unescaped
	Path string // where the object is, e.g. "messages[0]"; "" for the top level
}

func (e *DuplicateKeyError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("duplicate key %q", e.Key)
	}
	return fmt.Sprintf("duplicate key %q in %s", e.Key, e.Path)
}

// DepthError: objects and arrays are nested deeper than the bound.
type DepthError struct {
	Max  int
	Path string // where the bound was crossed
}

func (e *DepthError) Error() string {
	return fmt.Sprintf("JSON nested deeper than %d levels (at %s)", e.Max, e.Path)
}

// manyKeys is the key count from which an object's keys go into a map
// instead of being compared one by one.
const manyKeys = 16

// MaxKeys bounds the keys of one object, which bounds the memory the
// duplicate check takes (a request's objects have a handful; a tool's JSON
// schema maybe hundreds).
const MaxKeys = 10000

// TooManyKeysError: an object has more than MaxKeys keys.
type TooManyKeysError struct{ Path string }

func (e *TooManyKeysError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("an object with more than %d keys", MaxKeys)
	}
	return fmt.Sprintf("an object with more than %d keys in %s", MaxKeys, e.Path)
}

type frame struct {
	obj   bool
	n     int // members (objects) or elements (arrays) so far
	first int // index in checker.keys of this object's first key
	key   int // index in checker.keys of the current key, -1 if none
	set   map[string]struct{}
}

type checker struct {
	b     []byte
	max   int
	stack []frame
	keys  [][]byte // keys of the open objects, unescaped
}

// Check reports whether b is one JSON value (surrounded by optional white
// space) with no repeated key in any object and at most maxDepth levels of
// nested objects and arrays (maxDepth <= 0 means [DefaultMaxDepth]). The
// error is a *SyntaxError, *DuplicateKeyError, *DepthError or
// *TooManyKeysError.
func Check(b []byte, maxDepth int) error {
	if maxDepth <= 0 {
		maxDepth = DefaultMaxDepth
	}
	// The stacks of an earlier check: a request's keys would otherwise grow
	// them three or four times (arrays on the goroutine's stack escaped to
	// the heap all the same: 1 KB a request, 5 % of what the gateway
	// allocated at 1000 JSON requests a second, pprof).
	st := stacks.Get().(*checkStacks)
	c := checker{b: b, max: maxDepth, stack: st.stack[:0], keys: st.keys[:0]}
	err := c.run()
	clear(c.keys[:cap(c.keys)]) // no key keeps the body alive
	clear(c.stack[:cap(c.stack)])
	if cap(c.keys) <= 1024 && cap(c.stack) <= 256 {
		st.stack, st.keys = c.stack, c.keys
		stacks.Put(st)
	}
	return err
}

// checkStacks are a checker's stacks, kept between checks in stacks.
type checkStacks struct {
	stack []frame
	keys  [][]byte
}

var stacks = sync.Pool{New: func() any {
	return &checkStacks{stack: make([]frame, 0, 8), keys: make([][]byte, 0, 32)}
}}

func (c *checker) syntax(i int, msg string) error { return &SyntaxError{Offset: i, Msg: msg} }

func (c *checker) ws(i int) int {
	for i < len(c.b) {
		switch c.b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

func (c *checker) run() error {
	b := c.b
	i := c.ws(0)
	var err error
value:
	if i >= len(b) {
		return c.syntax(i, "unexpected end of input")
	}
	switch ch := b[i]; {
	case ch == '{' || ch == '[':
		if len(c.stack) >= c.max {
			return &DepthError{Max: c.max, Path: c.path(c.stack)}
		}
		c.stack = append(c.stack, frame{obj: ch == '{', first: len(c.keys), key: -1})
		i = c.ws(i + 1)
		if i < len(b) && (b[i] == '}' && ch == '{' || b[i] == ']' && ch == '[') {
			c.pop()
			i++
			goto after
		}
		if ch == '{' {
			if i, err = c.member(i); err != nil {
				return err
			}
		}
		goto value
	case ch == '"':
		if i, _, err = c.str(i); err != nil {
			return err
		}
	case ch == '-' || ch >= '0' && ch <= '9':
		if i, err = c.num(i); err != nil {
			return err
		}
	case ch == 't':
		if i, err = c.lit(i, "true"); err != nil {
			return err
		}
	case ch == 'f':
		if i, err = c.lit(i, "false"); err != nil {
			return err
		}
	case ch == 'n':
		if i, err = c.lit(i, "null"); err != nil {
			return err
		}
	default:
		return c.syntax(i, fmt.Sprintf("unexpected character %q", ch))
	}
after:
	i = c.ws(i)
	if len(c.stack) == 0 {
		if i != len(b) {
			return c.syntax(i, "data after the JSON value")
		}
		return nil
	}
	if i >= len(b) {
		return c.syntax(i, "unexpected end of input")
	}
	top := &c.stack[len(c.stack)-1]
	switch b[i] {
	case ',':
		top.n++
		i = c.ws(i + 1)
		if top.obj {
			if i, err = c.member(i); err != nil {
				return err
			}
		}
		goto value
	case '}':
		if !top.obj {
			return c.syntax(i, "'}' closes an array")
		}
	case ']':
		if top.obj {
			return c.syntax(i, "']' closes an object")
		}
	default:
		return c.syntax(i, fmt.Sprintf("unexpected character %q after a value", b[i]))
	}
	c.pop()
	i++
	goto after
}

func (c *checker) pop() {
	top := &c.stack[len(c.stack)-1]
	if top.obj {
		c.keys = c.keys[:top.first]
	}
	c.stack = c.stack[:len(c.stack)-1]
}

// member reads `"key" :` at i in the innermost object, checks the key is
// new there, and returns the index of the value.
func (c *checker) member(i int) (int, error) {
	if i >= len(c.b) || c.b[i] != '"' {
		return 0, c.syntax(i, "want a string key")
	}
	start := i
	end, escaped, err := c.str(i)
	if err != nil {
		return 0, err
	}
	key := c.b[start+1 : end-1]
	// Readers compare keys as text: escapes decoded and each invalid UTF-8
	// byte read as U+FFFD (encoding/json, jsontext), so "\xff" and "\xfe"
	// are one key to them and must be one key here.
	if escaped || !utf8.Valid(key) {
		var s string
		if err := json.Unmarshal(c.b[start:end], &s); err != nil {
			return 0, c.syntax(start, "invalid key")
		}
		key = []byte(s)
	}
	top := &c.stack[len(c.stack)-1]
	if top.n >= MaxKeys {
		return 0, &TooManyKeysError{Path: c.path(c.stack[:len(c.stack)-1])}
	}
	if top.set != nil {
		if _, dup := top.set[string(key)]; dup {
			return 0, &DuplicateKeyError{Key: string(key), Path: c.path(c.stack[:len(c.stack)-1])}
		}
		top.set[string(key)] = struct{}{}
	} else {
		for _, k := range c.keys[top.first:] {
			if bytes.Equal(k, key) {
				return 0, &DuplicateKeyError{Key: string(key), Path: c.path(c.stack[:len(c.stack)-1])}
			}
		}
		if len(c.keys)-top.first >= manyKeys {
			top.set = make(map[string]struct{}, 2*manyKeys)
			for _, k := range c.keys[top.first:] {
				top.set[string(k)] = struct{}{}
			}
			top.set[string(key)] = struct{}{}
		}
	}
	c.keys = append(c.keys, key)
	top.key = len(c.keys) - 1
	i = c.ws(end)
	if i >= len(c.b) || c.b[i] != ':' {
		return 0, c.syntax(i, "want ':' after a key")
	}
	return c.ws(i + 1), nil
}

// str scans the string starting at the quote at i; it returns the index
// after the closing quote and whether it held escapes. Words of bytes
// pass at once (32 bytes, then 8) while none of their bytes is a quote, a
// backslash or a control character: a prompt is a long run of such bytes,
// and a byte at a time this loop was the strict check's whole cost.
func (c *checker) str(i int) (int, bool, error) {
	b := c.b
	escaped := false
	for j := i + 1; j < len(b); j++ {
		for ; j+32 <= len(b); j += 32 {
			w := b[j : j+32 : j+32]
			if special(binary.LittleEndian.Uint64(w[:8]))|special(binary.LittleEndian.Uint64(w[8:16]))|
				special(binary.LittleEndian.Uint64(w[16:24]))|special(binary.LittleEndian.Uint64(w[24:32])) != 0 {
				break
			}
		}
		for j+8 <= len(b) && special(binary.LittleEndian.Uint64(b[j:])) == 0 {
			j += 8
		}
		if j >= len(b) {
			break
		}
		switch ch := b[j]; {
		case ch == '"':
			return j + 1, escaped, nil
		case ch == '\\':
			escaped = true
			j++
			if j >= len(b) {
				return 0, false, c.syntax(j, "unterminated string")
			}
			switch b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(b) || !isHex(b[j+1]) || !isHex(b[j+2]) || !isHex(b[j+3]) || !isHex(b[j+4]) {
					return 0, false, c.syntax(j, `invalid \u escape`)
				}
				j += 4
			default:
				return 0, false, c.syntax(j, "invalid escape")
			}
		case ch < 0x20:
			return 0, false, c.syntax(j, "control character in a string")
		}
	}
	return 0, false, c.syntax(len(b), "unterminated string")
}

// Eight bytes in a word, for stops.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// special has the high bit set of each byte of x that ends a run of plain
// string bytes — a quote, a backslash or a byte below 0x20 — and maybe of
// bytes after it, but never of one before it, and it is 0 exactly when x
// has none: (w-ones)&^w marks where w has a zero byte, (x-ones*0x20)&^x
// where x has a byte below 0x20, and a borrow starts only at such a byte.
func special(x uint64) uint64 {
	q := x ^ ones*'"'
	s := x ^ ones*'\\'
	return ((q-ones)&^q | (s-ones)&^s | (x-ones*0x20)&^x) & highs
}

func isHex(ch byte) bool {
	return ch >= '0' && ch <= '9' || ch >= 'a' && ch <= 'f' || ch >= 'A' && ch <= 'F'
}

func (c *checker) num(i int) (int, error) {
	b := c.b
	start := i
	if b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case digits() == 0:
		return 0, c.syntax(start, "invalid number")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return 0, c.syntax(start, "invalid number")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return 0, c.syntax(start, "invalid number")
		}
	}
	return i, nil
}

func (c *checker) lit(i int, word string) (int, error) {
	if !bytes.HasPrefix(c.b[i:], []byte(word)) {
		return 0, c.syntax(i, "invalid literal")
	}
	return i + len(word), nil
}

// path renders where frames lead: the keys and indexes of the open objects
// and arrays, e.g. messages[0].content.
func (c *checker) path(frames []frame) string {
	var sb strings.Builder
	for _, f := range frames {
		switch {
		case f.obj && f.key >= 0:
			if sb.Len() > 0 {
				sb.WriteByte('.')
			}
			sb.Write(c.keys[f.key])
		case !f.obj:
			sb.WriteByte('[')
			sb.WriteString(strconv.Itoa(f.n))
			sb.WriteByte(']')
		}
	}
	return sb.String()
}

// IsInvalid reports whether err is one of this package's errors (as
// opposed to nil).
func IsInvalid(err error) bool {
	var (
		se *SyntaxError
		de *DuplicateKeyError
		ne *DepthError
		ke *TooManyKeysError
	)
	return errors.As(err, &se) || errors.As(err, &de) || errors.As(err, &ne) || errors.As(err, &ke)
}
