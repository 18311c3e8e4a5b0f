package data

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// appendRecord appends r as the payload of its commit-log record: the object
// encoding/json makes of a LedgerRow (recoverRows decodes it with
// encoding/json), written by hand because it is on every answer's path —
// json.Marshal's reflection cost about 10 µs a row. A field at its zero
// value (0, "", false, a nil attempt log) is left out: recoverRows decodes
// each record into a zero row, so it comes back the same, and a typical
// answer's record is about a third shorter (BenchmarkCommitRecord).
func appendRecord(b []byte, r *LedgerRow) []byte {
	b = append(b, `{"ID":`...)
	b = appendString(b, r.ID)
	b = append(b, `,"Time":`...)
	if r.Time.IsZero() {
		b = append(b, `"0001-01-01T00:00:00Z"`...)
	} else {
		b = append(b, '"')
		b = r.Time.AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	b = appendNonZero(b, `,"TenantID":`, r.TenantID)
	b = appendStr(b, `,"Tenant":`, r.Tenant)
	b = appendStr(b, `,"KeyID":`, r.KeyID)
	b = appendStr(b, `,"Model":`, r.Model)
	b = appendStr(b, `,"Upstream":`, r.Upstream)
	b = appendTrue(b, `,"Stream":true`, r.Stream)
	b = appendStr(b, `,"Endpoint":`, r.Endpoint)
	b = appendNonZero(b, `,"PromptTokens":`, r.PromptTokens)
	b = appendNonZero(b, `,"CompletionTokens":`, r.CompletionTokens)
	b = appendNonZero(b, `,"HedgeOverheadTokens":`, r.HedgeOverheadTokens)
	b = appendNonZero(b, `,"CostMicros":`, r.CostMicros)
	b = appendNonZero(b, `,"Status":`, int64(r.Status))
	b = appendStr(b, `,"Outcome":`, string(r.Outcome))
	b = appendStr(b, `,"Error":`, string(r.Error))
	b = appendNonZero(b, `,"Attempts":`, int64(r.Attempts))
	b = appendTrue(b, `,"Hedged":true`, r.Hedged)
	s := &r.Stages
	b = append(b, `,"Stages":{`...)
	n := len(b)
	b = appendNonZero(b, `,"Gateway":`, int64(s.Gateway))
	b = appendNonZero(b, `,"Connect":`, int64(s.Connect))
	b = appendNonZero(b, `,"UpstreamTTFT":`, int64(s.UpstreamTTFT))
	b = appendNonZero(b, `,"EngineQueue":`, int64(s.EngineQueue))
	b = appendNonZero(b, `,"EngineTTFT":`, int64(s.EngineTTFT))
	b = appendNonZero(b, `,"Network":`, int64(s.Network))
	b = appendNonZero(b, `,"TTFT":`, int64(s.TTFT))
	b = appendNonZero(b, `,"Total":`, int64(s.Total))
	b = appendNonZero(b, `,"Hold":`, int64(s.Hold))
	b = dropComma(b, n)
	b = append(b, '}')
	if r.AttemptLog != nil {
		b = append(b, `,"AttemptLog":[`...)
		for i := range r.AttemptLog {
			a := &r.AttemptLog[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '{')
			n := len(b)
			b = appendNonZero(b, `,"N":`, int64(a.N))
			b = appendStr(b, `,"Replica":`, a.Replica)
			b = appendStr(b, `,"Role":`, a.Role)
			b = appendNonZero(b, `,"Start":`, int64(a.Start))
			b = appendNonZero(b, `,"TTFT":`, int64(a.TTFT))
			b = appendNonZero(b, `,"End":`, int64(a.End))
			b = appendStr(b, `,"Outcome":`, a.Outcome)
			b = appendStr(b, `,"Reason":`, a.Reason)
			b = appendNonZero(b, `,"PromptTokens":`, a.PromptTokens)
			b = appendNonZero(b, `,"CompletionTokens":`, a.CompletionTokens)
			b = dropComma(b, n)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	b = appendStr(b, `,"Priority":`, r.Priority)
	b = appendNonZero(b, `,"QueueWait":`, int64(r.QueueWait))
	b = appendStr(b, `,"ReplayOf":`, r.ReplayOf)
	return append(b, '}')
}

// dropComma removes the comma at b[n], if any: the one before an object's
// first field.
func dropComma(b []byte, n int) []byte {
	if len(b) > n && b[n] == ',' {
		return append(b[:n], b[n+1:]...)
	}
	return b
}

func appendInt(b []byte, key string, v int64) []byte {
	return strconv.AppendInt(append(b, key...), v, 10)
}

// appendNonZero appends the field key (",\"Name\":") with the value v;
// not at all if v is 0, which a field left out decodes to.
func appendNonZero(b []byte, key string, v int64) []byte {
	if v == 0 {
		return b
	}
	return appendInt(b, key, v)
}

// appendStr appends the field key with the string s; not at all if s is
// "".
func appendStr(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return appendString(append(b, key...), s)
}

// appendTrue appends field (",\"Name\":true") if v.
func appendTrue(b []byte, field string, v bool) []byte {
	if v {
		b = append(b, field...)
	}
	return b
}

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD,
// as encoding/json makes it.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if jsonPlain[c] {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				b = append(b, s[start:i]...)
				b = append(b, `\ufffd`...)
				i += size
				start = i
				continue
			}
			i += size
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// jsonPlain says which bytes appendString copies as they are: printable
// ASCII but '"' and '\\'.
var jsonPlain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()
