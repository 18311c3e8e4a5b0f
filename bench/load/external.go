package load

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// runExternal runs the plan against a deployment the bench did not start.
func (b *bench) runExternal(ctx context.Context, s Side, i int) (*Report, error) {
	o := &b.opts
	t, err := b.target(s, i)
	if err != nil {
		return nil, err
	}
	model := s.Model
	if model == "" && o.Replay == "" {
		if model, err = firstModel(ctx, t); err != nil {
			return nil, err
		}
		fmt.Fprintf(o.Stderr, "bench: model %q (the first the target lists; --model to choose)\n", model)
	}
	var fleet Fleet
	if len(b.plan.Actions) > 0 {
		fleet = &Hooks{OnKill: o.OnKill, OnScaleOut: o.OnScaleOut, Timeout: o.HookTimeout, Stderr: o.Stderr,
			Env: []string{"TAILGATE_BENCH_SIDE=" + sideName(i), "TAILGATE_BENCH_TARGET=" + t.BaseURL}}
	}
	return b.runOne(ctx, t, model, fleet)
}

// target turns a (checked) side into a Target, reading its secrets.
func (b *bench) target(s Side, i int) (Target, error) {
	t := Target{Label: s.Label, BaseURL: strings.TrimSuffix(s.Target, "/"), AdminURL: strings.TrimSuffix(s.Admin, "/"),
		AdminTenant: b.opts.AdminTenant}
	if !strings.HasSuffix(t.BaseURL, "/v1") {
		fmt.Fprintf(b.opts.Stderr, "bench: warning: %s does not end in /v1; requests go to %s/chat/completions\n", t.BaseURL, t.BaseURL)
	}
	var err error
	if t.Key, err = readSecret(s.Key, s.KeyFile, "key"); err != nil {
		return t, err
	}
	if s.Admin != "" {
		if t.AdminToken, err = readSecret("", s.AdminTokenFile, "admin token"); err != nil {
			return t, err
		}
	}
	if t.Label == "" {
		t.Label = t.BaseURL
		if b.comparing() {
			t.Label = sideName(i) + ": " + t.Label
		}
	}
	return t, nil
}

// readSecret returns v, or the trimmed content of file when one is named.
func readSecret(v, file, what string) (string, error) {
	if file == "" {
		return v, nil
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s file: %w", what, err)
	}
	return strings.TrimSpace(string(raw)), nil
}

// firstModel asks the target which models it serves.
func firstModel(ctx context.Context, t Target) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.BaseURL+"/models", nil)
	if err != nil {
		return "", err
	}
	if t.Key != "" {
		req.Header.Set("Authorization", "Bearer "+t.Key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("list models (give --model to skip): %w", err)
	}
	defer resp.Body.Close()
	var body struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("list models at %s: status %d (give --model to skip)", t.BaseURL, resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&body); err != nil || len(body.Data) == 0 {
		return "", fmt.Errorf("%s/models lists no model: give --model", t.BaseURL)
	}
	return body.Data[0].ID, nil
}
