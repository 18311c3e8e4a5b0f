// Package serving holds what runs on a GPU box: the worker role
// (serving/worker) made of the vLLM launcher and supervisor
// (serving/launcher) and the sidecar that fronts the engine
// (serving/sidecar); the simulated engine (serving/sim); the process-group
// helper they and the tools share (serving/proc); the SSE event reader the
// sidecar shares with the gateway (serving/sse); and the wire types a worker
// and the gateway exchange and a bounded body reader (this package).
//
// # Wire contract between a worker and the gateway
//
// Registration: the worker POSTs a [Heartbeat] as JSON to
// {gateway admin URL}[HeartbeatPath] at least once a second, with
// "Authorization: Bearer <cluster token>". The gateway answers 200 with a
// [HeartbeatReply]. The first answer to a worker carries a per-worker
// credential ([HeartbeatReply.Credential]); the worker sends it with every
// later beat in [HeaderWorkerCredential]. The credential binds the worker
// to its replica id and address: the gateway refuses (403) a beat that
// claims an id or address held by a configured upstream or by another
// worker, and every beat with a revoked credential. The cluster token
// alone registers no new replica id: the first beat must also carry a
// one-time join token bound to the id in [HeaderJoinToken], or the id must
// have been approved by an operator (else 403 with code
// "worker_not_approved", and the id is listed as pending until approved).
// A replica that misses about three beats (its lease) is
// dropped from routing. The worker reports its replica's state itself:
// "failed" also while the engine process runs but does not answer (frozen),
// with the reason and the engine's last error lines.
//
// Requests: the gateway calls the sidecar's OpenAI endpoints with the same
// cluster token as bearer. The sidecar reports the engine's share of each
// request: on JSON answers in the response headers [HeaderEngineTTFT] and
// [HeaderEngineQueue] (milliseconds, decimal); on SSE answers in one comment
// event sent just before the first event that carries a token:
//
//	: tailgate-timing engine_ttft_ms=12.345 engine_queue_ms=0.210
//
// The gateway strips that comment before relaying. A value the sidecar does
// not know is left out.
package serving

import "time"

// HeartbeatPath is where workers register on the gateway's admin listener.
const HeartbeatPath = "/admin/v1/cluster/heartbeat"

// HeaderWorkerCredential carries a worker's credential on its heartbeats
// once the gateway issued one.
const HeaderWorkerCredential = "X-Tailgate-Worker-Credential"

// HeaderJoinToken carries a worker's one-time join token (from `tailgate
// workers invite`) on the beats that register it, until it has a
// credential.
const HeaderJoinToken = "X-Tailgate-Join-Token"

// Headers and SSE comment prefix of the sidecar's timing report.
const (
	HeaderEngineTTFT  = "X-Tailgate-Engine-Ttft-Ms"
	HeaderEngineQueue = "X-Tailgate-Engine-Queue-Ms"
	TimingComment     = ": tailgate-timing "
	// HeaderSimQueue is set by the simulated engine: how long the request
	// waited for a slot. A real vLLM does not report it per request.
	HeaderSimQueue = "X-Sim-Queue-Ms"
)

// Replica states as reported by workers (the router parses the same names).
const (
	StateStarting = "starting"
	StateWarming  = "warming"
	StateReady    = "ready"
	StateDraining = "draining"
	StateFailed   = "failed"
	// StateSleeping: the engine sleeps (vLLM sleep mode); the replica takes
	// no requests, and the gateway wakes it through the sidecar when
	// requests wait.
	StateSleeping = "sleeping"
)

// ReasonPreempted starts the reason of a replica that drains because its
// machine is being taken away (a spot VM's preemption notice): "preempted:
// " and what announced it. The gateway's fleet controller replaces such a
// replica at once instead of after its lease.
const ReasonPreempted = "preempted"

