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

// Probe implements router.Prober: GET /v1/models must answer 200 with at
// least one model.
func (p *Prober) Probe(ctx context.Context, rep *router.Replica) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rep.URL+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	if !rep.Static && p.ClusterToken != "" {
		req.Header.Set("Authorization", "Bearer "+p.ClusterToken)
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
