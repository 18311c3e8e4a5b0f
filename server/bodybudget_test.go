package server_test

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// bodyBytesInFlight reads the gateway's tailgate_request_body_bytes_inflight
// (-1 if it cannot).
func bodyBytesInFlight(h *servertest.Gateway) int64 {
	mfs, err := h.Metrics.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() == "tailgate_request_body_bytes_inflight" {
			return int64(mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
	return -1
}

// TestBodyBudgetBoundsUploadsInFlight: with a budget of two uploads (each
// counted twice: as read and as the form forwarded), two large uploads in
// flight hold it whole and never more; a third waits, and
// once the wait has passed gets 503 with Retry-After; after the two finish
// the budget is given back and the next uploads are served.
func TestBodyBudgetBoundsUploadsInFlight(t *testing.T) {
	const upload = 1 << 20
	h := servertest.Start(t, servertest.Options{Replicas: 1, Server: server.Config{
		MaxBodyBytes: upload, MaxAudioBytes: upload, MaxBodyBytesInFlight: 4 * upload, MaxBodyBytesPerTenant: 4 * upload,
		BodyBudgetWait: 200 * time.Millisecond, BodyTimeout: time.Minute,
	}})
	secret := h.Key(policy.KeyOptions{})
	const ctype = "multipart/form-data; boundary=B"
	head := "--B\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n" + servertest.SimModel + "\r\n" +
		"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n"
	tail := "\r\n--B--\r\n"
	form := head + strings.Repeat("\x01", upload-len(head)-len(tail)) + tail

	// The gauge, sampled while the test runs, never passes the budget.
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak.Store(max(peak.Load(), bodyBytesInFlight(h)))
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()

	// Two uploads send their head and hold the rest back.
	type held struct {
		w      *io.PipeWriter
		status chan int
	}
	var holders []held
	var wg sync.WaitGroup
	for range 2 {
		pr, pw := io.Pipe()
		req, err := http.NewRequest(http.MethodPost, h.Public.URL+"/v1/audio/transcriptions", pr)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = int64(len(form))
		req.Header.Set("Content-Type", ctype)
		req.Header.Set("Authorization", "Bearer "+secret)
		hd := held{w: pw, status: make(chan int, 1)}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				hd.status <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			hd.status <- resp.StatusCode
		}()
		if _, err := pw.Write([]byte(form[:len(head)])); err != nil {
			t.Fatal(err)
		}
		holders = append(holders, hd)
	}
	for deadline := time.Now().Add(10 * time.Second); bodyBytesInFlight(h) < 4*upload; {
		if time.Now().After(deadline) {
			t.Fatalf("the two uploads hold %d bytes, want %d", bodyBytesInFlight(h), 4*upload)
		}
		time.Sleep(2 * time.Millisecond)
	}

	// A third upload (another tenant's: its own share is free) finds the
	// budget full: 503 with Retry-After once the wait passed.
	other := h.Key(policy.KeyOptions{Tenant: "other"})
	r := h.Do(http.MethodPost, "/v1/audio/transcriptions", other, ctype, strings.NewReader(form))
	code, _, _ := decodeError(t, r)
	r.Body.Close()
	if r.StatusCode != http.StatusServiceUnavailable || code != "body_budget_exhausted" || r.Header.Get("Retry-After") == "" {
		t.Fatalf("an upload past the budget: %d %q Retry-After %q", r.StatusCode, code, r.Header.Get("Retry-After"))
	}
	// A chunked one too (it reserves as it reads).
	r = h.Do(http.MethodPost, "/v1/audio/transcriptions", other, ctype, io.MultiReader(strings.NewReader(form)))
	code, _, _ = decodeError(t, r)
	r.Body.Close()
	if r.StatusCode != http.StatusServiceUnavailable || code != "body_budget_exhausted" {
		t.Fatalf("a chunked upload past the budget: %d %q", r.StatusCode, code)
	}

	// The two finish and are served; their bytes are given back.
	for _, hd := range holders {
		if _, err := hd.w.Write([]byte(form[len(head):])); err != nil {
			t.Fatal(err)
		}
		hd.w.Close()
	}
	wg.Wait()
	for i, hd := range holders {
		if s := <-hd.status; s != http.StatusOK {
			t.Fatalf("held upload %d: status %d", i, s)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); bodyBytesInFlight(h) != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d body bytes still held after every request ended", bodyBytesInFlight(h))
		}
		time.Sleep(2 * time.Millisecond)
	}
	for _, body := range []io.Reader{strings.NewReader(form), io.MultiReader(bytes.NewReader([]byte(form)))} {
		r = h.Do(http.MethodPost, "/v1/audio/transcriptions", secret, ctype, body)
		raw, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusOK {
			t.Fatalf("an upload after the others ended: %d %s", r.StatusCode, raw)
		}
	}
	close(stop)
	<-sampled
	// A re-encoded form may be a few bytes longer than the one read (its
	// new boundary); those are booked past the budget, not waited for.
	if p := peak.Load(); p > 4*upload+1024 {
		t.Fatalf("%d body bytes held at once, over the budget of %d", p, 4*upload)
	}
	// A handler gives its bytes back as its request ends, which can be a
	// moment after the client has the whole answer.
	for deadline := time.Now().Add(5 * time.Second); bodyBytesInFlight(h) != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d body bytes still held after the last uploads ended", bodyBytesInFlight(h))
		}
		time.Sleep(2 * time.Millisecond)
	}
}
