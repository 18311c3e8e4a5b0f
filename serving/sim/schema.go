package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
)

// Schema filler: the simulator's stand-in for vLLM's guided decoding
// (xgrammar compiling a JSON schema into a grammar that masks every token
// the schema forbids; vllm/v1/structured_output/backend_xgrammar.py). A
// model under such a grammar can only write a value the schema accepts, in
// the schema's property order; the simulator writes one such value
// directly, deterministic in the prompt's hash, as json.dumps would
// (", " and ": " separators):
//
//   - strings: two filler words (padded or cut to minLength/maxLength), or a
//     value of a known format (date-time, date, time, email, uuid, uri,
//     hostname, ipv4, ipv6), or one matching pattern (see regexFill);
//   - integers and numbers: within minimum/maximum (exclusive bounds too,
//     and multipleOf), 0–99 when unbounded;
//   - booleans, null, const, enum (one of the values);
//   - arrays: minItems items, at least one unless maxItems is 0
//     (prefixItems first);
//   - objects: every required property, and the optional ones while fewer
//     than four properties are written; never a property the schema does
//     not list, so additionalProperties false holds;
//   - anyOf and oneOf: the first branch; allOf: the branches merged;
//     a type list: its first non-null type; $ref: a JSON pointer into the
//     schema ("#/$defs/X", "#/definitions/X", "#").
//
// Keywords outside this list (not, if/then/else, patternProperties,
// dependencies, uniqueItems, …) are not enforced: the value is filler
// shaped by the schema, never a model's answer.

// jsonObject is a decoded JSON object that remembers its key order, as a
// grammar built from the schema does.
type jsonObject struct {
	keys []string
	vals map[string]any
}

func (o *jsonObject) get(k string) (any, bool) {
	if o == nil {
		return nil, false
	}
	v, ok := o.vals[k]
	return v, ok
}

// decodeOrdered decodes one JSON value: objects as *jsonObject, arrays as
// []any, numbers as json.Number.
func decodeOrdered(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("trailing data after the JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			o := &jsonObject{vals: map[string]any{}}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				if _, dup := o.vals[k]; !dup {
					o.keys = append(o.keys, k)
				}
				o.vals[k] = v
			}
			_, err := dec.Token() // '}'
			return o, err
		case '[':
			list := []any{}
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := dec.Token() // ']'
			return list, err
		}
	}
	return tok, nil
}

// appendValue appends a decoded value as json.dumps writes it.
func appendValue(b []byte, v any) []byte {
	switch t := v.(type) {
	case nil:
		return append(b, "null"...)
	case bool:
		return strconv.AppendBool(b, t)
	case json.Number:
		return append(b, t...)
	case string:
		return appendJSONString(b, t)
	case []any:
		b = append(b, '[')
		for i, e := range t {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendValue(b, e)
		}
		return append(b, ']')
	case *jsonObject:
		b = append(b, '{')
		for i, k := range t.keys {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendJSONString(b, k)
			b = append(b, ": "...)
			b = appendValue(b, t.vals[k])
		}
		return append(b, '}')
	}
	return append(b, "null"...)
}

// maxSchemaDepth bounds nesting: a schema whose required properties recurse
// forever has no finite value.
const maxSchemaDepth = 32

// optionalProps is how many properties an object gets before optional ones
// are left out.
const optionalProps = 4

// schemaFiller writes values of one schema.
type schemaFiller struct {
	root any
	b    []byte
}

// fillSchema returns a value of the JSON schema (raw JSON) for a choice
// with hash h, or why the simulator cannot make one (the request is then a
// 400, as a schema xgrammar cannot compile is on vLLM).
func fillSchema(schema json.RawMessage, h uint32) (string, error) {
	root, err := decodeOrdered(schema)
	if err != nil {
		return "", fmt.Errorf("the JSON schema is not valid JSON: %w", err)
	}
	return fillDecoded(root, h)
}

func fillDecoded(root any, h uint32) (string, error) {
	f := &schemaFiller{root: root}
	if err := f.value(root, h, 0); err != nil {
		return "", err
	}
	return string(f.b), nil
}

