package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/tailgate-dev/tailgate/router"
)

// Prober checks an OpenAI-compatible replica by listing its models.
type Prober struct {
	Transport http.RoundTripper
	// ClusterToken is sent to registered workers' sidecars (never to
	// static upstreams).
	ClusterToken string
}

// Probe implements router.Prober. A static upstream must answer GET
// /v1/models with at least one model. A registered worker's sidecar must
// answer GET /health: 200 when ready, 503 when alive but not ready.
func (p *Prober) Probe(ctx context.Context, rep *router.Replica) ([]string, error) {
	if !rep.Static {
		return nil, p.probeSidecar(ctx, rep)
	}
	models, contextLen, err := p.listModels(ctx, rep, "")
	if err != nil {
		return nil, err
	}
	rep.SetContextLen(contextLen)
	return models, nil
}

// listModels reads the replica's GET /v1/models: the served names and the
// context length (vLLM's max_model_len; the smallest of the cards that say
// one, 0 when none does — LoRA cards say null).
func (p *Prober) listModels(ctx context.Context, rep *router.Replica, auth string) ([]string, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rep.URL+"/v1/models", nil)
	if err != nil {
		return nil, 0, err
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := p.Transport.RoundTrip(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, 0, fmt.Errorf("/v1/models answered %d", resp.StatusCode)
	}
	var list struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen *int64 `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&list); err != nil {
		return nil, 0, fmt.Errorf("/v1/models: %w", err)
	}
	models := make([]string, 0, len(list.Data))
	var contextLen int64
	for _, m := range list.Data {
		models = append(models, m.ID)
		if n := m.MaxModelLen; n != nil && *n > 0 && (contextLen == 0 || *n < contextLen) {
			contextLen = *n
		}
	}
	if len(models) == 0 {
		return nil, 0, fmt.Errorf("/v1/models lists no model")
	}
	return models, contextLen, nil
}

func (p *Prober) probeSidecar(ctx context.Context, rep *router.Replica) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rep.URL+"/health", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+p.ClusterToken)
	resp, err := p.Transport.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch resp.StatusCode {
	case http.StatusOK:
		// The engine's context length, read when the replica becomes
		// ready (an engine restarted with another --max-model-len is
		// not ready in between). Not knowing it only means the default
		// max_tokens is not capped to fit.
		if rep.State() != router.StateReady || rep.ContextLen() == 0 {
			if _, n, err := p.listModels(ctx, rep, "Bearer "+p.ClusterToken); err == nil {
				rep.SetContextLen(n)
			}
		}
		return nil
	case http.StatusServiceUnavailable:
		return router.ErrProbeNotReady
	}
	return fmt.Errorf("/health answered %d", resp.StatusCode)
}
