package server

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/serving/hop"
)

// TestAttemptTraceConnectStage: an attempt on a new connection to its
// replica records how long the connection took (the ledger's connect
// stage), one on a reused connection records none; either way the request
// is known to have been written (what makes a failure after it not safe to
// send elsewhere).
func TestAttemptTraceConnectStage(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "{}")
	}))
	defer engine.Close()
	for _, tr := range []struct {
		name string
		rt   http.RoundTripper
	}{
		{"hop", NewTransport(0, nil, hop.Hop)},
		{"net/http", NewTransport(0, nil, hop.NetHTTP)},
	} {
		t.Run(tr.name, func(t *testing.T) {
			attempt := func() *upstream {
				u := &upstream{}
				req, err := http.NewRequestWithContext(u.tr.init(context.Background()), http.MethodPost, engine.URL, http.NoBody)
				if err != nil {
					t.Fatal(err)
				}
				resp, err := tr.rt.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				u.tr.stages(u)
				if u.tr.wrote.Load() == 0 {
					t.Errorf("the request's write was not recorded")
				}
				return u
			}
			if u := attempt(); u.stages.Connect <= 0 {
				t.Errorf("connect stage %v on a new connection, want > 0", u.stages.Connect)
			}
			if u := attempt(); u.stages.Connect != 0 {
				t.Errorf("connect stage %v on a reused connection, want 0", u.stages.Connect)
			}
		})
	}
}

// TestIdempotencyKeyIsTheRequestsAndUniquePerAttempt: every upstream request
// carries a key made of the request's id and the attempt's sequence number
// (what lets the transport send it again on a fresh connection), different
// for each attempt of one request.
func TestIdempotencyKeyIsTheRequestsAndUniquePerAttempt(t *testing.T) {
	cl := &call{id: "req_0123456789abcdef"}
	keys := map[string]bool{}
	for range 3 {
		k := idempotencyKey(cl)
		if !strings.HasPrefix(k, cl.id+"-") || len(k) == len(cl.id)+1 || keys[k] {
			t.Fatalf("key %q: want %s-<attempt>, new for each attempt (had %v)", k, cl.id, keys)
		}
		keys[k] = true
	}
	if n := testing.AllocsPerRun(100, func() { _ = idempotencyKey(cl) }); n > 1 {
		t.Errorf("the key costs %.0f allocations, want 1 (its string; openAttempt holds the header's value)", n)
	}
}
