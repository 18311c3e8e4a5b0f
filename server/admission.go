package server

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/apierr"
)

// priorityHeader asks for a request's priority class; a key's class is the
// highest its requests get, so the header can only lower it.
const priorityHeader = "X-Tailgate-Priority"

// askPriority applies the client's x-tailgate-priority to cl, capped by the
// key's class, and says on the response which class the request runs as.
func askPriority(cl *call, r *http.Request, out *httpSink) error {
	if v := headerValue(r.Header, priorityHeader); v != "" {
		want, err := policy.ParseClass(v)
		if err != nil {
			return apierr.BadRequest("", "%s: %v", strings.ToLower(priorityHeader), err)
		}
		cl.priority = cl.principal.Class.Cap(want)
	}
	out.set(priorityHeader, cl.priority.String())
	return nil
}

// routerClass is a priority class as the router orders it (its hedges keep
// off replicas that serve a higher class).
func routerClass(c policy.Class) router.Class {
	switch c {
	case policy.ClassInteractive:
		return router.ClassInteractive
	case policy.ClassBatch:
		return router.ClassBatch
	}
	return router.ClassStandard
}

// retryQueueFull is the Retry-After of a full admission queue: waiters
// leave it as requests end, typically within a second under load.
const retryQueueFull = time.Second

// capacity is how many generation requests of model the gateway lets run at
// once before lower classes wait: the configured number, else the sum of
// the engine slots learnt from the model's ready replicas (a replica whose
// slots are not known yet counts as the mean of those that are); 0 when
// nothing is known, and then nothing waits.
func (s *Server) capacity(model string) int64 {
	if n, ok := s.cfg.AdmitCapacityByModel[model]; ok && n > 0 {
		return n
	}
	if s.cfg.AdmitCapacity > 0 {
		return s.cfg.AdmitCapacity
	}
	var known, sum, unknown int64
	for _, rep := range s.reg.Replicas() {
		if rep.State() != router.StateReady || !rep.Serves(model) {
			continue
		}
		if n := rep.Slots(); n > 0 {
			known++
			sum += n
		} else {
			unknown++
		}
	}
	if known == 0 {
		return 0
	}
	return sum + unknown*sum/known
}

// queueError maps a refusal of the admission queue to the client's error.
func queueError(qe *policy.QueueError) *apierr.Error {
	if qe.Full {
		return &apierr.Error{Status: http.StatusTooManyRequests, Type: "requests", Code: "queue_full",
			Message:    fmt.Sprintf("the model's replicas are busy and the %s admission queue is full; retry later", qe.Class),
			RetryAfter: retryQueueFull}
	}
	return &apierr.Error{Status: http.StatusRequestTimeout, Type: "requests", Code: "queue_timeout",
		Message: fmt.Sprintf("the model's replicas stayed busy: a %s request waited %s in the admission queue", qe.Class, qe.Wait)}
}
