package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"tailgate/router"
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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rep.URL+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.Transport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, fmt.Errorf("/v1/models answered %d", resp.StatusCode)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("/v1/models: %w", err)
	}
	models := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		models = append(models, m.ID)
	}
	if len(models) == 0 {
		return nil, fmt.Errorf("/v1/models lists no model")
	}
	return models, nil
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
		return nil
	case http.StatusServiceUnavailable:
		return router.ErrProbeNotReady
	}
	return fmt.Errorf("/health answered %d", resp.StatusCode)
}
