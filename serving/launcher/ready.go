package launcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"time"
)

// probeTimeout bounds one readiness request; /health and /v1/models answer
// at once on a live engine.
const probeTimeout = 5 * time.Second

// waitReady polls url until /health answers 200 and the model is listed on
// /v1/models, logging progress, until StartupTimeout has passed or ctx ends.
func (l *Launcher) waitReady(ctx context.Context, url string) error {
	start := time.Now()
	timeout := l.cfg.StartupTimeout
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	poll := time.NewTicker(l.cfg.PollInterval)
	defer poll.Stop()
	progress := time.NewTicker(l.cfg.Progress)
	defer progress.Stop()

	last := "/health: no answer yet"
	for {
		err := l.probe(sctx, url)
		if err == nil {
			l.log.Info("engine serves the model", "model", l.cfg.Model, "after", time.Since(start).Round(time.Millisecond))
			return nil
		}
		if sctx.Err() == nil {
			last = err.Error()
		}
		select {
		case <-sctx.Done():
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return fmt.Errorf("model never became ready within %s (last %s)", timeout, last)
		case <-progress.C:
			msg := fmt.Sprintf("engine starting: waited %s of %s; last %s",
				time.Since(start).Round(time.Second), timeout, last)
			l.log.Info(msg)
			_, reason := l.starting(msg)
			l.setReason(reason)
		case <-poll.C:
		}
	}
}

// probe checks readiness once: nil, or what is missing, named by endpoint.
func (l *Launcher) probe(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	status, _, err := l.get(ctx, url+"/health")
	if err != nil {
		return fmt.Errorf("/health: %s", describe(err))
	}
	if status != http.StatusOK {
		return fmt.Errorf("/health: %d %s", status, http.StatusText(status))
	}
	status, body, err := l.get(ctx, url+"/v1/models")
	if err != nil {
		return fmt.Errorf("/v1/models: %s", describe(err))
	}
	if status != http.StatusOK {
		return fmt.Errorf("/v1/models: %d %s", status, http.StatusText(status))
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return fmt.Errorf("/v1/models: bad answer: %v", err)
	}
	ids := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if !slices.Contains(ids, l.cfg.Model) {
		return fmt.Errorf("/v1/models: model %q not listed (listed: %s)", l.cfg.Model, strings.Join(ids, ", "))
	}
	return nil
}

// maxProbeBody bounds what is read of a probe or warm-up answer.
const maxProbeBody = 1 << 20

func (l *Launcher) get(ctx context.Context, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	return l.do(req)
}

// do sends req to the current engine with its API key.
func (l *Launcher) do(req *http.Request) (int, []byte, error) {
	if key := l.EngineKey(); key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := l.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxProbeBody))
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, body, nil
}

// describe shortens the usual probe errors for progress lines.
func describe(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ENOENT):
		return "no socket yet" // the engine has not bound it
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	}
	return err.Error()
}

// Warm-up endpoints: chat first, plain completions for a model that cannot
// chat.
const (
	chatPath       = "/v1/chat/completions"
	completionPath = "/v1/completions"
)

// warmUp sends Warmup short generations one after another; each must answer
// 200 within what is left of WarmupTimeout. They are chat completions, or
// plain completions once a chat completion is refused with 400: vLLM
// answers every chat request so for a base model without a chat template
// ("default chat template is no longer allowed, so you must provide a chat
// template…"), which completions serve.
func (l *Launcher) warmUp(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.WarmupTimeout)
	defer cancel()
	path, body := chatPath, map[string]any{
		"model":      l.cfg.Model,
		"messages":   []map[string]string{{"role": "user", "content": "warm-up"}},
		"max_tokens": 8,
	}
	start := time.Now()
	for i := 0; i < l.cfg.Warmup; i++ {
		status, answer, err := l.post(ctx, url+path, body)
		switch {
		case ctx.Err() != nil && context.Cause(ctx) == context.DeadlineExceeded:
			return fmt.Errorf("warm-up %d of %d did not finish within %s", i+1, l.cfg.Warmup, l.cfg.WarmupTimeout)
		case err != nil:
			return fmt.Errorf("warm-up %d of %d (%s): %s", i+1, l.cfg.Warmup, path, describe(err))
		case status == http.StatusBadRequest && path == chatPath:
			l.log.Warn("chat warm-up refused; warming up with "+completionPath+" instead",
				"answer", snippet(answer))
			path, body = completionPath, map[string]any{"model": l.cfg.Model, "prompt": "warm-up", "max_tokens": 8}
			i--
		case status != http.StatusOK:
			return fmt.Errorf("warm-up %d of %d (%s): %d %s: %s", i+1, l.cfg.Warmup, path, status, http.StatusText(status), snippet(answer))
		}
	}
	l.log.Info("engine warmed up", "endpoint", path, "requests", l.cfg.Warmup, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// post sends body as JSON to url on the current engine.
func (l *Launcher) post(ctx context.Context, url string, body any) (int, []byte, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return 0, nil, fmt.Errorf("warm-up request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(raw))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return l.do(req)
}

// snippet is the start of an error body, on one line.
func snippet(b []byte) string {
	const n = 200
	s := strings.Join(strings.Fields(string(b)), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}
