package sim

import (
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
)

// maxBodyBytes bounds a request body; far above any prompt that fits
// MaxModelLen under the simulator's tokenizer, and any audio file a test
// sends.
const maxBodyBytes = 32 << 20

// KeepAliveEnv is the environment variable vLLM reads its keep-alive
// timeout from, in whole seconds (vllm/envs.py, VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
// default 5).
const KeepAliveEnv = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"

// ParseKeepAlive reads a [KeepAliveEnv] value: whole seconds, as vLLM's
// int(os.getenv(...)) does; "" means unset (0, the default). 0 seconds,
// which makes uvicorn close every connection after its answer, is refused:
// an http.Server cannot express it.
func ParseKeepAlive(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 1 {
		return 0, fmt.Errorf("sim: %s=%q: want whole seconds, at least 1", KeepAliveEnv, v)
	}
	return time.Duration(n) * time.Second, nil
}

// NewServer returns an HTTP server for h, nil meaning the engine's own
// handler (pass a wrapper of [Engine.Handler] to add routes), that handles
// connections as vLLM's uvicorn does: an idle keep-alive connection is closed
// after [Config.KeepAlive]. The caller runs and shuts it down.
func (e *Engine) NewServer(h http.Handler) *http.Server {
	if h == nil {
		h = e.handler
	}
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: e.cfg.KeepAlive}
}

func (e *Engine) routes(metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", e.handleGetModels)
	post := map[string]http.HandlerFunc{
		"/v1/chat/completions":      e.handlePostChat,
		"/v1/completions":           e.handlePostCompletions,
		"/v1/responses":             e.handlePostResponses,
		"/v1/messages":              e.handlePostMessages,
		"/v1/messages/count_tokens": e.handlePostCountTokens,
		"/v1/embeddings":            e.handlePostEmbeddings,
		"/v1/rerank":                e.handlePostRerank,
		"/rerank":                   e.handlePostRerank,
		"/v2/rerank":                e.handlePostRerank,
		"/v1/score":                 e.handlePostScore,
		"/score":                    e.handlePostScore,
		"/tokenize":                 e.handlePostTokenize,
		"/detokenize":               e.handlePostDetokenize,
		"/v1/audio/transcriptions":  e.handlePostTranscription,
		"/v1/audio/translations":    e.handlePostTranslation,
	}
	for path, h := range post {
		if e.sleep != nil && path != "/tokenize" && path != "/detokenize" && path != "/v1/messages/count_tokens" {
			h = e.sleep.guard(h) // needs the weights: waits while the engine sleeps
		}
		mux.HandleFunc("POST "+path, h)
		mux.HandleFunc(path, handleMethodNotAllowed)
	}
	if e.sleep != nil {
		mux.HandleFunc("POST /sleep", e.sleep.handlePostSleep)
		mux.HandleFunc("POST /wake_up", e.sleep.handlePostWakeUp)
		mux.HandleFunc("GET /is_sleeping", e.sleep.handleGetIsSleeping)
	}
	mux.HandleFunc("GET /health", handleGetHealth)
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("/", handleNotFound)
	if e.cfg.APIKey == "" {
		return mux
	}
	return requireKey(e.cfg.APIKey, mux)
}

func (e *Engine) handleGetModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, e.models)
}

func (e *Engine) handlePostChat(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	body, aerr := readJSONRequest(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	j, aerr := e.parseChat(body)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	choices := e.plan(j)
	e.serveGeneration(w, r, j, choices, e.newChatEncoder(r, j, choices), arrived)
}

func (e *Engine) handlePostCompletions(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	body, aerr := readJSONRequest(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	j, aerr := e.parseCompletion(body)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	choices := e.plan(j)
	e.serveGeneration(w, r, j, choices, e.newCompletionEncoder(r, j, choices), arrived)
}

// serveGeneration answers a validated generation request: with an injected
// fault, or by generating it.
func (e *Engine) serveGeneration(w http.ResponseWriter, r *http.Request, j *job, choices []*choice, enc encoder, arrived time.Time) {
	if e.inject(w, r, j.stream, enc) {
		return
	}
	e.generate(w, r, j, choices, enc, arrived)
}

// handleGetHealth answers 200 with an empty body, as vLLM's /health does.
func handleGetHealth(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusOK)
}

// handleNotFound and handleMethodNotAllowed answer like vLLM's FastAPI app.
func handleNotFound(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusNotFound, []byte(`{"detail":"Not Found"}`))
}

func handleMethodNotAllowed(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Allow", "POST")
	writeJSON(w, http.StatusMethodNotAllowed, []byte(`{"detail":"Method Not Allowed"}`))
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	body, err := serving.ReadBody(w, r, maxBodyBytes)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, typ: "BadRequestError", msg: "request body too large"}
		}
		return nil, badRequest("", "read request body: "+err.Error())
	}
	return body, nil
}

// readJSONFields reads a JSON request's body (readJSONRequest) and parses
// it for field checks (readJSONBody).
func readJSONFields(w http.ResponseWriter, r *http.Request) (*reader, *apiError) {
	body, aerr := readJSONRequest(w, r)
	if aerr != nil {
		return nil, aerr
	}
	return readJSONBody(body)
}

// readJSONRequest reads the body of a JSON endpoint. Like vLLM's
// validate_json_request dependency (vllm/entrypoints/serve/utils/api_utils.py@95add872),
// it refuses a Content-Type other than application/json. Unlike it, it
// accepts a request without one, which vLLM refuses too: tests and tools
// across tailgate post to engines without it.
func readJSONRequest(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	ct := r.Header.Get("Content-Type")
	media, _, _ := mime.ParseMediaType(ct)
	if ct != "" && !strings.EqualFold(media, "application/json") {
		return nil, &apiError{status: http.StatusBadRequest, typ: "Bad Request",
			msg: "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"}
	}
	return readBody(w, r)
}
