package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/apierr"
	"github.com/tailgate-dev/tailgate/serving"
)

// maxHeartbeatBody bounds a heartbeat's body.
const maxHeartbeatBody = 1 << 20

var errBadClusterToken = &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_cluster_token",
	Message: "missing or invalid cluster token"}

// warnRefused logs a refused registration, at most about once every 10 s
// (a refused worker retries every second), saying how many it left out.
func (s *Server) warnRefused(msg string, args ...any) {
	if !s.refusedLog.Allow() {
		s.refusedQuiet.Add(1)
		return
	}
	if n := s.refusedQuiet.Swap(0); n > 0 {
		args = append(args, "refused_since_last_log", n)
	}
	s.log.Warn(msg, args...)
}

// handlePostHeartbeat registers or refreshes a worker's replica.
func (s *Server) handlePostHeartbeat(c echo.Context) error {
	tok := bearer(c.Request())
	if s.cfg.ClusterToken == "" || tok == "" || subtle.ConstantTimeCompare([]byte(tok), []byte(s.cfg.ClusterToken)) != 1 {
		s.warnRefused("registration refused: missing or wrong cluster token (the worker's --cluster-token-file must hold the gateway's DIR/cluster.token)",
			"remote", c.Request().RemoteAddr)
		return apierr.Reply(c, errBadClusterToken)
	}
	if s.cfg.PeerCheck != nil {
		if err := s.cfg.PeerCheck(c.Request()); err != nil {
			s.warnRefused("registration refused", "remote", c.Request().RemoteAddr, "err", err)
			return apierr.Reply(c, &apierr.Error{Status: http.StatusForbidden, Type: "invalid_request_error",
				Code: "peer_not_allowed", Message: err.Error()})
		}
	}
	// A heartbeat is a few KB; its engine lines are bounded, the body too.
	c.Request().Body = http.MaxBytesReader(c.Response(), c.Request().Body, maxHeartbeatBody)
	var hb serving.Heartbeat
	if err := c.Bind(&hb); err != nil {
		return apierr.Reply(c, apierr.BadRequest("", "body must be a JSON heartbeat"))
	}
	if err := data.CheckReplicaID(hb.ReplicaID); err != nil {
		return apierr.Reply(c, apierr.BadRequest("replica_id", "replica_id: %v", err))
	}
	u, err := url.Parse(hb.Address)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return apierr.Reply(c, apierr.BadRequest("address", "address must be the sidecar's base URL, e.g. http://10.0.0.5:9000"))
	}
	state, ok := router.ParseState(hb.State)
	if !ok || state == router.StateEjected || state == router.StateLost {
		return apierr.Reply(c, apierr.BadRequest("state", "state must be one of starting, warming, ready, draining, failed, sleeping"))
	}
	addr := strings.TrimSuffix(hb.Address, "/")
	peer := ""
	if s.cfg.PeerIdentity != nil {
		peer = s.cfg.PeerIdentity(c.Request())
	}
	reply := serving.HeartbeatReply{LeaseSeconds: s.cfg.Lease.Seconds()}

	w, refused := s.workerOf(c, hb.ReplicaID, addr, peer)
	if refused != nil {
		return apierr.Reply(c, refused)
	}
	// One registration at a time: a claim and the registration it allows
	// must not interleave with another worker's, nor with a revocation.
	s.hbMu.Lock()
	defer s.hbMu.Unlock()
	if s.revokedWorkers[w.ID] {
		return apierr.Reply(c, errWorkerRefused("worker_revoked", "worker "+w.ID+" was revoked; its heartbeats are refused"))
	}
	if err := s.reg.Claim(hb.ReplicaID, addr, w.ID); err != nil {
		s.warnRefused("registration refused", "replica", hb.ReplicaID, "address", addr, "remote", c.Request().RemoteAddr, "err", err)
		return apierr.Reply(c, errReplicaTaken(err))
	}
	if w.ID == "" {
		// First registration: exchange the cluster token for a credential
		// bound to this replica id — unless another credential owns the
		// id (a replica id is one worker's until that one is revoked), or
		// the id is not admitted (admitWorker).
		switch owner, err := s.store.ActiveWorkerFor(c.Request().Context(), hb.ReplicaID); {
		case err == nil:
			s.warnRefused("registration refused: replica id owned by another worker", "replica", hb.ReplicaID,
				"owner", owner.ID, "address", addr, "remote", c.Request().RemoteAddr)
			return apierr.Reply(c, errWorkerRefused("replica_taken", fmt.Sprintf(
				"registration refused: replica id %q belongs to worker %s (registered %s); a worker keeps its credential in its --data directory — "+
					"if that was lost, revoke the old credential and let the new worker in: tailgate workers revoke %s, then tailgate workers approve %s",
				hb.ReplicaID, owner.ID, owner.CreatedAt.UTC().Format(time.RFC3339), owner.ID, hb.ReplicaID)))
		case !errors.Is(err, data.ErrNotFound):
			s.log.Error("worker credential lookup", "err", err)
			return apierr.Reply(c, errInternal)
		}
		var secret string
		var refused *apierr.Error
		if w, secret, refused = s.admitWorker(c, hb.ReplicaID, addr, peer); refused != nil {
			return apierr.Reply(c, refused)
		}
		reply.Credential = secret
	} else if w.Address != addr {
		// A restarted worker's sidecar may listen elsewhere; its
		// credential, not its address, is what owns the replica id.
		if err := s.store.MoveWorker(c.Request().Context(), w.ID, addr); err != nil {
			s.log.Error("worker address not stored", "worker", w.ID, "err", err)
			return apierr.Reply(c, errInternal)
		}
		s.log.Info("worker moved", "worker", w.ID, "replica", hb.ReplicaID, "from", w.Address, "to", addr)
	}
	reply.WorkerID = w.ID
	s.reg.Heartbeat(router.Update{
		ID: hb.ReplicaID, URL: addr, Models: hb.Models, State: state, Reason: hb.Reason,
		Engine: hb.Engine, PriorityScheduling: hb.PriorityScheduling, Lease: s.cfg.Lease, EngineLog: clipEngineLog(hb.EngineLog), Worker: w.ID,
		Load: routerLoad(hb.Load),
	})
	s.wakeFleet(state, hb.Models)
	return c.JSON(http.StatusOK, reply)
}

