package load

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// The multiturn workload: agent-like conversations, each a few turns whose
// prompt repeats the whole history plus what the turn adds (a tool result,
// the user's next message), run closed loop — a conversation sends its next
// turn a think time after the last answer — on a fleet of simulated engines
// that charge prefill per uncached prompt token and cache prefixes by
// 16-token block (serving/sim/prefix.go). The same seeded conversations run
// once per --affinity mode of the gateway; follow-up turns are where a warm
// replica's prefix cache pays.

// MultiturnOptions configures `bench --scenario multiturn`; zero fields mean
// the defaults named.
type MultiturnOptions struct {
	// Conversations is how many conversations run at once (each slot starts
	// a new one when its last ends); 0 means 24.
	Conversations int
	// Turns is the distribution of turns per conversation; "" means
	// uniform:4:12.
	Turns string
	// Growth is the distribution of prompt tokens each turn adds after the
	// first (the last answer, a tool result, the next message); "" means
	// lognormal:250:0.6.
	Growth string
	// FirstTurn is the distribution of the first user message's tokens; ""
	// means lognormal:300:0.5.
	FirstTurn string
	// System is the system prompt's tokens; 0 means 1500. Agents is how
	// many different system prompts (agent kinds) the conversations share;
	// 0 means 4.
	System, Agents int
	// Think is the mean pause between an answer and the next turn
	// (exponential); 0 means 300ms.
	Think time.Duration
	// Duration is how long each mode runs; 0 means 20s.
	Duration time.Duration
	// Modes are the gateway --affinity modes run, in order; nil means off,
	// prefix, session.
	Modes []string
	// SessionHeader is the coding agent whose session header names each
	// conversation (agentSessionHeaders below): claude-code, codex or
	// opencode, the body's prompt_cache_key then left out; "" or "none"
	// means no header, the session named by prompt_cache_key as OpenAI's
	// clients name it.
	SessionHeader string
}

// agentSessionHeaders are the headers each coding agent names its
// conversation by, on every request, as the gateway reads them
// (server/agentsession.go, which cites each agent's source):
//
//   - claude-code: X-Claude-Code-Session-Id;
//   - codex: session_id (Codex CLI's conversation id; sent in lower case,
//     as codex-rs/codex-api/src/requests/headers.rs sends it);
//   - opencode: x-session-affinity and X-Session-Id, both the session id.
var agentSessionHeaders = map[string][]string{
	"claude-code": {"X-Claude-Code-Session-Id"},
	"codex":       {"session_id"},
	"opencode":    {"x-session-affinity", "X-Session-Id"},
}

func (m MultiturnOptions) withDefaults() MultiturnOptions {
	m.Conversations = orDefault(m.Conversations, 24)
	m.Turns = orDefault(m.Turns, "uniform:4:12")
	m.Growth = orDefault(m.Growth, "lognormal:250:0.6")
	m.FirstTurn = orDefault(m.FirstTurn, "lognormal:300:0.5")
	m.System = orDefault(m.System, 1500)
	m.Agents = orDefault(m.Agents, 4)
	m.Think = orDefault(m.Think, 300*time.Millisecond)
	m.Duration = orDefault(m.Duration, 20*time.Second)
	if len(m.Modes) == 0 {
		m.Modes = []string{"off", "prefix", "session"}
	}
	return m
}

// multiturnDists are a run's parsed distributions.
type multiturnDists struct{ turns, growth, first Dist }