// value appends a value of schema s, seeded by x.
func (f *schemaFiller) value(s any, x uint32, depth int) error {
	if depth > maxSchemaDepth {
		return errors.New("the JSON schema nests deeper than 32 levels (a required property that refers to itself?)")
	}
	var o *jsonObject
	switch t := s.(type) {
	case bool:
		if !t {
			return errors.New("the JSON schema is false: no value is valid")
		}
	case *jsonObject:
		o = t
	case nil:
	default:
		return fmt.Errorf("a JSON schema must be an object or a boolean, not %s", summarize(appendValue(nil, s)))
	}
	o, err := f.resolve(o, depth)
	if err != nil {
		return err
	}
	if c, ok := o.get("const"); ok {
		f.b = appendValue(f.b, c)
		return nil
	}
	if e, ok := o.get("enum"); ok {
		list, _ := e.([]any)
		if len(list) == 0 {
			return errors.New("the JSON schema has an empty enum: no value is valid")
		}
		f.b = appendValue(f.b, list[x%uint32(len(list))])
		return nil
	}
	for _, key := range []string{"anyOf", "oneOf"} {
		if v, ok := o.get(key); ok {
			list, _ := v.([]any)
			if len(list) == 0 {
				return fmt.Errorf("the JSON schema has an empty %s", key)
			}
			return f.value(list[0], x, depth+1)
		}
	}
	switch schemaType(o) {
	case "object":
		return f.object(o, x, depth)
	case "array":
		return f.array(o, x, depth)
	case "integer":
		f.b = appendInteger(f.b, o, x)
	case "number":
		f.b = appendNumber(f.b, o, x)
	case "boolean":
		f.b = strconv.AppendBool(f.b, x&1 == 1)
	case "null":
		f.b = append(f.b, "null"...)
	default:
		f.b = appendJSONString(f.b, stringValue(o, x))
	}
	return nil
}

// resolve follows $ref and merges allOf, returning the schema to fill.
func (f *schemaFiller) resolve(o *jsonObject, depth int) (*jsonObject, error) {
	for hops := 0; o != nil; hops++ {
		ref, ok := o.get("$ref")
		if !ok {
			break
		}
		if hops > maxSchemaDepth {
			return nil, errors.New("the JSON schema's $ref chain does not end")
		}
		s, _ := ref.(string)
		target, err := f.pointer(s)
		if err != nil {
			return nil, err
		}
		t, _ := target.(*jsonObject)
		if len(o.keys) > 1 { // siblings of $ref apply too (draft 2019-09 on)
			t = mergeSchemas(withoutKey(o, "$ref"), t)
		}
		o = t
	}
	if all, ok := o.get("allOf"); ok {
		list, _ := all.([]any)
		merged := withoutKey(o, "allOf")
		for _, branch := range list {
			bo, _ := branch.(*jsonObject)
			bo, err := f.resolve(bo, depth+1)
			if err != nil {
				return nil, err
			}
			merged = mergeSchemas(merged, bo)
		}
		o = merged
	}
	if o == nil {
		o = &jsonObject{vals: map[string]any{}} // true, or a $ref to true: anything
	}
	return o, nil
}

// pointer resolves a local JSON pointer reference ("#", "#/$defs/X").
func (f *schemaFiller) pointer(ref string) (any, error) {
	frag, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return nil, fmt.Errorf("the simulated engine resolves only local $ref (\"#/...\"), not %q", ref)
	}
	frag, err := url.PathUnescape(frag)
	if err != nil {
		return nil, fmt.Errorf("$ref %q is not a valid JSON pointer", ref)
	}
	cur := f.root
	if frag == "" {
		return cur, nil
	}
	if frag[0] != '/' {
		return nil, fmt.Errorf("$ref %q is not a JSON pointer (anchors are not supported by the simulated engine)", ref)
	}
	for _, part := range strings.Split(frag[1:], "/") {
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		switch c := cur.(type) {
		case *jsonObject:
			v, ok := c.get(part)
			if !ok {
				return nil, fmt.Errorf("$ref %q points at nothing in the schema", ref)
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(c) {
				return nil, fmt.Errorf("$ref %q points at nothing in the schema", ref)
			}
			cur = c[i]
		default:
			return nil, fmt.Errorf("$ref %q points at nothing in the schema", ref)
		}
	}
	return cur, nil
}

