package server

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/apierr"
	"github.com/tailgate-dev/tailgate/serving"
)

// The answers to wiring mistakes: a request on the wrong listener or
// without /v1, a model that is not served, a model whose replicas are all
// out. Each says what was meant, in OpenAI's error shape.

// side is which of the gateway's two listeners a handler serves.
type side int

const (
	publicSide side = iota // the OpenAI-compatible API
	adminSide              // metrics, dashboard, admin API, worker registration
)

// SetAddresses tells the server where its listeners are, so that a request
// on the wrong one is told the other's URL: publicURL is the API's base URL
// (http://HOST:PORT/v1), adminURL the admin listener's (http://HOST:PORT).
// Call it before serving; unset, the hints name the flags instead.
func (s *Server) SetAddresses(publicURL, adminURL string) {
	s.publicURL, s.adminURL = strings.TrimSuffix(publicURL, "/"), strings.TrimSuffix(adminURL, "/")
}

// routeKey is one public route, to tell a path meant for the public API.
type routeKey struct{ method, path string }

// isPublicRoute reports whether method and path name a route of the public
// API (its :param and * segments match any value).
func (s *Server) isPublicRoute(method, path string) bool {
	for _, r := range s.publicRoutes {
		if r.method == method && matchRoute(r.path, path) {
			return true
		}
	}
	return false
}

// matchRoute matches path against an echo route pattern.
func matchRoute(pattern, path string) bool {
	ps, xs := strings.Split(pattern, "/"), strings.Split(path, "/")
	for i, p := range ps {
		if p == "*" {
			return true
		}
		if i >= len(xs) || (xs[i] != p && !(strings.HasPrefix(p, ":") && xs[i] != "")) {
			return false
		}
	}
	return len(xs) == len(ps)
}

// isAdminPath reports whether path is one the admin listener serves.
func isAdminPath(path string) bool {
	return path == "/metrics" || path == "/readyz" || path == "/ui" || strings.HasPrefix(path, "/ui/") ||
		path == "/admin" || strings.HasPrefix(path, "/admin/")
}

// errNoRoute answers a request no route of this listener takes, saying
// which URL was meant when the mistake is a known one.
func (s *Server) errNoRoute(on side, c echo.Context) *apierr.Error {
	r := c.Request()
	method, path := r.Method, boundString(r.URL.Path)
	here := c.Scheme() + "://" + r.Host
	public, admin := s.publicURL, s.adminURL
	if public == "" {
		public = "the public listener (the gateway's --listen)"
	}
	if admin == "" {
		admin = "the admin listener (the gateway's --admin-listen)"
	}
	var msg string
	switch {
	case on == publicSide && path == serving.HeartbeatPath:
		msg = fmt.Sprintf("this is the gateway's public API listener; workers register on its admin listener: point the worker's --gateway at %s, not at %s", admin, here)
	case on == publicSide && strings.HasPrefix(path, "/v1/v1/") && s.isPublicRoute(method, path[3:]):
		msg = fmt.Sprintf("no route %s %s: the base URL already ends in /v1 and the client added another; use %s%s (base URL %s/v1)", method, path, here, path[3:], here)
	case on == publicSide && !strings.HasPrefix(path, "/v1/") && s.isPublicRoute(method, "/v1"+path):
		msg = fmt.Sprintf("no route %s %s: the OpenAI-compatible API is under /v1; use %s/v1%s (set the client's base URL to %s/v1)", method, path, here, path, here)
	case on == publicSide && isAdminPath(path):
		msg = fmt.Sprintf("%s is served on the gateway's admin listener, not on this public API listener: use %s%s", path, admin, path)
		if s.adminURL == "" {
			msg = fmt.Sprintf("%s is served on %s, not on this public API listener", path, admin)
		}
	case on == publicSide:
		msg = fmt.Sprintf("no route %s %s on this OpenAI-compatible API: its endpoints are under %s/v1 (POST /v1/chat/completions, GET /v1/models, …)", method, path, here)
	case s.isPublicRoute(method, path) || s.isPublicRoute(method, "/v1"+path) || path == "/healthz":
		msg = fmt.Sprintf("%s %s is the OpenAI-compatible API, served on the gateway's public listener, not on this admin listener: use base URL %s", method, path, public)
		if s.publicURL == "" {
			msg = fmt.Sprintf("%s %s is the OpenAI-compatible API, served on %s, not on this admin listener", method, path, public)
		}
	default:
		msg = fmt.Sprintf("no route %s %s on the admin listener: it serves /metrics, /ui/, /admin/v1/… and /readyz; the OpenAI-compatible API is on %s", method, path, public)
	}
	return &apierr.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found", Message: msg}
}

