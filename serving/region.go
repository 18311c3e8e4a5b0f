package serving

import "time"

// RegionStatusPath is the public listener's regional status: what an edge
// (serving/edge, the Cloudflare Worker in deploy/cloudflare) polls to pick
// a region per request.
//
// It is public and unauthenticated by design: an edge never holds a key or
// an admin token (it forwards requests untouched; authorization, quotas and
// billing stay in the gateway), so a Worker or an edge box in another
// network needs nothing secret to poll it. It says only what a client could
// learn by timing its own requests: the region's name, the models it serves
// with ready replica counts and load, recent times to first token, and
// whether it drains — never a tenant, a key, a replica's address or id.
const RegionStatusPath = "/edge/v1/status"

// RegionStatus is the JSON of [RegionStatusPath].
type RegionStatus struct {
	Region   string `json:"region"`
	Draining bool   `json:"draining"`
	// Inflight is the requests the replicas hold now; Queued the requests
	// waiting in the gateway's admission queue, over every model.
	Inflight int64         `json:"inflight"`
	Queued   int64         `json:"queued"`
	Models   []RegionModel `json:"models"`
	// Time is when the status was taken (it may be served for up to 250 ms).
	Time time.Time `json:"time"`
}

// RegionModel is one model a region serves.
type RegionModel struct {
	ID            string `json:"id"`
	ReadyReplicas int    `json:"ready_replicas"`
	// Inflight and Waiting are the model's requests in its ready replicas
	// and in their engines' queues; Slots the engines' batch slots as
	// learnt (0: not known yet).
	Inflight int64   `json:"inflight"`
	Waiting  float64 `json:"waiting"`
	Slots    int64   `json:"slots"`
	// TTFTP50 and TTFTP95 are the model's recent client-visible times to
	// first token of streams, in seconds, from the window the hedge delay
	// is learnt from; 0: too few samples yet (TTFTP50 then falls back to
	// the replicas' own recent estimate, when they have one).
	TTFTP50 float64 `json:"ttft_p50_seconds"`
	TTFTP95 float64 `json:"ttft_p95_seconds"`
}
