package server

import (
	"math"
	"strconv"
	"strings"

	"github.com/tailgate-dev/tailgate/server/apierr"
)

// The audio endpoints mirror vLLM's TranscriptionRequest and
// TranslationRequest (vllm/entrypoints/openai/speech_to_text/protocol.py
// @79ef6467), and reserve what the engine will run: it decodes the whole
// file (librosa.load), splits audio longer than the model's clip (Whisper:
// 30 s) into chunks of at least clip − overlap seconds, and runs each chunk
// as its own request with the full output cap
// (speech_to_text.py@024e0772, _preprocess_speech_to_text, _split_audio,
// _create_speech_to_text). So the prompt reserved is each chunk's encoder
// (1500 positions for Whisper's 30 s) and its text prompt, and the output
// is the cap once per chunk.

// audioField is what the gateway does with one field of an audio form.
type audioField uint8

const (
	afOption  audioField = iota // forwarded as sent; changes no token count
	afFile                      // the audio
	afModel                     // routed by
	afBool                      // stream flags: read, rewritten canonically
	afPrompt                    // the decoder prompt, once per chunk
	afCap                       // max_completion_tokens: the output cap per chunk
	afRefused                   // the gateway cannot bound it
)

// audioFields are the request models' fields, each with what the gateway
// does with it; a field not listed is refused (the engine may act on it).
var audioFields = map[string]audioField{
	"file": afFile, "model": afModel, "prompt": afPrompt, "max_completion_tokens": afCap,
	"stream": afBool, "stream_include_usage": afBool, "stream_continuous_usage_stats": afBool,
	"language": afOption, "to_language": afOption, "response_format": afOption, "timestamp_granularities[]": afOption,
	"temperature": afOption, "top_p": afOption, "top_k": afOption, "min_p": afOption, "seed": afOption,
	"frequency_penalty": afOption, "repetition_penalty": afOption, "presence_penalty": afOption,
	"length_penalty": afOption, "include_stop_str_in_output": afOption,
	// Beam search runs n beams per chunk; vllm_xargs reaches custom
	// extensions: neither is bounded by what the gateway reads.
	"use_beam_search": afRefused, "n": afRefused, "vllm_xargs": afRefused,
}

// Whisper's shape (vllm/model_executor/models/whisper.py's
// SpeechToTextConfig: 16 kHz, max_audio_clip_s 30, overlap_chunk_second 1).
const (
	// audioTokensPerSecond is Whisper's encoder: 1500 positions for 30 s;
	// a transcription's usage in seconds is billed at this rate.
	audioTokensPerSecond = 50
	audioClipSeconds     = 30
	audioOverlapSeconds  = 1
	// audioFloorBytesPerSecond is the bitrate assumed for a container the
	// gateway does not read the length of (MP3, MP4/M4A, WebM, …): 6 kbit/s,
	// Opus's lowest constant bitrate and below MP3's lowest (8 kbit/s), so
	// the length reserved is at least the real one for any constant-bitrate
	// speech codec. Variable-bitrate silence can go lower; the engine's
	// usage is what is billed where it reports one.
	audioFloorBytesPerSecond = 750
)

// audioChunks is how many requests the engine makes of seconds of audio.
func audioChunks(seconds float64) int64 {
	if seconds <= audioClipSeconds {
		return 1
	}
	return 1 + int64(math.Ceil((seconds-audioClipSeconds)/(audioClipSeconds-audioOverlapSeconds)))
}

// readAudio reads a transcription or translation form once, strictly, and
// forwards a form the gateway wrote itself. A stream always asks the engine
// for usage on every chunk (stripped back out as the client asked).
func readAudio(ep endpoint, body []byte, ctype string, lim parseLimits) (*parsedRequest, error) {
	f, err := readForm(body, ctype)
	if err != nil {
		return nil, err
	}
	pr := &parsedRequest{sequences: 1}
	for _, p := range f.parts {
		role, ok := audioFields[p.name]
		switch {
		case !ok:
			return nil, apierr.BadRequest(p.name, "%s is not a field of vLLM's %s request that the gateway reads; remove it", p.name, strings.TrimPrefix(ep.path, "/v1/audio/"))
		case role == afRefused:
			return nil, apierr.BadRequest(p.name, "%s is not served through the gateway: it runs work the gateway cannot bound", p.name)
		case role != afFile && p.file:
			return nil, apierr.BadRequest(p.name, "%s must be a text field, not a file", p.name)
		}
	}
	model, _ := f.value("model")
	if pr.model = model; pr.model == "" {
		return nil, apierr.BadRequest("model", "you must provide a model parameter (the gateway routes by it)")
	}
	formBool := func(name string) (bool, error) {
		if f.part(name) == nil {
			return false, nil
		}
		v, _ := f.value(name)
		switch {
		case strings.EqualFold(v, "true"):
			f.set(name, "true")
			return true, nil
		case strings.EqualFold(v, "false"):
			f.set(name, "false")
			return false, nil
		}
		return false, apierr.BadRequest(name, "%s must be true or false, not %q", name, v)
	}
	if pr.stream, err = formBool("stream"); err != nil {
		return nil, err
	}
	if pr.wantUsage, err = formBool("stream_include_usage"); err != nil {
		return nil, err
	}
	cont, err := formBool("stream_continuous_usage_stats")
	if err != nil {
		return nil, err
	}
	pr.wantContinuous = pr.wantUsage && cont
	f.del("priority")
	f.del("cache_salt") // the prefix cache is the gateway's to key (salt.go)
	if pr.stream {
		f.set("stream", "true")
		f.set("stream_include_usage", "true")
		f.set("stream_continuous_usage_stats", "true")
	}
	file := f.file()
	if f.part("file") == nil || !f.part("file").file {
		return nil, apierr.BadRequest("file", "send the audio as the file part named file")
	}
	seconds, err := audioDuration(file)
	if err != nil {
		return nil, err
	}
	chunks := audioChunks(seconds)
	if v, ok := f.value("max_completion_tokens"); ok {
		n, perr := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if perr != nil || n < 1 || n > 1<<31 {
			return nil, apierr.BadRequest("max_completion_tokens", "max_completion_tokens must be a positive integer")
		}
		pr.maxTokens = n
		f.set("max_completion_tokens", strconv.FormatInt(n, 10))
	} else {
		// The cap in force, said explicitly: each chunk may generate it.
		pr.maxTokens = lim.defaultMax(pr.model)
		f.set("max_completion_tokens", strconv.FormatInt(pr.maxTokens, 10))
	}
	pr.sequences = chunks
	pr.body, pr.ctype = f.encode()
	prompt, _ := f.value("prompt")
	// Each chunk's encoder, padded to the clip, and its decoder prompt.
	pr.promptBound = chunks * (audioTokensPerSecond*audioClipSeconds + int64(len(prompt)) + 16)
	// What the engine runs on the audio it decodes (its duration is read,
	// not guessed): billed as the prompt where the engine reports no usage
	// (translations, response_format text).
	pr.promptEstimate = audioTokensPerSecond*int64(math.Ceil(seconds)) + int64(len(prompt)) + 1
	return pr, nil
}
