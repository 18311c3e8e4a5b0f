package sim

import (
	"net/http"
	"strconv"
)

// apiError is an error answered in OpenAI's shape, with vLLM's type names and
// its habit of putting the HTTP status in code (ErrorResponse,
// vllm/entrypoints/serve/engine/protocol.py@f1bf7bd0). Request validation
// errors have type "Bad Request" (see lax.go); errors raised while serving
// have "BadRequestError", "NotFoundError", "InternalServerError".
type apiError struct {
	status int
	typ    string // "BadRequestError", "NotFoundError", …
	param  string // "" renders as null
	msg    string
}

func badRequest(param, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: param, msg: msg}
}

func writeError(w http.ResponseWriter, aerr *apiError) {
	writeJSON(w, aerr.status, aerr.appendJSON(nil))
}

// appendJSON appends {"error":{"message":…,"type":…,"param":…,"code":…}}.
func (aerr *apiError) appendJSON(b []byte) []byte {
	b = append(b, `{"error":{"message":`...)
	b = appendJSONString(b, aerr.msg)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, aerr.typ)
	b = append(b, `,"param":`...)
	if aerr.param == "" {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, aerr.param)
	}
	b = append(b, `,"code":`...)
	b = strconv.AppendInt(b, int64(aerr.status), 10)
	return append(b, "}}"...)
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	writeBody(w, status, "application/json", body)
}

func writeBody(w http.ResponseWriter, status int, mediaType string, body []byte) {
	h := w.Header()
	h["Content-Type"] = []string{mediaType}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