func (m MultiturnOptions) validate() (multiturnDists, error) {
	var d multiturnDists
	var err error
	switch {
	case m.Conversations < 1 || m.Conversations > 1000:
		return d, fmt.Errorf("--conversations %d: want 1 to 1000", m.Conversations)
	case m.System < 0 || m.System > 100000:
		return d, fmt.Errorf("--system-tokens %d: want 0 to 100000", m.System)
	case m.Agents < 1 || m.Agents > 1000:
		return d, fmt.Errorf("--agents %d: want 1 to 1000", m.Agents)
	case m.Duration < time.Second || m.Duration > time.Hour:
		return d, fmt.Errorf("--multiturn-duration %v: want 1s to 1h", m.Duration)
	case m.Think < 0:
		return d, fmt.Errorf("--think %v: must not be negative", m.Think)
	}
	for _, mode := range m.Modes {
		if mode != "off" && mode != "prefix" && mode != "session" {
			return d, fmt.Errorf("--affinity-modes: %q: want off, prefix or session, comma-separated", mode)
		}
	}
	if _, ok := agentSessionHeaders[m.SessionHeader]; !ok && m.SessionHeader != "" && m.SessionHeader != "none" {
		return d, fmt.Errorf("--session-header %q: want claude-code, codex, opencode or none", m.SessionHeader)
	}
	if d.turns, err = ParseDist(m.Turns); err != nil {
		return d, fmt.Errorf("--turns: %w", err)
	}
	if d.growth, err = ParseDist(m.Growth); err != nil {
		return d, fmt.Errorf("--context-growth: %w", err)
	}
	if d.first, err = ParseDist(m.FirstTurn); err != nil {
		return d, fmt.Errorf("--first-turn-tokens: %w", err)
	}
	return d, nil
}

// The multiturn fleet: 4 replicas of 8 slots, a 20 ms median time to first
// token before prefill, 16 output tokens 2 ms apart, vLLM's prefill cost
// per uncached token (the sim's default, 40 µs) and a prefix cache of 2,048
// blocks (32,768 tokens) per replica: a small GPU's, which holds about a
// quarter of the default workload's live conversations (24 of up to ~5,000
// tokens) — every replica's share when conversations stay put, not all of
// them.
const (
	multiturnReplicas = 4
	multiturnOutput   = 16
)

var multiturnSimArgs = []string{"--sim-ttft", "20ms", "--sim-tpot", "2ms", "--sim-max-seqs", "8", "--sim-prefix-cache-blocks", "2048"}

// multiturnMode is one mode's figures.
type multiturnMode struct {
	Mode      string             `json:"mode"`
	First     Summary            `json:"first_turn_ttft_ms"`
	FollowUp  Summary            `json:"follow_up_ttft_ms"`
	Turns     int                `json:"turns"`
	Errors    map[string]int     `json:"errors"`
	HitRate   map[string]float64 `json:"prefix_cache_hit_rate"` // by replica, over the run
	Inflight  map[string]float64 `json:"mean_inflight"`         // by replica, sampled
	Imbalance float64            `json:"imbalance"`             // max / mean of Inflight
	// Routes counts the session mode's placements by outcome
	// (tailgate_session_routes_total: stayed, placed, moved_load,
	// moved_gone); empty in the other modes.
	Routes map[string]float64 `json:"session_routes,omitempty"`
}

// moved is the share of a session's turns that did not stay on the
// replica of its last turn, -1 when no session was routed.
func (m multiturnMode) moved() float64 {
	var all, moved float64
	for outcome, n := range m.Routes {
		all += n
		if strings.HasPrefix(outcome, "moved") {
			moved += n
		}
	}
	if all == 0 {
		return -1
	}
	return moved / all
}

