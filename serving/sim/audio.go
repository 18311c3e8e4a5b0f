package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// /v1/audio/transcriptions and /v1/audio/translations take a multipart form
// with the audio file and answer a deterministic transcript: two words per
// second of audio (at least one), drawn from the file's bytes, produced
// like any answer (TTFT, then one word per TPOT; streamed when the form
// says stream=true). A WAV's duration is read from its RIFF chunks (see
// audioSeconds); any other file is taken as 16 kHz 16-bit mono (32000
// bytes a second). The prompt is
// 1 + ⌈len(prompt)/4⌉ + 50×⌈seconds⌉ tokens (50 audio tokens a second, as
// Whisper's encoder). A transcription's JSON answer reports usage as vLLM
// does, {"type":"duration","seconds":⌈seconds⌉}; a translation's has none.
// Shapes: vllm/entrypoints/openai/speech_to_text/protocol.py@79ef6467 and
// speech_to_text.py@024e0772 (_speech_to_text_stream_generator).

// audioRequest is what the encoders echo of an audio request.
type audioRequest struct {
	translate bool
	format    string // "json" or "text"
	seconds   int    // duration, rounded up
}

// audioBytesPerSecond is the rate assumed for audio without a WAV header.
const audioBytesPerSecond = 32000

func (e *Engine) handlePostTranscription(w http.ResponseWriter, r *http.Request) {
	e.handleAudio(w, r, false)
}

func (e *Engine) handlePostTranslation(w http.ResponseWriter, r *http.Request) {
	e.handleAudio(w, r, true)
}

func (e *Engine) handleAudio(w http.ResponseWriter, r *http.Request, translate bool) {
	arrived := time.Now()
	j, aerr := e.parseAudio(w, r, translate)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	choices := e.plan(j)
	e.serveGeneration(w, r, j, choices, e.newAudioEncoder(r, j, choices), arrived)
}

func (e *Engine) parseAudio(w http.ResponseWriter, r *http.Request, translate bool) (*job, *apiError) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, typ: "BadRequestError", msg: "request body too large"}
		}
		return nil, badRequest("", "read multipart body: "+err.Error())
	}
	form, err := ReadForm(body, r.Header.Get("Content-Type"))
	if err != nil {
		return nil, badRequest("", err.Error())
	}
	// The request model's fields, as FastAPI takes them from the form: the
	// last part of each name, an empty text taken as absent.
	fields := map[string]string{}
	var file []byte
	hasFile := false
	for _, it := range form.Items {
		v, ok, isFile := form.Value(it.Name)
		switch {
		case !ok:
		case it.Name == "file" && isFile:
			file, hasFile = []byte(v), true
		case isFile && audioTextFields[it.Name]:
			return nil, validationError([]pyErr{{typ: "string_type", loc: "body." + it.Name, msg: "Input should be a valid string", input: "UploadFile"}})
		case !isFile:
			fields[it.Name] = v
		}
	}
	// The request model's validator sees the form first
	// (TranscriptionRequest.validate_transcription_request).
	if _, ok := fields["file"]; ok && !hasFile {
		return nil, &apiError{status: http.StatusUnprocessableEntity, typ: "Unprocessable Entity",
			msg: "Expected 'file' to be a file-like object, not 'str'."}
	}
	stream := formBool(fields["stream"])
	for _, so := range []string{"stream_include_usage", "stream_continuous_usage_stats"} {
		if formBool(fields[so]) && !stream {
			return nil, validationError([]pyErr{{typ: "value_error", loc: "body",
				msg:   "Value error, Stream options can only be defined when `stream=True`. (parameter=" + so + ")",
				input: "<dict of " + strconv.Itoa(len(fields)+1) + " items>",
				ctx:   "{'error': VLLMValidationError('Stream options can only be defined when `stream=True`.')}", param: so}})
		}
	}
	var errs []pyErr
	if !hasFile {
		errs = append(errs, pyErr{typ: "missing", loc: "body.file", msg: "Field required", input: "None"})
	}
	for _, f := range []struct {
		name string
		typ  ftype
	}{{"temperature", tFloat}, {"stream", tBool}, {"stream_include_usage", tBool}, {"stream_continuous_usage_stats", tBool}} {
		if v, ok := fields[f.name]; ok {
			if _, es := convert(fspec{typ: f.typ}, []byte(strconv.Quote(v)), "body."+f.name); len(es) > 0 {
				errs = append(errs, es...)
			}
		}
	}
	format := fields["response_format"]
	if format == "" {
		format = "json"
	}
	switch format {
	case "json", "text", "srt", "verbose_json", "diarized_json", "vtt":
	default:
		errs = append(errs, pyErr{typ: "literal_error", loc: "body.response_format",
			msg: "Input should be 'json', 'text', 'srt', 'verbose_json', 'diarized_json' or 'vtt'", input: format})
	}
	if len(errs) > 0 {
		return nil, validationError(errs)
	}
	if aerr := e.checkModel(fields["model"]); aerr != nil {
		return nil, aerr
	}
	if format != "json" && format != "text" {
		return nil, badRequest("response_format", "the simulated engine answers response_format json or text, not "+format)
	}
	if len(file) == 0 {
		return nil, badRequest("file", "Invalid or empty audio file.")
	}
	seconds, ok := audioSeconds(file)
	if !ok {
		return nil, badRequest("", "Invalid or unsupported audio file.")
	}
	secs := int(seconds)
	if float64(secs) < seconds {
		secs++
	}
	j := &job{
		ep:           epTranscription,
		promptTokens: TextPromptTokens(fields["prompt"]) + 50*secs,
		hash:         fnvString(fnvOffset, string(file)),
		n:            1,
		fixed:        max(1, int(2*seconds)),
		stream:       stream,
		audio:        &audioRequest{translate: translate, format: format, seconds: secs},
	}
	if translate {
		j.ep = epTranslation
	}
	if j.promptTokens >= e.cfg.MaxModelLen {
		return nil, badRequest("input_tokens", fmt.Sprintf("The audio is %d prompt tokens; the model's context length is only %d tokens.", j.promptTokens, e.cfg.MaxModelLen))
	}
	j.limit = min(e.cfg.DefaultMaxTokens, e.cfg.MaxModelLen-j.promptTokens)
	if v, err := strconv.Atoi(strings.TrimSpace(fields["max_completion_tokens"])); err == nil && v > 0 {
		j.limit = min(j.limit, v) // get_max_tokens: the request's cap, within the context
	}
	if stream {
		j.includeUsage = formBool(fields["stream_include_usage"])
		j.continuousUsage = j.includeUsage && formBool(fields["stream_continuous_usage_stats"])
	}
	return j, nil
}

