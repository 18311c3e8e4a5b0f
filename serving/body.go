package serving

import (
	"io"
	"net/http"
)

// ReadBody reads a request body of at most limit bytes, in one allocation
// when the client declared its length (a body read by doubling a buffer
// costs up to twice its size). A larger body fails with
// *http.MaxBytesError; the caller maps errors to its own answer.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	rd := http.MaxBytesReader(w, r.Body, limit)
	if n := r.ContentLength; n > 0 && n <= limit {
		body := make([]byte, n)
		if _, err := io.ReadFull(rd, body); err != nil {
			return nil, err
		}
		return body, nil
	}
	return io.ReadAll(rd)
}