// withoutKey returns a copy of o without key.
func withoutKey(o *jsonObject, key string) *jsonObject {
	out := &jsonObject{vals: map[string]any{}}
	if o == nil {
		return out
	}
	for _, k := range o.keys {
		if k != key {
			out.keys = append(out.keys, k)
			out.vals[k] = o.vals[k]
		}
	}
	return out
}

// mergeSchemas returns a with b's keywords added: properties and required
// are united, other keywords a has win.
func mergeSchemas(a, b *jsonObject) *jsonObject {
	out := withoutKey(a, "")
	if b == nil {
		return out
	}
	for _, k := range b.keys {
		v := b.vals[k]
		cur, has := out.vals[k]
		switch {
		case !has:
			out.keys = append(out.keys, k)
			out.vals[k] = v
		case k == "properties":
			co, _ := cur.(*jsonObject)
			bo, _ := v.(*jsonObject)
			m := withoutKey(co, "")
			if bo != nil {
				for _, pk := range bo.keys {
					if _, dup := m.vals[pk]; !dup {
						m.keys = append(m.keys, pk)
					}
					m.vals[pk] = bo.vals[pk]
				}
			}
			out.vals[k] = m
		case k == "required":
			cl, _ := cur.([]any)
			bl, _ := v.([]any)
			out.vals[k] = append(append([]any{}, cl...), bl...)
		}
	}
	return out
}

// schemaType returns the type to write: the first non-null of a type list,
// else what the keywords imply, else "string".
func schemaType(o *jsonObject) string {
	switch t := o.vals["type"].(type) {
	case string:
		return t
	case []any:
		first := ""
		for _, e := range t {
			s, _ := e.(string)
			if s != "null" {
				return s
			}
			first = s
		}
		if first != "" {
			return first
		}
	}
	for _, k := range []string{"properties", "required", "additionalProperties", "minProperties"} {
		if _, ok := o.vals[k]; ok {
			return "object"
		}
	}
	for _, k := range []string{"items", "prefixItems", "minItems", "maxItems"} {
		if _, ok := o.vals[k]; ok {
			return "array"
		}
	}
	for _, k := range []string{"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"} {
		if _, ok := o.vals[k]; ok {
			return "number"
		}
	}
	return "string"
}

// seed derives the seed of a value's i-th part (a property, an item) from
// the value's: the formula the simulator has always used for tool
// arguments' properties.
func seed(x uint32, i int) uint32 { return x + uint32(i)*0x9e3779b1 }

func (f *schemaFiller) object(o *jsonObject, x uint32, depth int) error {
	props, _ := o.vals["properties"].(*jsonObject)
	required := map[string]bool{}
	if list, ok := o.vals["required"].([]any); ok {
		for _, r := range list {
			if s, ok := r.(string); ok {
				required[s] = true
			}
		}
	}
	minProps := intKeyword(o, "minProperties", 0)
	maxProps := intKeyword(o, "maxProperties", math.MaxInt)
	f.b = append(f.b, '{')
	n := 0
	written := map[string]bool{}
	write := func(name string, s any, sx uint32) error {
		written[name] = true
		if n > 0 {
			f.b = append(f.b, ", "...)
		}
		f.b = appendJSONString(f.b, name)
		f.b = append(f.b, ": "...)
		n++
		return f.value(s, sx, depth+1)
	}
	if props != nil {
		// Required properties are written wherever the schema lists them;
		// optional ones fill up to optionalProps (or minProperties).
		optional := max(optionalProps, minProps) - len(required)
		for i, name := range props.keys {
			if !required[name] {
				if optional <= 0 || n >= maxProps || depth >= maxSchemaDepth/2 {
					continue
				}
				optional--
			}
			if err := write(name, props.vals[name], seed(x, i)); err != nil {
				return err
			}
		}
	}
	// Required names the properties do not describe, and minProperties
	// beyond the listed properties, take strings where extra properties
	// are allowed.
	reqList, _ := o.vals["required"].([]any)
	for _, r := range reqList {
		if name, ok := r.(string); ok {
			if _, listed := props.get(name); !listed && !written[name] {
				if err := write(name, additional(o), seed(x, n)); err != nil {
					return err
				}
			}
		}
	}
	if ap, ok := o.vals["additionalProperties"]; !ok || ap != false {
		for k := 0; n < minProps; k++ {
			name := strings.TrimSpace(word(x, 100+k))
			if _, listed := props.get(name); listed || written[name] {
				name += strconv.Itoa(k)
			}
			if err := write(name, additional(o), seed(x, n)); err != nil {
				return err
			}
		}
	}
	f.b = append(f.b, '}')
	return nil
}