// mainMultiturn runs `bench --scenario multiturn`.
func mainMultiturn(ctx context.Context, o Options) error {
	switch {
	case o.A.Target != "":
		return errors.New("--scenario multiturn starts its own fleets (one per --affinity mode): give no --target")
	case o.Compare:
		return errors.New("--compare does not apply to the multiturn scenario: it compares its affinity modes by itself")
	}
	m := o.Multiturn.withDefaults()
	dists, err := m.validate()
	if err != nil {
		return err
	}
	bin, err := (&bench{opts: o}).binary()
	if err != nil {
		return err
	}
	replicas := orDefault(o.Replicas, multiturnReplicas)
	model := orDefault(o.A.Model, "tailgate-sim")
	w := orWriter(o.Stdout)
	names := "prompt_cache_key"
	if hs := agentSessionHeaders[m.SessionHeader]; hs != nil {
		names = m.SessionHeader + "'s " + strings.Join(hs, " and ") + " header"
		if len(hs) > 1 {
			names += "s"
		}
	}
	fmt.Fprintf(w, "multiturn: %d conversations at once for %v per mode, turns %s, +%s tokens a turn after a first of %s, %d agents' system prompts of %d tokens, think %v, sessions named by %s; %d replicas; seed %d\n",
		m.Conversations, m.Duration, dists.turns, dists.growth, dists.first, m.Agents, m.System, m.Think, names, replicas, o.Seed)
	var modes []multiturnMode
	for _, mode := range m.Modes {
		fmt.Fprintf(orWriter(o.Progress), "bench: multiturn --affinity=%s…\n", mode)
		res, err := runMultiturnMode(ctx, o, m, dists, bin, replicas, model, mode)
		if err != nil {
			return err
		}
		modes = append(modes, res)
	}
	if o.JSONFile != "" {
		b, _ := json.MarshalIndent(modes, "", "  ")
		if err := os.WriteFile(o.JSONFile, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return writeMultiturn(w, modes)
}

// runMultiturnMode starts a fleet whose gateway has --affinity=mode and
// runs the conversations on it.
func runMultiturnMode(ctx context.Context, o Options, m MultiturnOptions, d multiturnDists, bin string, replicas int, model, mode string) (multiturnMode, error) {
	res := multiturnMode{Mode: mode, Errors: map[string]int{}}
	fleet, err := StartLocal(ctx, LocalConfig{
		Binary: bin, Keep: o.Keep, Replicas: replicas, Model: model,
		GatewayArgs:    append([]string{"--affinity=" + mode}, strings.Fields(o.A.GatewayArgs)...),
		WorkerArgs:     append(slices.Clone(multiturnSimArgs), strings.Fields(o.A.WorkerArgs)...),
		StartupTimeout: orDefault(o.StartupTimeout, time.Minute), Log: o.Stderr,
	})
	if err != nil {
		return res, err
	}
	defer fleet.Close()
	t := fleet.Target()
	ad := newAdmin(t.AdminURL, t.AdminToken, "")
	c := &fanoutClient{hc: newHTTPClient(false, 0), base: strings.TrimSuffix(t.BaseURL, "/"), key: t.Key, model: model, timeout: orDefault(o.Timeout, 30*time.Second)}
	before, err := ad.cacheCounters(ctx)
	if err != nil {
		return res, err
	}

	var (
		mu              sync.Mutex
		first, followUp []float64
		wg              sync.WaitGroup
	)
	sampled := map[string]float64{}
	samples := 0
	stopSampling := make(chan struct{})
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
			reps, err := ad.replicas(ctx)
			if err != nil {
				continue
			}
			samples++
			for _, r := range reps {
				sampled[r.ID] += float64(r.Inflight)
			}
		}
	})
	deadline := time.Now().Add(m.Duration)
	var convs sync.WaitGroup
	for slot := range m.Conversations {
		convs.Go(func() {
			for n := 0; time.Now().Before(deadline) && ctx.Err() == nil; n++ {
				r := rand.New(rand.NewPCG(uint64(o.Seed), uint64(slot)<<32|uint64(n)))
				conv := newConversation(r, d, m, model, fmt.Sprintf("s%d-c%d-%d", o.Seed, slot, n))
				conv.agent = m.SessionHeader
				// Slots start spread over the first think times, not at once.
				pause := time.Duration(r.ExpFloat64() * float64(m.Think))
				for k := 0; k < conv.turns && time.Now().Before(deadline); k++ {
					select {
					case <-ctx.Done():
						return
					case <-time.After(pause):
					}
					ttft, err := c.turn(ctx, conv.body(k), conv.header())
					mu.Lock()
					if err != nil {
						res.Errors[errClass(err.Error())]++
					} else if k == 0 {
						first = append(first, ttft)
					} else {
						followUp = append(followUp, ttft)
					}
					res.Turns++
					mu.Unlock()
					pause = time.Duration(r.ExpFloat64() * float64(m.Think))
				}
			}
		})
	}
	convs.Wait()
	close(stopSampling)
	wg.Wait()
	res.First, res.FollowUp = Summarize(first), Summarize(followUp)

	res.Inflight = map[string]float64{}
	var sum, most float64
	for id, v := range sampled {
		mean := v / float64(max(samples, 1))
		res.Inflight[id] = mean
		sum += mean
		most = max(most, mean)
	}
	if sum > 0 {
		res.Imbalance = most / (sum / float64(len(sampled)))
	}
	// The engines' counters reach the gateway with the workers'
	// heartbeats: wait for those sent after the last turn.
	select {
	case <-ctx.Done():
	case <-time.After(2500 * time.Millisecond):
	}
	after, err := ad.cacheCounters(ctx)
	if err != nil {
		return res, err
	}
	res.Routes = map[string]float64{}
	if err := eachSample(ctx, t.AdminURL, t.AdminToken, func(name, labels string, v float64) {
		if name == "tailgate_session_routes_total" {
			res.Routes[labelValue(labels, "outcome")] += v
		}
	}); err != nil {
		return res, err
	}
	res.HitRate = map[string]float64{}
	for id, a := range after {
		b := before[id]
		if q := a[0] - b[0]; q > 0 {
			res.HitRate[id] = (a[1] - b[1]) / q
		}
	}
	return res, ctx.Err()
}

