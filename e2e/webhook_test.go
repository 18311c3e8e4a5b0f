package e2e

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestBudgetWebhookIsSignedWithItsOwnSecret: the budget webhook's
// signature verifies with DIR/webhook.secret (mode 0600), the secret the
// receiver keeps, and not with the cluster token, which opens every
// sidecar and must stay on the gateway's side.
func TestBudgetWebhookIsSignedWithItsOwnSecret(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the binary")
	}
	type post struct {
		ts, sig string
		body    []byte
	}
	var (
		mu  sync.Mutex
		got []post
	)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, post{r.Header.Get("X-Tailgate-Timestamp"), r.Header.Get("X-Tailgate-Signature"), b})
		mu.Unlock()
	}))
	defer rcv.Close()
	p := startUp(t, "--replicas", "1", "--budget-webhook", rcv.URL)
	key := testkit.LastLine(tailgate(t, "keys", "create", "--data", p.dir, "--tenant", "hooked"))
	// A budget the request fits (its worst case is reserved before it runs)
	// with an alert at 1 %: its spend crosses the alert, so one is posted.
	tailgate(t, "tenants", "set", "--data", p.dir, "hooked", "--budget-tokens", "200", "--budget-alert-percent", "1")
	if code, _, body := chatVia(t, strings.TrimSuffix(p.api, "/v1"), key); code != 200 {
		t.Fatalf("chat: %d %s", code, body)
	}
	testkit.WaitWithin(t, 30*time.Second, "a budget alert posted", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0
	})
	secretFile := filepath.Join(p.dir, "webhook.secret")
	if fi, err := os.Stat(secretFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("webhook.secret: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}
	sign := func(secret string, ps post) string {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(ps.ts + "."))
		m.Write(ps.body)
		return "sha256=" + hex.EncodeToString(m.Sum(nil))
	}
	mu.Lock()
	ps := got[0]
	mu.Unlock()
	if want := sign(readToken(t, secretFile), ps); !hmac.Equal([]byte(want), []byte(ps.sig)) {
		t.Fatalf("signature %s does not verify with webhook.secret (want %s); body %s", ps.sig, want, ps.body)
	}
	if sign(readToken(t, filepath.Join(p.dir, "cluster.token")), ps) == ps.sig {
		t.Fatal("the webhook is signed with the cluster token")
	}
}
