package server

import (
	"runtime"
	"strings"
	"testing"
)

// hostileBodies are 4 MiB request bodies shaped to make a reader allocate:
// a million tiny messages, a million tiny content parts, a huge flat object
// of distinct keys, an array of a million empty arrays.
func hostileBodies() map[string][]byte {
	const size = 4 << 20
	fill := func(prefix, unit, suffix string) []byte {
		n := (size - len(prefix) - len(suffix)) / len(unit)
		return []byte(prefix + strings.TrimSuffix(strings.Repeat(unit, n), ",") + suffix)
	}
	keys := func() []byte {
		var sb strings.Builder
		sb.WriteString(`{"model":"m","messages":[{"role":"user","content":"hi"}],"x":{`)
		for i := 0; sb.Len() < size-16; i++ {
			if i > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(`"k`)
			sb.WriteString(strings.Repeat("x", i%7))
			sb.WriteString(itoa36(i))
			sb.WriteString(`":0`)
		}
		sb.WriteString(`}}`)
		return []byte(sb.String())
	}
	return map[string][]byte{
		"messages": fill(`{"model":"m","messages":[`, `{"role":"u"},`, `]}`),
		"parts":    fill(`{"model":"m","messages":[{"role":"user","content":[`, `{"type":"text"},`, `]}]}`),
		"keys":     keys(),
		"arrays":   fill(`{"model":"m","messages":[{"role":"user","content":"hi"}],"x":[`, `[],`, `]}`),
	}
}

func itoa36(i int) string {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 36 {
		b = append([]byte{digits[i%36]}, b...)
	}
	return string(b)
}

// TestHostileBodiesCostMemoryInProportion: reading a 4 MiB body of any
// shape allocates at most a small multiple of the body (it once took
// ~370 MB), so four at once cannot take the gateway down.
func TestHostileBodiesCostMemoryInProportion(t *testing.T) {
	lim := parseLimits{maxDepth: 64, mediaPart: DefaultMediaPartTokens, defaultMax: func(string) int64 { return 1024 }}
	for name, body := range hostileBodies() {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, _ = parseRequest(chatEndpoint, body, "", lim)
		runtime.ReadMemStats(&after)
		per := int64(after.TotalAlloc - before.TotalAlloc)
		t.Logf("%s: %d-byte body, %d bytes allocated (%.1fx)", name, len(body), per, float64(per)/float64(len(body)))
		if per > 4*int64(len(body)) {
			t.Errorf("%s: reading a %d-byte body allocated %d bytes", name, len(body), per)
		}
	}
}
