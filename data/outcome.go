package data

import "time"

// Outcome says how a request ended, in one word per ledger row. The set is
// closed: every row carries one of these constants.
type Outcome string

const (
	// OutcomeOK: the answer was delivered whole.
	OutcomeOK Outcome = "ok"
	// OutcomeRejected: the gateway refused the request before any replica
	// saw it (bad input, a limit, no replica); the client got a 4xx or 503.
	OutcomeRejected Outcome = "rejected"
	// OutcomeUpstreamRejected: an engine refused the request as a client
	// error (its own 4xx); the engine's answer was relayed.
	OutcomeUpstreamRejected Outcome = "upstream_rejected"
	// OutcomeUpstreamError: no attempt produced a first token (a replica
	// failed, could not be reached or missed a deadline); the client got a
	// 5xx or an in-band error event before any output.
	OutcomeUpstreamError Outcome = "upstream_error"
	// OutcomeMidstream: the answer broke after output reached the client; the
	// stream ended with an in-band error event.
	OutcomeMidstream Outcome = "midstream_error"
	// OutcomeClientCancelled: the client went away first (status 499).
	OutcomeClientCancelled Outcome = "client_cancelled"
	// OutcomeOpen: a stream that is still running; its row is provisional
	// (see [LedgerWriter.Open]) and counts as spend only once it is final.
	OutcomeOpen Outcome = "open"
	// OutcomeInterrupted: a stream that was still open when the gateway
	// stopped without finishing it (a crash, a kill); [Store.SettleOpen]
	// billed it at the counts its open row last carried.
	OutcomeInterrupted Outcome = "interrupted"
	// OutcomeWithheld: a whole JSON answer the gateway did not deliver
	// because its ledger row could not be committed (the client got 503
	// ledger_unavailable). Nothing is billed; what it cost is overhead.
	OutcomeWithheld Outcome = "withheld"
)

// Rejected reports whether the request was refused as it came, by the
// gateway or by an engine, so nothing was served: usage counts such rows
// apart, never as requests, tokens or cost.
func (o Outcome) Rejected() bool { return o == OutcomeRejected || o == OutcomeUpstreamRejected }

// rejectedSQL is [Outcome.Rejected] as an SQL condition on the ledger l.
const rejectedSQL = `l.outcome IN ('` + string(OutcomeRejected) + `', '` + string(OutcomeUpstreamRejected) + `')`

// ErrorClass is the short failure class of a ledger row, "" on success. For
// requests the gateway refused it is the OpenAI error code the client got;
// the classes below name failures of the routed path. Never a key or a
// prompt, so it is safe to log and to use as a metric label.
type ErrorClass string

// Failure classes of the routed path (the gateway's own refusals use the
// OpenAI error codes of the server's error table).
const (
	ClassNone ErrorClass = ""
	// ClassUpstreamError: a replica answered with a server error, sent an
	// error event, or dropped the connection before its first token.
	ClassUpstreamError ErrorClass = "upstream_error"
	// ClassUpstreamUnreachable: no replica could be connected to.
	ClassUpstreamUnreachable ErrorClass = "upstream_unreachable"
	// ClassUpstreamTimeout: no first token (stream) or no answer (JSON)
	// before the deadline.
	ClassUpstreamTimeout ErrorClass = "upstream_timeout"
	// ClassUpstreamOverloaded: every replica that could take the request
	// answered 429 (busy).
	ClassUpstreamOverloaded ErrorClass = "upstream_overloaded"
	// ClassNoReplica: no replica was ready (or every one declined: draining).
	ClassNoReplica ErrorClass = "no_replica"
	// ClassUpstreamRejected: the engine's own client error (4xx), relayed.
	ClassUpstreamRejected ErrorClass = "upstream_rejected"
	// ClassMidstream: the replica's stream ended early after the first token.
	ClassMidstream ErrorClass = "upstream_midstream"
	// ClassInterrupted: the gateway stopped while the stream was open; the
	// row was settled at the next start ([OutcomeInterrupted]).
	ClassInterrupted ErrorClass = "gateway_interrupted"
	// ClassErrorEvent: the replica sent an in-band error event mid-stream.
	ClassErrorEvent ErrorClass = "upstream_error_event"
	// ClassIdleDeadline: the replica went silent between two tokens for
	// longer than the idle deadline.
	ClassIdleDeadline ErrorClass = "idle_deadline"
	// ClassClientCancelled: the client went away.
	ClassClientCancelled ErrorClass = "client_cancelled"
	// ClassClientStalled: the client stopped reading its answer for longer
	// than the write timeout and was cut.
	ClassClientStalled ErrorClass = "client_stalled"
	// ClassInternal: a gateway bug; the client got a 500.
	ClassInternal ErrorClass = "internal_error"
	// ClassLedgerUnavailable: a whole answer's ledger row could not be
	// committed, so its final bytes were not sent (a JSON answer withheld,
	// a stream cut before [DONE]).
	ClassLedgerUnavailable ErrorClass = "ledger_unavailable"
)

// Stage names, as used in Server-Timing, the stage metric's label, the
// ledger's columns (name + "_us") and the admin API.
const (
	StageGateway      = "gateway"
	StageConnect      = "connect"
	StageUpstreamTTFT = "upstream_ttft"
	StageEngineQueue  = "engine_queue"
	StageEngineTTFT   = "engine_ttft"
	StageNetwork      = "network"
	StageTTFT         = "ttft"
	StageTotal        = "total"
	StageHold         = "hold"
)

// StageNames lists the stages in the order [Stages.Each] visits them.
var StageNames = [...]string{StageGateway, StageConnect, StageUpstreamTTFT, StageEngineQueue,
	StageEngineTTFT, StageNetwork, StageTTFT, StageTotal, StageHold}

// Each calls f with every stage's name, its index in [StageNames] and its
// duration (negative when unknown), in StageNames order. It is the one place
// that pairs names with fields.
func (s *Stages) Each(f func(i int, name string, d time.Duration)) {
	for i, d := range [len(StageNames)]time.Duration{s.Gateway, s.Connect, s.UpstreamTTFT, s.EngineQueue,
		s.EngineTTFT, s.Network, s.TTFT, s.Total, s.Hold} {
		f(i, StageNames[i], d)
	}
}
