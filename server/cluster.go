package server

import (
	"crypto/subtle"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"tailgate/router"
	"tailgate/server/apierr"
	"tailgate/serving"
)

// maxHeartbeatBody bounds a heartbeat's body.
const maxHeartbeatBody = 1 << 20

var errBadClusterToken = &apierr.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_cluster_token",
	Message: "missing or invalid cluster token"}

// handlePostHeartbeat registers or refreshes a worker's replica.
func (s *Server) handlePostHeartbeat(c echo.Context) error {
	tok := bearer(c.Request())
	if s.cfg.ClusterToken == "" || tok == "" || subtle.ConstantTimeCompare([]byte(tok), []byte(s.cfg.ClusterToken)) != 1 {
		return apierr.Reply(c, errBadClusterToken)
	}
	if s.cfg.PeerCheck != nil {
		if err := s.cfg.PeerCheck(c.Request()); err != nil {
			s.log.Warn("registration refused", "remote", c.Request().RemoteAddr, "err", err)
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
	if hb.ReplicaID == "" || len(hb.ReplicaID) > 128 || strings.ContainsAny(hb.ReplicaID, " \t\n\"") {
		return apierr.Reply(c, apierr.BadRequest("replica_id", "replica_id must be a short name without spaces"))
	}
	u, err := url.Parse(hb.Address)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return apierr.Reply(c, apierr.BadRequest("address", "address must be the sidecar's base URL, e.g. http://10.0.0.5:9000"))
	}
	state, ok := router.ParseState(hb.State)
	if !ok || state == router.StateEjected {
		return apierr.Reply(c, apierr.BadRequest("state", "state must be one of starting, warming, ready, draining, failed"))
	}
	s.reg.Heartbeat(router.Update{
		ID: hb.ReplicaID, URL: strings.TrimSuffix(hb.Address, "/"), Models: hb.Models, State: state, Reason: hb.Reason,
		Engine: hb.Engine, Lease: s.cfg.Lease, EngineLog: clipEngineLog(hb.EngineLog),
		Load: router.Load{Inflight: hb.Load.Inflight, Waiting: hb.Load.Waiting, Running: hb.Load.Running,
			KVCacheUsage: hb.Load.KVCacheUsage, TTFTMillis: hb.Load.TTFTMillisP50},
	})
	return c.JSON(http.StatusOK, serving.HeartbeatReply{LeaseSeconds: s.cfg.Lease.Seconds()})
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
