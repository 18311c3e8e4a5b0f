package server

import (
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/time/rate"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestAuthFailureLogIsRateLimited: a client retrying a bad key in a loop
// is counted every time but logged a few times only; the next line, once
// the log's rate allows it, says how many refusals it left out.
func TestAuthFailureLogIsRateLimited(t *testing.T) {
	var logs testkit.Buffer
	reg := prometheus.NewRegistry()
	a, err := newAuthFailures(reg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	const flood = 100
	for range flood {
		a.refused(authInvalid, "tg-abcdefgh", "model", "m")
	}
	var m dto.Metric
	if err := a.total[slices.Index(authReasons[:], authInvalid)].Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != flood {
		t.Errorf("tailgate_auth_failures_total{reason=invalid} = %v after %d refusals", got, flood)
	}
	lines := strings.Count(logs.String(), "request refused for its API key")
	if lines == 0 || lines > 3 {
		t.Fatalf("%d refusals in a loop logged %d lines, want 1 to 3:\n%s", flood, lines, logs.String())
	}
	// Time passes (the limiter allows again): the next line counts the quiet ones.
	a.every = rate.NewLimiter(rate.Inf, 1)
	a.refused(authRevoked, "tg-abcdefgh")
	last := testkit.LastLine(logs.String())
	if want := "refused_since_last_log=" + strconv.Itoa(flood-lines); !strings.Contains(last, want) || !strings.Contains(last, "reason=revoked") {
		t.Errorf("the line after the quiet spell %q does not say %s", last, want)
	}
}