// cacheCounters reads each replica's prefix cache queries and hits (in
// tokens, the engine's vllm:prefix_cache_*_total as its heartbeat said).
func (a *admin) cacheCounters(ctx context.Context) (map[string][2]float64, error) {
	var out struct {
		Data []struct {
			ID      string  `json:"id"`
			Queries float64 `json:"prefix_cache_queries_total"`
			Hits    float64 `json:"prefix_cache_hits_total"`
		} `json:"data"`
	}
	if err := a.get(ctx, "/admin/v1/replicas", &out); err != nil {
		return nil, err
	}
	m := map[string][2]float64{}
	for _, r := range out.Data {
		m[r.ID] = [2]float64{r.Queries, r.Hits}
	}
	return m, nil
}

// conversation is one seeded conversation: its system prompt and the text
// each turn adds.
type conversation struct {
	model, session, system string
	agent                  string // MultiturnOptions.SessionHeader
	turns                  int
	adds                   []string // what turn k adds: the first message, then answer + tool result
}

func newConversation(r *rand.Rand, d multiturnDists, m MultiturnOptions, model, session string) *conversation {
	agent := r.IntN(m.Agents)
	c := &conversation{model: model, session: session, turns: max(1, d.turns.Draw(r))}
	c.system = fmt.Sprintf("You are agent %d. ", agent) + text(rand.New(rand.NewPCG(uint64(agent), 0x5157)), m.System)
	c.adds = append(c.adds, text(r, max(1, d.first.Draw(r))))
	for k := 1; k < c.turns; k++ {
		c.adds = append(c.adds, text(r, max(1, d.growth.Draw(r))))
	}
	return c
}

// body is turn k's request: the system prompt, then for each earlier turn
// the user's message and the assistant's answer, then this turn's message.
// The session is named by prompt_cache_key, as OpenAI's clients name it,
// unless an agent's header names it (header).
func (c *conversation) body(k int) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", c.system}}
	for i := 0; i <= k; i++ {
		msgs = append(msgs, msg{"user", c.adds[i]})
		if i < k {
			msgs = append(msgs, msg{"assistant", "done: step " + strconv.Itoa(i)})
		}
	}
	body := map[string]any{
		"model": c.model, "messages": msgs, "stream": true, "max_tokens": multiturnOutput, "ignore_eos": true,
	}
	if agentSessionHeaders[c.agent] == nil {
		body["prompt_cache_key"] = c.session
	}
	b, _ := json.Marshal(body)
	return b
}