// pendingNoteEvery is how often a refused worker's request is written to
// its pending admission (it retries every second).
const pendingNoteEvery = 30 * time.Second

// admitWorker issues the first credential of a worker registering replica
// id, if the id is admitted: by the join token the beat carries, by an
// operator's approval, or by the gateway itself (open registration, or a
// tailnet peer on the allow list). It returns the credential and its
// secret, or why the worker is refused; an id neither approved nor invited
// is noted as pending for the operator.
func (s *Server) admitWorker(c echo.Context, id, addr, peer string) (data.Worker, string, *apierr.Error) {
	ctx := c.Request().Context()
	secret, err := newWorkerSecret()
	if err != nil {
		return data.Worker{}, "", errInternal
	}
	code := serving.ApprovalCode(c.Request().Header.Get(serving.HeaderWorkerKey))
	adm := data.Admit{JoinToken: c.Request().Header.Get(serving.HeaderJoinToken),
		Open: s.cfg.OpenRegistration || s.cfg.PeerCheck != nil, Code: code}
	w, err := s.store.AdmitWorker(ctx, data.Worker{ReplicaID: id, Address: addr, Peer: peer, Hash: hashWorkerSecret(secret)}, adm)
	letIn := fmt.Sprintf("tailgate workers approve --data DIR %s --code %s (the code this worker prints; or POST /admin/v1/workers/%s/approve?code=%s), "+
		"or start the worker with --join-token from: tailgate workers invite --data DIR --replica-id %s", id, code, id, code, id)
	if code == "" { // a worker that sends no key (an older build) cannot be approved: an invite lets it in
		letIn = fmt.Sprintf("this worker sends no key (X-Tailgate-Worker-Key), so no approval can name it: start it with --join-token from: "+
			"tailgate workers invite --data DIR --replica-id %s", id)
	}
	switch {
	case err == nil:
		how := "approval"
		switch {
		case adm.JoinToken != "":
			how = "invite"
		case adm.Open:
			how = "open registration or approval" // the store does not say which
		}
		s.log.Info("worker credential issued", "worker", w.ID, "replica", id, "address", addr, "peer", peer, "admitted_by", how)
		return w, secret, nil
	case errors.Is(err, data.ErrReplicaTaken):
		s.warnRefused("registration refused: replica id owned by another worker", "replica", id, "address", addr, "remote", c.Request().RemoteAddr)
		return data.Worker{}, "", errWorkerRefused("replica_taken", fmt.Sprintf(
			"registration refused: replica id %q has a live credential (issued just now, perhaps by another gateway on the same database)", id))
	case errors.Is(err, data.ErrNotApproved):
		s.notePending(ctx, id, data.Asked{Address: addr, Peer: peer, Code: code, Source: remoteHost(c.Request())})
		s.warnRefused("registration refused: new replica id not approved; run: tailgate workers approve --data DIR "+id,
			"replica", id, "address", addr, "peer", peer, "remote", c.Request().RemoteAddr)
		return data.Worker{}, "", errWorkerRefused("worker_not_approved", fmt.Sprintf(
			"replica id %q is not approved: the cluster token alone does not admit a new worker. The operator lets it in on the gateway's box: %s",
			id, letIn))
	case errors.Is(err, data.ErrAdmissionRevoked):
		s.warnRefused("registration refused: replica id was revoked", "replica", id, "address", addr, "remote", c.Request().RemoteAddr)
		return data.Worker{}, "", errWorkerRefused("worker_revoked", fmt.Sprintf(
			"replica id %q was revoked and stays out until the operator lets it in again: %s", id, letIn))
	case errors.Is(err, data.ErrInviteInvalid):
		why := err.Error()
		if i := strings.Index(why, data.ErrInviteInvalid.Error()); i >= 0 {
			why = why[i:]
		}
		s.warnRefused("registration refused: join token not valid", "replica", id, "address", addr, "remote", c.Request().RemoteAddr, "why", why)
		return data.Worker{}, "", errWorkerRefused("invalid_join_token", fmt.Sprintf(
			"registration refused: %s; a join token works once, for its replica id, before it expires — ask the operator for a new one: "+
				"tailgate workers invite --data DIR --replica-id %s", why, id))
	default:
		s.log.Error("worker credential not stored", "replica", id, "err", err)
		return data.Worker{}, "", errInternal
	}
}

