package server

import (
	"net/http"
	"net/http/pprof"
	rtrace "runtime/trace"

	"github.com/labstack/echo/v4"
)

// Profiles: the Go runtime's own, on the admin listener under the admin
// token, at the paths of net/http/pprof that `go tool pprof` and `go tool
// trace` fetch: /debug/pprof/ (the index), profile (CPU, ?seconds=N),
// trace (an execution trace, ?seconds=N), heap, allocs, goroutine, block,
// mutex and threadcreate. cmdline is not served: a process's arguments can
// hold a secret. Nothing in tailgate serves http.DefaultServeMux, where the
// package also registers them.
//
// While an execution trace is being taken, each request of the public API
// is a task, requestTaskType, on the goroutine that serves it, so that the
// trace reads request by request: bench/tailtrace says where the slowest
// requests' time went (running, waiting for a CPU, for the network, for a
// lock, and on what). With no trace being taken it costs one atomic load.
func (s *Server) profileRoutes(e *echo.Echo, guard echo.MiddlewareFunc) {
	p := e.Group("/debug/pprof", guard)
	index := echo.WrapHandler(http.HandlerFunc(pprof.Index))
	p.GET("", index)
	p.GET("/", index)
	p.GET("/profile", echo.WrapHandler(http.HandlerFunc(pprof.Profile)))
	p.GET("/trace", echo.WrapHandler(http.HandlerFunc(pprof.Trace)))
	for _, name := range []string{"heap", "allocs", "goroutine", "block", "mutex", "threadcreate"} {
		p.GET("/"+name, echo.WrapHandler(pprof.Handler(name)))
	}
}

// requestTaskType is the type of a public request's task in an execution
// trace.
const requestTaskType = "tailgate.request"

// requestTask starts r's task when an execution trace is being taken and
// returns what ends it.
func requestTask(r *http.Request) (end func()) {
	if !rtrace.IsEnabled() {
		return func() {}
	}
	_, task := rtrace.NewTask(r.Context(), requestTaskType)
	return task.End
}
