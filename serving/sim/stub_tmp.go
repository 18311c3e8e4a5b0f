package sim

import "net/http"

type responsesRequest struct{}
type audioRequest struct{}

func (e *Engine) handlePostResponses(w http.ResponseWriter, r *http.Request)     { handleNotFound(w, r) }
func (e *Engine) handlePostMessages(w http.ResponseWriter, r *http.Request)      { handleNotFound(w, r) }
func (e *Engine) handlePostEmbeddings(w http.ResponseWriter, r *http.Request)    { handleNotFound(w, r) }
func (e *Engine) handlePostRerank(w http.ResponseWriter, r *http.Request)        { handleNotFound(w, r) }
func (e *Engine) handlePostScore(w http.ResponseWriter, r *http.Request)         { handleNotFound(w, r) }
func (e *Engine) handlePostTokenize(w http.ResponseWriter, r *http.Request)      { handleNotFound(w, r) }
func (e *Engine) handlePostDetokenize(w http.ResponseWriter, r *http.Request)    { handleNotFound(w, r) }
func (e *Engine) handlePostTranscription(w http.ResponseWriter, r *http.Request) { handleNotFound(w, r) }
func (e *Engine) handlePostTranslation(w http.ResponseWriter, r *http.Request)   { handleNotFound(w, r) }
