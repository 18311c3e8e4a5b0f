package load

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// ReplicaState is one replica as the gateway's /admin/v1/replicas showed it.
type ReplicaState struct {
	ID            string  `json:"id"`
	State         string  `json:"state"`
	Ready         bool    `json:"ready"`
	Inflight      int     `json:"inflight"`
	EngineWaiting float64 `json:"engine_waiting"`
	EngineRunning float64 `json:"engine_running"`
}

// ReplicaSample is one poll of /admin/v1/replicas.
type ReplicaSample struct {
	At       time.Duration  // from the start of the run
	Replicas []ReplicaState // nil when the poll failed
}

func (s ReplicaSample) find(id string) (ReplicaState, bool) {
	for _, r := range s.Replicas {
		if r.ID == id {
			return r, true
		}
	}
	return ReplicaState{}, false
}

// MarshalJSON writes the sample with its time in seconds.
func (s ReplicaSample) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		AtS      float64        `json:"at_s"`
		Replicas []ReplicaState `json:"replicas"`
	}{float64(s.At.Microseconds()) / 1e6, s.Replicas})
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (s *ReplicaSample) UnmarshalJSON(b []byte) error {
	var j struct {
		AtS      float64        `json:"at_s"`
		Replicas []ReplicaState `json:"replicas"`
	}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*s = ReplicaSample{At: time.Duration(j.AtS * 1e9), Replicas: j.Replicas}
	return nil
}

// adminStages is what the admin API knows of one request.
type adminStages struct {
	Replica  string
	Attempts int
	StageMS  map[string]float64
}

// admin talks to the gateway's admin listener.
type admin struct {
	base   string // http://host:port
	token  string
	tenant string
	hc     *http.Client
}

func newAdmin(base, token, tenant string) *admin {
	if base == "" {
		return nil
	}
	return &admin{base: strings.TrimSuffix(base, "/"), token: token, tenant: tenant,
		hc: &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}}
}

func (a *admin) get(ctx context.Context, path string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+path, nil)
	if err != nil {
		return err
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return fmt.Errorf("admin %s: status %d", path, resp.StatusCode)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(into)
}

// replicas polls /admin/v1/replicas.
func (a *admin) replicas(ctx context.Context) ([]ReplicaState, error) {
	var out struct {
		Data []ReplicaState `json:"data"`
	}
	if err := a.get(ctx, "/admin/v1/replicas", &out); err != nil {
		return nil, err
	}
	if out.Data == nil {
		out.Data = []ReplicaState{}
	}
	return out.Data, nil
}

// requests polls /admin/v1/requests for the stage timings of recent requests.
func (a *admin) requests(ctx context.Context, limit int) (map[string]adminStages, error) {
	q := url.Values{"limit": {strconv.Itoa(limit)}}
	if a.tenant != "" {
		q.Set("tenant", a.tenant)
	}
	var out struct {
		Data []struct {
			ID       string              `json:"id"`
			Replica  string              `json:"replica"`
			Attempts int                 `json:"attempts"`
			Stages   map[string]*float64 `json:"stages_ms"`
		} `json:"data"`
	}
	if err := a.get(ctx, "/admin/v1/requests?"+q.Encode(), &out); err != nil {
		return nil, err
	}
	m := make(map[string]adminStages, len(out.Data))
	for _, r := range out.Data {
		st := adminStages{Replica: r.Replica, Attempts: r.Attempts, StageMS: map[string]float64{}}
		for k, v := range r.Stages {
			if v != nil {
				st.StageMS[k] = *v
			}
		}
		m[r.ID] = st
	}
	return m, nil
}
