// Package sse reads the server-sent events of an OpenAI-compatible engine
// (vLLM, the simulated engine, another gateway) and says what each event
// means to a relay. The gateway and the sidecar both use it, so they agree on
// where an event ends and on which event is the first token.
//
// # Overview
//
// [ReadEvent] reads one event verbatim, [NextBuffered] tells a relay whether
// it may hold a flush because the next event is already at hand, [Data]
// returns an event's payload and [Classify] sorts an event into a [Kind].
// [Token] follows DESIGN's definition of the first token: an event carrying
// generated output of any kind (content, text, reasoning, a tool-call delta, a
// refusal) or a finish_reason. [Pieces] counts the choices of a token event
// that carry output, for billing a stream whose usage never came.
//
// Classification is on every event's path, so it scans bytes instead of
// parsing JSON: a quoted name followed by ':' is a key in valid JSON wherever
// it appears (a quote inside a string is always escaped), and the first bytes
// of its value say whether it is an empty string, null, an empty array or
// output. Choices are told apart by their delta (or message) objects. JSON is
// parsed (gjson) only for an event with no output whose payload names
// "error" somewhere but not as its first key, to tell an error object from
// anything else.
//
// The package reads and classifies; it never writes to a client, never
// rewrites an event and keeps no state between calls.
package sse
