package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/fleet"
)

// noGPU is a provider whose starts fail.
type noGPU struct{}

func (noGPU) Start(context.Context, string, string) error {
	return errors.New("no GPU available in region")
}
func (noGPU) Stop(context.Context, string, string) error { return nil }

// GET /admin/v1/fleet shows nothing without a controller, and with one the
// model's bounds and a failing provider: its failed start with the error,
// the failures counted and when the next try is due.
func TestAdminFleetShowsAFailingProvider(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	if code, body := admin(t, h, "GET", "/admin/v1/fleet"); code != 200 || body != `{"actions":[],"models":[],"provider":null}`+"\n" {
		t.Fatalf("without a controller: %d %s", code, body)
	}
	c, err := fleet.New(fleet.Config{Models: map[string]fleet.Model{"big-model": {Min: 1, Max: 2}}, Backoff: time.Hour}, h.Reg, noGPU{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.Srv.SetFleet(server.Fleet{Status: func() any { return c.Status() }, Wake: c.Wake})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()

	var st fleet.Status
	testkit.WaitFor(t, "a failed start shown", func() bool {
		code, body := admin(t, h, "GET", "/admin/v1/fleet")
		return code == 200 && json.Unmarshal([]byte(body), &st) == nil && len(st.Actions) > 0
	})
	m := st.Models[0]
	if m.Model != "big-model" || m.Min != 1 || m.Max != 2 || m.Desired != 1 || m.Current != 0 || m.Failures != 1 || m.NextRetry == nil {
		t.Fatalf("model %+v, want big-model min 1 max 2 desired 1, none current, 1 failure, a next retry", m)
	}
	if a := st.Actions[0]; a.Kind != "start" || a.Outcome != "error" || a.Error != "no GPU available in region" || a.Replica != "big-model-1" || a.Time.IsZero() {
		t.Fatalf("action %+v, want big-model-1's failed start with its error", a)
	}
}
