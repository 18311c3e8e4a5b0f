package sim

import (
	"errors"
	"net/http"
	"time"

	"tailgate/serving"
)

// maxBodyBytes bounds a request body; far above any prompt that fits
// MaxModelLen under the simulator's tokenizer.
const maxBodyBytes = 32 << 20

func (e *Engine) routes(metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", e.handleGetModels)
	mux.HandleFunc("POST /v1/chat/completions", e.handlePostChat)
	mux.HandleFunc("POST /v1/completions", e.handlePostCompletions)
	mux.HandleFunc("/v1/chat/completions", handleMethodNotAllowed)
	mux.HandleFunc("/v1/completions", handleMethodNotAllowed)
	mux.HandleFunc("GET /health", handleGetHealth)
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("/", handleNotFound)
	return mux
}

func (e *Engine) handleGetModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, e.models)
}

func (e *Engine) handlePostChat(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	body, aerr := readBody(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	j, aerr := e.parseChat(body)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	e.generate(w, r, j, arrived)
}

func (e *Engine) handlePostCompletions(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	body, aerr := readBody(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	j, aerr := e.parseCompletion(body)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	e.generate(w, r, j, arrived)
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