// remoteHost is the address a request came from, without its port.
func remoteHost(r *http.Request) string {
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return h
	}
	return r.RemoteAddr
}

// notePending lists a refused replica id as pending, writing at most every
// pendingNoteEvery for a worker that keeps asking from the same place.
func (s *Server) notePending(ctx context.Context, id string, asked data.Asked) {
	a, err := s.store.AdmissionOf(ctx, id)
	if err == nil && (a.State != data.AdmissionPending ||
		a.Address == asked.Address && a.Peer == asked.Peer && a.AskedCode == asked.Code && time.Since(a.RequestedAt) < pendingNoteEvery) {
		return
	}
	if err := s.store.NotePending(ctx, id, asked); err != nil {
		s.log.Error("pending worker not noted", "replica", id, "err", err)
	}
}

// routerLoad is a heartbeat's load in the router's terms.
func routerLoad(l serving.Load) router.Load {
	rl := router.Load{Inflight: l.Inflight, Waiting: l.Waiting, Running: l.Running,
		KVCacheUsage: l.KVCacheUsage, Preemptions: l.Preemptions,
		PrefixCacheQueries: l.PrefixCacheQueries, PrefixCacheHits: l.PrefixCacheHits,
		SleepState: l.SleepState, TTFTMillis: l.TTFTMillisP50}
	if w := l.WaitingByReason; w != nil {
		rl.WaitReasons, rl.WaitingCapacity, rl.WaitingDeferred = true, w.Capacity, w.Deferred
	}
	return rl
}

var errUnknownWorker = &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_worker_credential",
	Message: "unknown worker credential; register again with the cluster token alone"}

