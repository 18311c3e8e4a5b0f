package server_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"testing"

	"golang.org/x/exp/trace"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// The admin listener serves the Go runtime's profiles under the admin token,
// and an execution trace taken there while requests flow reads request by
// request: each is a tailgate.request task.
func TestExecutionTraceFromTheAdminListenerHasATaskPerRequest(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	k := h.Key(policy.KeyOptions{})

	// fetch is safe off the test's goroutine: it fails nothing itself.
	fetch := func(path, token string) (int, []byte, error) {
		req, _ := http.NewRequest(http.MethodGet, h.Admin.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, body, err
	}
	get := func(path, token string) (int, []byte) {
		t.Helper()
		code, body, err := fetch(path, token)
		if err != nil {
			t.Fatal(err)
		}
		return code, body
	}
	if code, _ := get("/debug/pprof/heap", ""); code != http.StatusUnauthorized {
		t.Fatalf("a heap profile without the admin token: %d, want 401", code)
	}
	if code, _ := get("/debug/pprof/cmdline", servertest.AdminToken); code != http.StatusNotFound {
		t.Fatalf("/debug/pprof/cmdline (the process's arguments, which can hold a secret): %d, want 404", code)
	}
	if code, body := get("/debug/pprof/heap", servertest.AdminToken); code != http.StatusOK || len(body) == 0 {
		t.Fatalf("a heap profile with the admin token: %d, %d bytes", code, len(body))
	}

	type result struct {
		code int
		body []byte
		err  error
	}
	traced := make(chan result, 1)
	go func() {
		code, body, err := fetch("/debug/pprof/trace?seconds=1", servertest.AdminToken)
		traced <- result{code, body, err}
	}()
	var tr result
	sent := 0
loop:
	for sent < 500 { // bounded: the trace lasts a second
		select {
		case tr = <-traced:
			break loop
		default:
		}
		resp := h.Post("/v1/chat/completions", k, hiBody)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d during the trace: %d", sent, resp.StatusCode)
		}
		sent++
	}
	if tr.code == 0 && tr.err == nil {
		tr = <-traced
	}
	if tr.err != nil {
		t.Fatalf("the execution trace: %v", tr.err)
	}
	if tr.code != http.StatusOK {
		t.Fatalf("the execution trace: %d %s", tr.code, tr.body)
	}

	r, err := trace.NewReader(bytes.NewReader(tr.body))
	if err != nil {
		t.Fatalf("the trace does not read as a Go execution trace: %v", err)
	}
	tasks := 0
	for {
		ev, err := r.ReadEvent()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Kind() == trace.EventTaskBegin && ev.Task().Type == "tailgate.request" {
			tasks++
		}
	}
	if tasks == 0 || tasks > sent {
		t.Fatalf("%d tailgate.request tasks in a trace taken while %d requests were sent, want between 1 and %d", tasks, sent, sent)
	}
}