// additional is the schema of properties the object does not list.
func additional(o *jsonObject) any {
	if ap, ok := o.vals["additionalProperties"].(*jsonObject); ok {
		return ap
	}
	return nil
}

func (f *schemaFiller) array(o *jsonObject, x uint32, depth int) error {
	minItems := intKeyword(o, "minItems", 0)
	maxItems := intKeyword(o, "maxItems", math.MaxInt)
	prefix, _ := o.vals["prefixItems"].([]any)
	items := o.vals["items"]
	if list, ok := items.([]any); ok { // draft 4–7 tuple form
		prefix, items = list, o.vals["additionalItems"]
	}
	n := max(minItems, min(1, maxItems))
	if depth >= maxSchemaDepth/2 {
		n = minItems
	}
	n = max(n, min(len(prefix), maxItems))
	f.b = append(f.b, '[')
	for i := range n {
		if i > 0 {
			f.b = append(f.b, ", "...)
		}
		s := items
		if i < len(prefix) {
			s = prefix[i]
		}
		if err := f.value(s, mix(x, uint32(i+1)), depth+1); err != nil {
			return err
		}
	}
	f.b = append(f.b, ']')
	return nil
}

// intKeyword reads a non-negative integer keyword, def when absent.
func intKeyword(o *jsonObject, key string, def int) int {
	n, ok := o.vals[key].(json.Number)
	if !ok {
		return def
	}
	v, err := n.Float64()
	if err != nil || v < 0 {
		return def
	}
	return int(min(v, 1<<20))
}

// bounds reads a numeric range: lo and hi, whether each is exclusive, and
// whether each was given. Draft 4's boolean exclusiveMinimum/Maximum and
// draft 6's numeric ones are both read.
func bounds(o *jsonObject) (lo, hi float64, loEx, hiEx, hasLo, hasHi bool) {
	num := func(k string) (float64, bool) {
		n, ok := o.vals[k].(json.Number)
		if !ok {
			return 0, false
		}
		v, err := n.Float64()
		return v, err == nil
	}
	lo, hasLo = num("minimum")
	hi, hasHi = num("maximum")
	if v, ok := num("exclusiveMinimum"); ok && (!hasLo || v >= lo) {
		lo, hasLo, loEx = v, true, true
	} else if o.vals["exclusiveMinimum"] == true {
		loEx = hasLo
	}
	if v, ok := num("exclusiveMaximum"); ok && (!hasHi || v <= hi) {
		hi, hasHi, hiEx = v, true, true
	} else if o.vals["exclusiveMaximum"] == true {
		hiEx = hasHi
	}
	return
}

// appendInteger appends an integer in the schema's range: x%100 when
// unbounded, else counted from the lower bound (or back from the upper).
func appendInteger(b []byte, o *jsonObject, x uint32) []byte {
	lo, hi, loEx, hiEx, hasLo, hasHi := bounds(o)
	l, h := int64(0), int64(99)
	switch {
	case hasLo && hasHi:
		l, h = ceilInt(lo, loEx), floorInt(hi, hiEx)
	case hasLo:
		l = ceilInt(lo, loEx)
		h = l + 99
	case hasHi:
		h = floorInt(hi, hiEx)
		l = h - 99
	}
	if h < l {
		h = l // an empty range: the bound, best effort
	}
	v := l + int64(uint64(x)%uint64(h-l+1))
	if m, ok := o.vals["multipleOf"].(json.Number); ok {
		if step, err := m.Int64(); err == nil && step > 0 {
			r := ((v % step) + step) % step
			if r != 0 {
				if v-r >= l {
					v -= r
				} else {
					v += step - r
				}
			}
		}
	}
	return strconv.AppendInt(b, v, 10)
}

