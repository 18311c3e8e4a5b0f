package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving"
)

func getRegionStatus(t *testing.T, base string) (serving.RegionStatus, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+serving.RegionStatusPath, nil)
	req.Header.Set("Authorization", "Bearer "+servertest.EdgeToken) // no key: an edge's token
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d %s", serving.RegionStatusPath, resp.StatusCode, raw)
	}
	var st serving.RegionStatus
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatalf("status is not JSON: %v: %s", err, raw)
	}
	return st, string(raw)
}

// The status an edge polls names the region, its models with ready
// replicas and recent TTFT, and never a tenant, key or replica address.
func TestRegionStatusSaysWhatAnEdgeNeedsAndNoSecrets(t *testing.T) {
	h := servertest.Start(t, servertest.Options{
		Replicas: 2,
		Router:   router.Config{Hedge: router.HedgeConfig{Enabled: true, MinSamples: 5}},
	})
	h.Srv.SetRegion("eu-west")
	secret := h.Key(policy.KeyOptions{Tenant: "acme-secret-tenant"})
	for range 10 {
		resp := h.Post("/v1/chat/completions", secret,
			`{"model":"`+servertest.SimModel+`","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request = %d", resp.StatusCode)
		}
	}
	st, raw := getRegionStatus(t, h.Public.URL)
	if st.Region != "eu-west" || st.Draining {
		t.Fatalf("region %q draining %v, want eu-west and not draining", st.Region, st.Draining)
	}
	if len(st.Models) != 1 || st.Models[0].ID != servertest.SimModel || st.Models[0].ReadyReplicas != 2 {
		t.Fatalf("models = %+v, want %s with 2 ready replicas", st.Models, servertest.SimModel)
	}
	if m := st.Models[0]; m.TTFTP50 <= 0 || m.TTFTP95 < m.TTFTP50 {
		t.Fatalf("ttft p50 %v p95 %v after 10 streams, want 0 < p50 ≤ p95", m.TTFTP50, m.TTFTP95)
	}
	for _, never := range []string{"acme-secret-tenant", secret, policy.DisplayPrefix(secret)} {
		if strings.Contains(raw, never) {
			t.Fatalf("status shows %q: %s", never, raw)
		}
	}
	for _, up := range h.Upstreams {
		u, _ := url.Parse(up.URL)
		if strings.Contains(raw, u.Host) {
			t.Fatalf("status shows a replica address %s: %s", u.Host, raw)
		}
	}
	for _, rep := range h.Reg.Replicas() {
		if strings.Contains(raw, `"`+rep.ID+`"`) {
			t.Fatalf("status shows a replica id %s: %s", rep.ID, raw)
		}
	}
}

// Draining shows at once (the cache does not hide it), whether the
// gateway is told so or every replica drains.
func TestRegionStatusDraining(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	if st, _ := getRegionStatus(t, h.Public.URL); st.Draining {
		t.Fatal("a fresh gateway says draining")
	}
	h.Srv.SetDraining(true)
	if st, _ := getRegionStatus(t, h.Public.URL); !st.Draining {
		t.Fatal("SetDraining(true) not shown at once")
	}
	h.Srv.SetDraining(false)
	h.Reg.Replicas()[0].SetState(router.StateDraining, "draining")
	// The cache may still hold the last status for up to 250 ms; the
	// replica's drain is seen once it expires (bounded: 40 polls).
	for i := 0; ; i++ {
		st, _ := getRegionStatus(t, h.Public.URL)
		if st.Draining && len(st.Models) == 0 {
			break
		}
		if i == 40 {
			t.Fatalf("every replica draining, status still %+v", st)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// BenchmarkRegionStatus measures a poll of the status, served from the
// 250 ms cache, against encoding it each time: the cost many edges
// polling every second put on a gateway.
func BenchmarkRegionStatus(b *testing.B) {
	h := servertest.Start(b, servertest.Options{Replicas: 4})
	h.Srv.SetRegion("eu-west")
	pub := h.Srv.Public()
	b.Run("cached", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			req := httptest.NewRequest(http.MethodGet, serving.RegionStatusPath, nil)
			req.Header.Set("Authorization", "Bearer "+servertest.EdgeToken)
			for pb.Next() {
				w := httptest.NewRecorder()
				pub.ServeHTTP(w, req)
				if w.Code != 200 {
					b.Fatal(w.Code)
				}
			}
		})
	})
	b.Run("uncached", func(b *testing.B) {
		b.ReportAllocs()
		req := httptest.NewRequest(http.MethodGet, serving.RegionStatusPath, nil)
		req.Header.Set("Authorization", "Bearer "+servertest.EdgeToken)
		for b.Loop() {
			h.Srv.SetDraining(false) // drops the cache
			w := httptest.NewRecorder()
			pub.ServeHTTP(w, req)
		}
	})
}

// The status lists every model and its load: it is served to edges only,
// holding the gateway's edge token, not to a client, a key holder or the
// cluster token's holder.
func TestRegionStatusIsForEdgesOnly(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	key := h.Key(policy.KeyOptions{})
	for _, auth := range []string{"", "Bearer " + key, "Bearer " + servertest.ClusterToken, "Bearer " + servertest.EdgeToken + "x"} {
		req, _ := http.NewRequest(http.MethodGet, h.Public.URL+serving.RegionStatusPath, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(raw), `"invalid_edge_token"`) || strings.Contains(string(raw), "models") {
			t.Fatalf("status with %q: %d %s, want 401 invalid_edge_token", auth, resp.StatusCode, raw)
		}
	}
	getRegionStatus(t, h.Public.URL) // with the edge token: 200
}