func errWorkerRefused(code, msg string) *apierr.Error {
	return &apierr.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: code, Message: msg}
}

func errReplicaTaken(err error) *apierr.Error {
	return errWorkerRefused("replica_taken", "registration refused: "+strings.TrimSuffix(err.Error(), ": "+router.ErrTaken.Error()))
}

// workerOf returns the credential the heartbeat presents, checked against
// the replica id, address and tailnet peer it was issued for; a zero
// Worker when it presents none (a first registration).
func (s *Server) workerOf(c echo.Context, id, addr, peer string) (data.Worker, *apierr.Error) {
	secret := c.Request().Header.Get(serving.HeaderWorkerCredential)
	if secret == "" {
		return data.Worker{}, nil
	}
	w, err := s.store.WorkerByHash(c.Request().Context(), hashWorkerSecret(secret))
	switch {
	case errors.Is(err, data.ErrNotFound):
		return data.Worker{}, errUnknownWorker
	case err != nil:
		s.log.Error("worker credential lookup", "err", err)
		return data.Worker{}, errInternal
	case w.Revoked():
		return data.Worker{}, errWorkerRefused("worker_revoked", "worker "+w.ID+" was revoked; its heartbeats are refused")
	case w.ReplicaID != id:
		return data.Worker{}, errWorkerRefused("worker_mismatch", fmt.Sprintf(
			"worker %s was registered as replica %q, not %q", w.ID, w.ReplicaID, id))
	case w.Peer != peer:
		return data.Worker{}, errWorkerRefused("worker_mismatch", fmt.Sprintf(
			"worker %s was registered from tailnet peer %q, not %q", w.ID, w.Peer, peer))
	}
	return w, nil
}

const workerSecretPrefix = "tgw_"

func newWorkerSecret() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return workerSecretPrefix + hex.EncodeToString(b[:]), nil
}

