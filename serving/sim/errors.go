package sim

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// apiError is an error answered in OpenAI's shape, with vLLM's type names and
// its habit of putting the HTTP status in code.
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
	type info struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	}
	in := info{Message: aerr.msg, Type: aerr.typ, Code: aerr.status}
	if aerr.param != "" {
		in.Param = &aerr.param
	}
	body, _ := json.Marshal(struct {
		Error info `json:"error"`
	}{in})
	writeJSON(w, aerr.status, body)
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
