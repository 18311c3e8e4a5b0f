package server_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/fleet"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// poolBox is a provider whose capacity is an engine already running (a box
// of a rented pool): Start routes the model to it as replica id, Stop takes
// it out of routing.
type poolBox struct {
	h   *servertest.Gateway
	url string
}

func (p poolBox) Start(_ context.Context, model, id string) error {
	p.h.AddReplica(id, p.url, model)
	return nil
}

func (p poolBox) Stop(_ context.Context, _, id string) error {
	p.h.Reg.Remove(id)
	return nil
}

// The dashboard's Fleet panel: hidden without a fleet controller; with one
// managing a model at zero replicas, a request held for that model makes
// the controller start a replica, and the panel lists the model with its
// min, max and current replicas and the start among the recent actions.
func TestDashboardFleetPanelShowsTheControllerStartingAReplica(t *testing.T) {
	d := startDashboard(t, sim.Config{Model: servertest.SimModel})
	b := startBrowser(t, 1280, 1000)
	b.navigate(d.ui.URL + "/ui/#token=" + servertest.AdminToken)
	b.waitFor("the replicas", `document.body.dataset.loaded && document.querySelector("#status").textContent.includes("2/2 replicas ready")`)
	var hidden bool
	b.eval(`document.querySelector("#fleet-panel").hidden`, &hidden)
	if !hidden {
		t.Fatal("the Fleet panel shows without a fleet controller")
	}

	const model = "pool-model"
	box := servertest.StartSims(t, 1, sim.Config{Model: model}, nil)[0]
	c, err := fleet.New(fleet.Config{Models: map[string]fleet.Model{model: {Min: 0, Max: 1}}}, d.h.Reg, poolBox{h: d.h, url: box.Server.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d.h.Srv.SetFleet(server.Fleet{Status: func() any { return c.Status() }, Wake: c.Wake})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// At zero replicas the request is held while the controller starts one.
	secret := d.h.Key(policy.KeyOptions{Tenant: "fleet"})
	if code := d.status(t, secret, `{"model":"`+model+`","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`); code != http.StatusOK {
		t.Fatalf("request held for %s: %d, want 200 once the controller started a replica", model, code)
	}

	b.waitFor("the Fleet panel", `!document.querySelector("#fleet-panel").hidden`)
	b.waitFor("the model's row with a current replica", `[...document.querySelectorAll("#fleet tbody tr")].some((tr) => tr.cells[4] && tr.cells[4].textContent === "1")`)
	var row []string
	b.eval(`[...document.querySelector("#fleet tbody tr").cells].map((td) => td.textContent)`, &row)
	// model, min, max, desired, current, …
	if len(row) < 5 || row[0] != model || row[1] != "0" || row[2] != "1" || row[4] != "1" {
		t.Errorf("Fleet row %q, want %s with min 0, max 1, current 1", row, model)
	}
	b.waitFor("the start among the recent actions", `document.querySelector("#fleet-actions tbody tr")`)
	var action []string
	b.eval(`[...document.querySelector("#fleet-actions tbody tr").cells].map((td) => td.textContent)`, &action)
	// time, model, action, replica, why, outcome, error
	if len(action) < 6 || action[1] != model || action[2] != "start" || action[3] != model+"-1" || action[5] != "ok" {
		t.Errorf("recent action %q, want the ok start of %s-1", action, model)
	}
	b.screenshot("dashboard-fleet.png")
}