// errMethodNotAllowed answers a known path asked with the wrong method,
// naming the ones it takes.
func errMethodNotAllowed(c echo.Context) *apierr.Error {
	r := c.Request()
	msg := fmt.Sprintf("%s %s: method not allowed", r.Method, boundString(r.URL.Path))
	var takes []string
	for _, m := range strings.Split(c.Response().Header().Get(echo.HeaderAllow), ",") {
		if m = strings.TrimSpace(m); m != "" && m != http.MethodOptions {
			takes = append(takes, m)
		}
	}
	if len(takes) > 0 {
		msg += "; use " + strings.Join(takes, " or ")
	}
	return &apierr.Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed", Message: msg}
}

// maxListedModels bounds the models an unknown-model error lists.
const maxListedModels = 20

// usableModels returns the models served here (by a replica in any state)
// that p may use, sorted.
func (s *Server) usableModels(p *policy.Principal) []string {
	var out []string
	for _, rep := range s.reg.Replicas() {
		for _, m := range rep.Models() {
			if p.Allows(m) && !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
	}
	for _, m := range s.reg.ManagedModels() {
		if p.Allows(m) && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return out
}

// errUnknownModel answers a model no replica serves; usable lists the
// models the caller's key may use instead (nil: not known here).
func errUnknownModel(model string, usable []string) *apierr.Error {
	msg := fmt.Sprintf("the model %q does not exist or is not served here", boundString(model))
	switch {
	case usable == nil:
		msg += "; GET /v1/models lists the models this key may use"
	case len(usable) == 0:
		msg += "; no model this key may use is served here right now (GET /v1/models lists them)"
	default:
		list := usable
		if len(list) > maxListedModels {
			list = list[:maxListedModels]
		}
		quoted := make([]string, len(list))
		for i, m := range list {
			quoted[i] = fmt.Sprintf("%q", boundString(m))
		}
		msg += "; this key may use " + strings.Join(quoted, ", ")
		if n := len(usable) - len(list); n > 0 {
			msg += fmt.Sprintf(" and %d more", n)
		}
		msg += " (GET /v1/models lists those ready now)"
	}
	return &apierr.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found", Param: "model", Message: msg}
}

// maxListedReplicas bounds the replicas a no_replica error describes.
const maxListedReplicas = 8

// noReplicaMessage says which model has no replica to take a request, how
// many it has and why each is out.
func noReplicaMessage(model string, nre *router.NoReplicaError) string {
	if nre == nil {
		if model == "" {
			return errNoReplica.Message
		}
		return fmt.Sprintf("no replica of the model %q is ready to take this request; try again shortly", model)
	}
	n := len(nre.Replicas)
	var b strings.Builder
	fmt.Fprintf(&b, "no replica of the model %q can take this request: it has %d replica", nre.Model, n)
	if n != 1 {
		b.WriteString("s")
	}
	for i, r := range nre.Replicas {
		if i == maxListedReplicas {
			fmt.Fprintf(&b, "; and %d more", n-i)
			break
		}
		sep := "; "
		if i == 0 {
			sep = " — "
		}
		fmt.Fprintf(&b, "%s%s %s", sep, boundString(r.ID), r.State)
		if why := replicaWhy(r); why != "" {
			fmt.Fprintf(&b, " (%s)", boundString(why))
		}
	}
	b.WriteString("; try again shortly, or see GET /admin/v1/replicas on the admin listener")
	return b.String()
}

// replicaWhy is why one replica is out, in words for a client: its own
// reason, else what its state means.
func replicaWhy(r router.OutReplica) string {
	if r.Why != "" {
		return r.Why
	}
	switch r.State {
	case router.StateStarting:
		return "its engine is starting"
	case router.StateWarming:
		return "its engine is warming up"
	case router.StateDraining:
		return "it is shutting down and takes no new requests"
	case router.StateEjected:
		return "taken out after failures; probed back"
	case router.StateFailed:
		return "its engine failed"
	case router.StateLost:
		return "no heartbeat from its worker"
	case router.StateReady:
		return "busy with requests of a higher priority"
	}
	return ""
}