// Heartbeat is what a worker tells the gateway about its replica.
type Heartbeat struct {
	ReplicaID string   `json:"replica_id"`
	Address   string   `json:"address"` // base URL of the sidecar, e.g. http://10.0.0.5:9000
	Models    []string `json:"models"`
	State     string   `json:"state"`
	Reason    string   `json:"reason,omitempty"` // why not ready, for operators
	Engine    string   `json:"engine"`           // "vllm" or "sim"
	// PriorityScheduling says the engine runs with priority scheduling
	// (vllm serve --scheduling-policy priority): it takes a request body's
	// priority field, a lower value served first. The gateway sets that
	// field from the key's priority class on such replicas only; an engine
	// with vLLM's default policy (fcfs) refuses any priority but 0 with 400.
	PriorityScheduling bool `json:"priority_scheduling,omitempty"`
	Load               Load `json:"load"`
	// EngineLog is the engine's last error output, oldest first: what it
	// wrote to stderr and the error lines of its log, for an operator to
	// read why it is not ready. Workers send it only while the replica is
	// not ready, at most [MaxEngineLogLines] lines of at most
	// [MaxEngineLogLine] bytes; the gateway cuts anything longer.
	EngineLog []string `json:"engine_log,omitempty"`
}

// Bounds of [Heartbeat.EngineLog].
const (
	MaxEngineLogLines = 20
	MaxEngineLogLine  = 512
)

// Load is the replica's load as the sidecar sees it. Engine numbers are
// summed over the engine's data-parallel ranks.
type Load struct {
	Inflight     int     `json:"inflight"`       // requests in the sidecar now
	Waiting      float64 `json:"waiting"`        // vllm:num_requests_waiting
	Running      float64 `json:"running"`        // vllm:num_requests_running
	KVCacheUsage float64 `json:"kv_cache_usage"` // vllm:kv_cache_usage_perc (0..1)
	// WaitingByReason splits Waiting by why the requests wait, as vLLM's
	// vllm:num_requests_waiting_by_reason says; nil when the engine does
	// not say (older vLLM, other engines).
	WaitingByReason *WaitReasons `json:"waiting_by_reason,omitempty"`
	// Preemptions counts the running requests the engine evicted to free KV
	// blocks since it started (vllm:num_preemptions_total): a rising count
	// means KV pressure even while nothing waits.
	Preemptions float64 `json:"preemptions_total,omitempty"`
	// PrefixCacheQueries and PrefixCacheHits count prompt tokens looked up
	// in and found in the engine's prefix cache since it started
	// (vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total).
	PrefixCacheQueries float64 `json:"prefix_cache_queries_total,omitempty"`
	PrefixCacheHits    float64 `json:"prefix_cache_hits_total,omitempty"`
	// SleepState is vLLM's sleep mode state (vllm:engine_sleep_state):
	// SleepAwake, or asleep at level 1 (SleepWeightsOffloaded) or level 2
	// (SleepDiscardAll); "" when the engine does not say. An engine asleep
	// still answers /health; the sidecar reports its replica sleeping.
	SleepState string `json:"sleep_state,omitempty"`
	// TTFTMillisP50 is the engine's recent median time to first token as the
	// sidecar measured it; 0 when unknown.
	TTFTMillisP50 float64 `json:"ttft_ms_p50"`
}

// WaitReasons is why an engine's waiting requests wait, by vLLM's reason
// label.
type WaitReasons struct {
	// Capacity: no room in the running batch now (sequence slots, the
	// step's token budget, KV blocks).
	Capacity float64 `json:"capacity"`
	// Deferred: held back for the request's own sake, e.g. a
	// structured-output grammar still compiling or remote KV arriving.
	Deferred float64 `json:"deferred"`
}

// States of [Load.SleepState], as vLLM names them.
const (
	SleepAwake            = "awake"
	SleepWeightsOffloaded = "weights_offloaded"
	SleepDiscardAll       = "discard_all"
)

// EngineKeepAlive is how long the engine keeps an idle HTTP connection open:
// vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5s by default. The launcher sets it
// for the engine explicitly, and the sidecar closes its own idle connections
// to the engine before then, so it does not write a request on a connection
// the engine is closing.
const EngineKeepAlive = 5 * time.Second

// HeartbeatReply is the gateway's answer.
type HeartbeatReply struct {
	LeaseSeconds float64 `json:"lease_seconds"`
	// WorkerID names the worker's credential (for `tailgate workers`).
	WorkerID string `json:"worker_id,omitempty"`
	// Credential is the worker's secret, sent once: in the answer to the
	// beat that registered the worker without one. The gateway keeps only
	// its hash.
	Credential string `json:"credential,omitempty"`
}