// header is what each of the conversation's requests carries besides
// auth: its agent's session headers, nil when none.
func (c *conversation) header() http.Header {
	names := agentSessionHeaders[c.agent]
	if names == nil {
		return nil
	}
	h := http.Header{}
	for _, name := range names {
		h[name] = []string{c.session} // as the agent spells it, not canonicalized
	}
	return h
}

// text returns n tokens of words, as the simulated engine counts them
// (each word of the bench's list and its space is four bytes, a token).
func text(r *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(4 * n)
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.String()
}

// turn sends one streamed turn and returns the ms to its first event.
func (c *fanoutClient) turn(ctx context.Context, body []byte, header http.Header) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	t0 := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	for name, v := range header {
		req.Header[name] = v
	}
	req.Header.Set("Content-Type", "application/json")
	c.auth(req)
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, classifyFanout(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return 0, fmt.Errorf("http_%d", resp.StatusCode)
	}
	var first float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data: ")) {
			continue
		}
		if first == 0 {
			first = float64(time.Since(t0)) / float64(time.Millisecond)
		}
		if bytes.Equal(line, []byte("data: [DONE]")) {
			return first, nil
		}
	}
	if ctx.Err() != nil {
		return 0, errors.New(ErrTimeout)
	}
	return 0, errors.New(ErrStreamCut)
}

// writeMultiturn prints the modes side by side and the verdict on the
// session mode against off: follow-up TTFT p95 at most 0.7×, imbalance at
// most 1.25, no errors.
func writeMultiturn(w io.Writer, modes []multiturnMode) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "affinity\tturns\terrors\tfollow-up ttft p50\tp95\tp99\tfirst-turn p50\tp95\tcache hits\timbalance\tmoved\t")
	var off, session *multiturnMode
	for i := range modes {
		md := &modes[i]
		errs := 0
		for _, n := range md.Errors {
			errs += n
		}
		moved := "-"
		if f := md.moved(); f >= 0 {
			moved = fmt.Sprintf("%.0f%%", 100*f)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%s\t%.2f\t%s\t\n", md.Mode, md.Turns, errs,
			md.FollowUp.P50, md.FollowUp.P95, md.FollowUp.P99, md.First.P50, md.First.P95, hitRates(md.HitRate), md.Imbalance, moved)
		switch md.Mode {
		case "off":
			off = md
		case "session":
			session = md
		}
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "ttft in ms (client: send to first event); cache hits: prompt tokens served from the prefix cache, per replica; imbalance: max/mean of the replicas' mean in-flight requests; moved: a session's turns sent away from its last turn's replica (load bound, replica gone)")
	var problems []string
	for _, md := range modes {
		for class, n := range md.Errors {
			problems = append(problems, fmt.Sprintf("%s: %d %s", md.Mode, n, class))
		}
	}
	if off != nil && session != nil && off.FollowUp.P95 > 0 {
		ratio := session.FollowUp.P95 / off.FollowUp.P95
		verdict := "PASS"
		if ratio > 0.7 || session.Imbalance > 1.25 {
			verdict = "FAIL"
			problems = append(problems, fmt.Sprintf("session: follow-up p95 ×%.2f of off (want ≤ 0.7), imbalance %.2f (want ≤ 1.25)", ratio, session.Imbalance))
		}
		fmt.Fprintf(w, "session vs off: follow-up ttft p95 %.0f / %.0f ms = %.2f (max 0.7), imbalance %.2f (max 1.25): %s\n",
			session.FollowUp.P95, off.FollowUp.P95, ratio, session.Imbalance, verdict)
	}
	if len(problems) > 0 {
		return fmt.Errorf("multiturn: %s", strings.Join(problems, "; "))
	}
	return nil
}

// hitRates lists per-replica hit rates in replica order, e.g. "61% 58% 64% 60%".
func hitRates(m map[string]float64) string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("%.0f%%", 100*m[id])
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}