func ceilInt(v float64, exclusive bool) int64 {
	c := math.Ceil(v)
	if exclusive && c == v {
		c++
	}
	return int64(max(min(c, 1<<53), -(1 << 53)))
}

func floorInt(v float64, exclusive bool) int64 {
	c := math.Floor(v)
	if exclusive && c == v {
		c--
	}
	return int64(max(min(c, 1<<53), -(1 << 53)))
}

// appendNumber appends a number in the schema's range: one of a thousand
// steps across it (x%1000/10 when unbounded), never on an exclusive bound.
func appendNumber(b []byte, o *jsonObject, x uint32) []byte {
	lo, hi, loEx, hiEx, hasLo, hasHi := bounds(o)
	switch {
	case hasLo && !hasHi:
		hi = lo + 100
	case hasHi && !hasLo:
		lo = hi - 100
	case !hasLo && !hasHi:
		lo, hi = 0, 100
	}
	step := float64(x % 1000)
	v := lo + (hi-lo)*step/1000
	if !hasLo && !hasHi {
		v = step / 10 // the simulator's unbounded numbers: 0.0 to 99.9
	}
	if (loEx && v <= lo) || (hiEx && v >= hi) {
		v = lo + (hi-lo)/2
	}
	if m, ok := o.vals["multipleOf"].(json.Number); ok {
		if step, err := m.Float64(); err == nil && step > 0 {
			c := math.Ceil(v/step) * step
			if c > hi || (hiEx && c >= hi) {
				c = math.Floor(v/step) * step
			}
			v = c
		}
	}
	return appendPyFloat(b, v)
}

// stringValue returns a string the schema accepts.
func stringValue(o *jsonObject, x uint32) string {
	var s string
	format, _ := o.vals["format"].(string)
	pattern, _ := o.vals["pattern"].(string)
	switch {
	case pattern != "":
		if v, err := regexFill(pattern, x); err == nil {
			return v
		}
		s = fillerWords(x)
	case format == "date-time":
		s = fmt.Sprintf("2025-%02d-%02dT%02d:%02d:00Z", 1+x%12, 1+x%28, x%24, x%60)
	case format == "date":
		s = fmt.Sprintf("2025-%02d-%02d", 1+x%12, 1+x%28)
	case format == "time":
		s = fmt.Sprintf("%02d:%02d:00Z", x%24, x%60)
	case format == "email":
		s = strings.TrimSpace(word(x, 0)) + "@example.com"
	case format == "uuid":
		h := appendHex64(nil, uint64(splitmix(uint64(x)))) // 16 hex digits
		g := appendHex64(nil, uint64(splitmix(uint64(x)^0x5bd1e995)))
		s = string(h[:8]) + "-" + string(h[8:12]) + "-4" + string(h[13:16]) + "-8" + string(g[1:4]) + "-" + string(g[4:16])
	case format == "uri" || format == "url" || format == "iri":
		s = "https://example.com/" + strings.TrimSpace(word(x, 0))
	case format == "hostname":
		s = strings.TrimSpace(word(x, 0)) + ".example.com"
	case format == "ipv4":
		s = fmt.Sprintf("192.0.2.%d", 1+x%254)
	case format == "ipv6":
		s = fmt.Sprintf("2001:db8::%x", 1+x%0xfffe)
	default:
		s = fillerWords(x)
	}
	minLen := intKeyword(o, "minLength", 0)
	maxLen := intKeyword(o, "maxLength", math.MaxInt)
	for k := 2; len(s) < minLen; k++ {
		s += " " + strings.TrimSpace(word(x, k))
	}
	if len(s) > maxLen {
		s = strings.TrimRight(s[:maxLen], " ")
		for len(s) < minLen { // trimming a space may undershoot
			s += "a"
		}
	}
	return s
}

// fillerWords is the simulator's string value: two words, as tool
// arguments have always had.
func fillerWords(x uint32) string {
	second := word(x, 1)
	return word(x, 0) + second[:len(second)-1]
}