func hashWorkerSecret(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// handleDeleteWorker revokes a worker credential (by its id, or the replica
// id it was issued for) and takes its replicas out of routing.
func (s *Server) handleDeleteWorker(c echo.Context) error {
	s.hbMu.Lock()
	defer s.hbMu.Unlock()
	w, err := s.store.RevokeWorker(c.Request().Context(), c.Param("id"))
	if errors.Is(err, data.ErrNotFound) {
		return apierr.Reply(c, &apierr.Error{Status: http.StatusNotFound, Type: "invalid_request_error",
			Code: "worker_not_found", Message: "no worker " + c.Param("id")})
	}
	if err != nil {
		s.log.Error("revoke worker", "err", err)
		return apierr.Reply(c, errInternal)
	}
	if s.revokedWorkers == nil {
		s.revokedWorkers = map[string]bool{}
	}
	s.revokedWorkers[w.ID] = true
	gone := s.reg.RemoveWorker(w.ID)
	s.log.Info("worker revoked", "worker", w.ID, "replica", w.ReplicaID, "removed", gone)
	return c.JSON(http.StatusOK, workerView(w))
}

// handlePostApproveWorker admits the worker asking under a replica id (or
// a revoked worker's, by its worker id) whose approval code is ?code=:
// its next heartbeat registers it.
func (s *Server) handlePostApproveWorker(c echo.Context) error {
	code := serving.NormalizeApprovalCode(c.QueryParam("code"))
	if code == "" {
		return apierr.Reply(c, apierr.BadRequest("code", "an approval binds the worker that asked: give ?code= the approval code it prints (tailgate workers list shows the code each pending id asked with)"))
	}
	before, after, err := s.store.ApproveWorker(c.Request().Context(), c.Param("id"), code)
	if err != nil {
		if bad := data.CheckReplicaID(c.Param("id")); bad != nil {
			return apierr.Reply(c, apierr.BadRequest("id", "want a replica id or a worker id: %v", bad))
		}
		s.log.Error("approve worker", "err", err)
		return apierr.Reply(c, errInternal)
	}
	s.log.Info("worker approved", "replica", after.ReplicaID, "was", before.State)
	v := admissionView(after)
	v["was"] = before.State
	return c.JSON(http.StatusOK, v)
}

// handleGetWorkers lists the worker credentials, then the replica ids
// waiting for an approval (status "pending", no worker id yet).
func (s *Server) handleGetWorkers(c echo.Context) error {
	ws, err := s.store.Workers(c.Request().Context())
	if err != nil {
		s.log.Error("list workers", "err", err)
		return apierr.Reply(c, errInternal)
	}
	pending, err := s.store.PendingWorkers(c.Request().Context())
	if err != nil {
		s.log.Error("list pending workers", "err", err)
		return apierr.Reply(c, errInternal)
	}
	out := []map[string]any{}
	for _, w := range ws {
		out = append(out, workerView(w))
	}
	for _, a := range pending {
		out = append(out, admissionView(a))
	}
	return c.JSON(http.StatusOK, map[string]any{"data": out})
}

// workerView is a credential as the admin API shows it: never its hash.
func workerView(w data.Worker) map[string]any {
	v := map[string]any{"id": w.ID, "replica_id": w.ReplicaID, "address": w.Address, "peer": w.Peer,
		"created_at": w.CreatedAt, "revoked": w.Revoked(), "status": "active"}
	if w.Revoked() {
		v["revoked_at"] = w.RevokedAt
		v["status"] = "revoked"
	}
	return v
}

// admissionView is a replica id's admission as the admin API shows it.
func admissionView(a data.Admission) map[string]any {
	v := map[string]any{"replica_id": a.ReplicaID, "status": a.State, "address": a.Address, "peer": a.Peer,
		"updated_at": a.UpdatedAt, "asked_code": a.AskedCode, "source": a.Source}
	if !a.RequestedAt.IsZero() {
		v["requested_at"] = a.RequestedAt
	}
	return v
}

// clipEngineLog bounds a worker's engine lines as the wire contract does:
// the last serving.MaxEngineLogLines lines, each cut to
// serving.MaxEngineLogLine bytes on a character boundary.
func clipEngineLog(lines []string) []string {
	if len(lines) == 0 {
		return nil
	}
	lines = lines[max(0, len(lines)-serving.MaxEngineLogLines):]
	out := make([]string, len(lines))
	for i, l := range lines {
		if n := serving.MaxEngineLogLine; len(l) > n {
			for n > 0 && !utf8.RuneStart(l[n]) {
				n--
			}
			l = l[:n]
		}
		out[i] = l
	}
	return out
}

// keepLostReplicas lists the replicas the store says were lost before this
// gateway started as lost again, with why, and keeps the store in step
// with the registry from then on: a replica lost is saved, one heard again,
// forgotten or revoked is deleted. So a restart does not clear
// tailgate_replica_lost (and the TailgateReplicaLost alert) for a worker
// that is still gone.
func (s *Server) keepLostReplicas() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lost, err := s.store.LostReplicas(ctx)
	if err != nil {
		s.log.Error("lost replicas not restored", "err", err)
	}
	for _, l := range lost {
		was, _ := router.ParseState(l.Was)
		if s.reg.RestoreLost(router.LossEvent{ID: l.ReplicaID, Worker: l.WorkerID, URL: l.Address, Models: l.Models,
			Loss: &router.Loss{Reason: l.Reason, At: l.LostAt, Was: was}}) {
			s.log.Warn("replica still lost since before this start", "replica", l.ReplicaID, "lost_at", l.LostAt.UTC().Format(time.RFC3339), "reason", l.Reason)
		}
	}
	s.reg.OnLoss(func(ev router.LossEvent) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		if ev.Loss != nil {
			err = s.store.SaveLostReplica(ctx, data.LostReplica{ReplicaID: ev.ID, WorkerID: ev.Worker, Address: ev.URL,
				Models: ev.Models, Reason: ev.Loss.Reason, Was: ev.Loss.Was.String(), LostAt: ev.Loss.At})
		} else {
			err = s.store.DeleteLostReplica(ctx, ev.ID)
		}
		if err != nil {
			s.log.Error("lost replica not stored; a restart may not list it", "replica", ev.ID, "err", err)
		}
	})
}