// audioTextFields are the request model's fields the engine reads as text;
// a file in one is a validation error (extra fields are allowed).
var audioTextFields = map[string]bool{"model": true, "prompt": true, "response_format": true, "language": true,
	"temperature": true, "stream": true, "stream_include_usage": true, "stream_continuous_usage_stats": true}

// formBool reads a form field as pydantic reads a bool.
func formBool(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "on", "t", "true", "y", "yes":
		return true
	}
	return false
}

// audioSeconds returns a file's duration as libsndfile decodes a WAV: the
// RIFF chunks walked (JUNK, LIST, bext may precede fmt) to fmt and data,
// the data's frames (channels × bits per sample each, not the header's
// byte-rate field) over the sample rate; ok is false for a WAV without fmt
// and data (librosa fails on it). Other files are taken at
// audioBytesPerSecond.
func audioSeconds(f []byte) (seconds float64, ok bool) {
	if len(f) >= 12 && string(f[:4]) == "RIFF" && string(f[8:12]) == "WAVE" {
		var rate uint32
		var frame int
		for off := 12; off+8 <= len(f); {
			id, size := string(f[off:off+4]), int(binary.LittleEndian.Uint32(f[off+4:off+8]))
			body := off + 8
			switch {
			case id == "fmt " && body+16 <= len(f):
				channels := int(binary.LittleEndian.Uint16(f[body+2:]))
				rate = binary.LittleEndian.Uint32(f[body+4 : body+8])
				frame = channels * ((int(binary.LittleEndian.Uint16(f[body+14:])) + 7) / 8)
			case id == "data" && rate > 0 && frame > 0:
				n := min(size, len(f)-body)
				return float64(n/frame) / float64(rate), true
			}
			if size < 0 || body+size+size&1 > len(f) {
				break
			}
			off = body + size + size&1
		}
		return 0, false
	}
	return float64(len(f)) / audioBytesPerSecond, true
}

// audioEncoder renders transcripts and translations.
type audioEncoder struct {
	e      *Engine
	j      *job
	c      *choice
	head   []byte
	object string
}

func (e *Engine) newAudioEncoder(r *http.Request, j *job, choices []*choice) *audioEncoder {
	prefix, object := "trsc-", "transcription.chunk"
	if j.audio.translate {
		prefix, object = "trsl-", "translation.chunk"
	}
	return &audioEncoder{e: e, j: j, c: choices[0], head: e.answerHead(prefix, requestID(r), object), object: object}
}

func (a *audioEncoder) mediaType() string {
	if a.j.audio.format == "text" {
		return "text/plain; charset=utf-8"
	}
	return "application/json"
}

func (a *audioEncoder) open(b []byte) []byte  { return b }
func (a *audioEncoder) first(b []byte) []byte { return b }

func (a *audioEncoder) token(b []byte, c *choice, k int) []byte {
	b = append(b, "data: "...)
	b = append(b, a.head...)
	b = append(b, `"choices":[{"delta":{"content":`...)
	b = appendJSONString(b, c.text(k))
	b = append(b, '}')
	if k == c.total()-1 {
		b = append(b, `,"finish_reason":"`...)
		b = append(b, c.finish...)
		b = append(b, `","stop_reason":null`...)
	}
	b = append(b, "}]"...)
	if a.j.continuousUsage {
		b = append(b, `,"usage":`...)
		b = appendUsageCounts(b, a.j.promptTokens, k+1)
		b = append(b, '}')
	}
	return append(b, "}\n\n"...)
}

func (a *audioEncoder) end(b []byte) []byte {
	if a.j.includeUsage {
		b = append(b, "data: "...)
		b = append(b, a.head...)
		b = append(b, `"choices":[],"usage":`...)
		b = appendUsageCounts(b, a.j.promptTokens, a.c.total())
		b = append(b, "}}\n\n"...)
	}
	return append(b, "data: [DONE]\n\n"...)
}

func (a *audioEncoder) body(b []byte) []byte {
	text := a.c.contentText()
	if a.j.audio.format == "text" {
		return append(b, text...)
	}
	b = append(b, `{"text":`...)
	b = appendJSONString(b, text)
	if a.j.audio.translate {
		return append(b, '}')
	}
	b = append(b, `,"usage":{"type":"duration","seconds":`...)
	b = strconv.AppendInt(b, int64(a.j.audio.seconds), 10)
	return append(b, "}}"...)
}
