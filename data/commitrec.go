package data

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// appendRecord appends r as the payload of its commit-log record: the object
// encoding/json makes of a LedgerRow (recoverRows decodes it with
// encoding/json), written by hand because it is on every answer's path —
// json.Marshal's reflection cost about 10 µs a row.
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
	b = appendInt(b, `,"TenantID":`, r.TenantID)
	b = append(b, `,"Tenant":`...)
	b = appendString(b, r.Tenant)
	b = append(b, `,"KeyID":`...)
	b = appendString(b, r.KeyID)
	b = append(b, `,"Model":`...)
	b = appendString(b, r.Model)
	b = append(b, `,"Upstream":`...)
	b = appendString(b, r.Upstream)
	b = append(b, `,"Stream":`...)
	b = strconv.AppendBool(b, r.Stream)
	b = append(b, `,"Endpoint":`...)
	b = appendString(b, r.Endpoint)
	b = appendInt(b, `,"PromptTokens":`, r.PromptTokens)
	b = appendInt(b, `,"CompletionTokens":`, r.CompletionTokens)
	b = appendInt(b, `,"HedgeOverheadTokens":`, r.HedgeOverheadTokens)
	b = appendInt(b, `,"CostMicros":`, r.CostMicros)
	b = appendInt(b, `,"Status":`, int64(r.Status))
	b = append(b, `,"Outcome":`...)
	b = appendString(b, string(r.Outcome))
	b = append(b, `,"Error":`...)
	b = appendString(b, string(r.Error))
	b = appendInt(b, `,"Attempts":`, int64(r.Attempts))
	b = append(b, `,"Hedged":`...)
	b = strconv.AppendBool(b, r.Hedged)
	s := &r.Stages
	b = appendInt(b, `,"Stages":{"Gateway":`, int64(s.Gateway))
	b = appendInt(b, `,"Connect":`, int64(s.Connect))
	b = appendInt(b, `,"UpstreamTTFT":`, int64(s.UpstreamTTFT))
	b = appendInt(b, `,"EngineQueue":`, int64(s.EngineQueue))
	b = appendInt(b, `,"EngineTTFT":`, int64(s.EngineTTFT))
	b = appendInt(b, `,"Network":`, int64(s.Network))
	b = appendInt(b, `,"TTFT":`, int64(s.TTFT))
	b = appendInt(b, `,"Total":`, int64(s.Total))
	b = appendInt(b, `,"Hold":`, int64(s.Hold))
	b = append(b, `},"AttemptLog":`...)
	if r.AttemptLog == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range r.AttemptLog {
			a := &r.AttemptLog[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = appendInt(b, `{"N":`, int64(a.N))
			b = append(b, `,"Replica":`...)
			b = appendString(b, a.Replica)
			b = append(b, `,"Role":`...)
			b = appendString(b, a.Role)
			b = appendInt(b, `,"Start":`, int64(a.Start))
			b = appendInt(b, `,"TTFT":`, int64(a.TTFT))
			b = appendInt(b, `,"End":`, int64(a.End))
			b = append(b, `,"Outcome":`...)
			b = appendString(b, a.Outcome)
			b = append(b, `,"Reason":`...)
			b = appendString(b, a.Reason)
			b = appendInt(b, `,"PromptTokens":`, a.PromptTokens)
			b = appendInt(b, `,"CompletionTokens":`, a.CompletionTokens)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	b = append(b, `,"Priority":`...)
	b = appendString(b, r.Priority)
	b = appendInt(b, `,"QueueWait":`, int64(r.QueueWait))
	b = append(b, `,"ReplayOf":`...)
	b = appendString(b, r.ReplayOf)
	return append(b, '}')
}

func appendInt(b []byte, key string, v int64) []byte {
	return strconv.AppendInt(append(b, key...), v, 10)
}

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD,
// as encoding/json makes it.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
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
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
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
