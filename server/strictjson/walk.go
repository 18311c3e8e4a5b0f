package strictjson

import (
	"bytes"
	"encoding/json"
)

// Reading a checked body. Once [Check] passed a body, its members can be
// found without checking anything again: [Members] and [Elements] step
// over each value, and a string — a long prompt is nearly all of a body —
// is stepped over with bytes.IndexByte, which runs at memory speed, where
// a general JSON reader looks at every byte of it once more.

// Members calls fn with each member of the JSON object obj (which passed
// Check; white space around it is allowed) in order: its key with escapes
// decoded, as Check compares keys, and its value's bytes exactly. It stops
// when fn returns false. A value that is not an object has no members.
func Members(obj []byte, fn func(key, value []byte) bool) {
	i := ws(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return
	}
	i = ws(obj, i+1)
	for i < len(obj) && obj[i] == '"' {
		end := skipString(obj, i)
		key := obj[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			var s string
			if json.Unmarshal(obj[i:end], &s) == nil {
				key = []byte(s)
			}
		}
		i = ws(obj, end)
		i = ws(obj, i+1) // the colon
		start := i
		i = Skip(obj, i)
		if !fn(key, obj[start:i]) {
			return
		}
		i = ws(obj, i)
		if i >= len(obj) || obj[i] != ',' {
			return
		}
		i = ws(obj, i+1)
	}
}

// Elements calls fn with the bytes of each element of the JSON array arr
// (which passed Check; white space around it is allowed) in order, and
// stops when fn returns false. A value that is not an array has none.
func Elements(arr []byte, fn func(value []byte) bool) {
	i := ws(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return
	}
	i = ws(arr, i+1)
	for i < len(arr) && arr[i] != ']' {
		start := i
		i = Skip(arr, i)
		if !fn(arr[start:i]) {
			return
		}
		i = ws(arr, i)
		if i >= len(arr) || arr[i] != ',' {
			return
		}
		i = ws(arr, i+1)
	}
}

// Skip returns the index just past the JSON value that starts at b[i], in
// a body that passed Check.
func Skip(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = skipString(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return len(b)
	}
	for j := i; j < len(b); j++ { // a number or a literal
		switch b[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return j
		}
	}
	return len(b)
}

// skipString returns the index just past the string whose opening quote
// is b[i]: the first quote after it that an even number of backslashes
// precede closes it.
func skipString(b []byte, i int) int {
	for j := i + 1; j < len(b); {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			break
		}
		q := j + k
		n := 0
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
	return len(b)
}

func ws(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}
