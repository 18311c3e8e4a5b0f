package server_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// browser is headless Chromium driven over the DevTools protocol on a
// pipe (--remote-debugging-pipe: commands in on fd 3, answers out on fd 4,
// each message ended by a NUL byte). That needs no websocket and no module:
// the few commands a dashboard test sends (navigate, evaluate, screenshot)
// are a page of code, where chromedp would add a dependency tree.
type browser struct {
	t       *testing.T
	cmd     *exec.Cmd
	wmu     sync.Mutex
	w       io.WriteCloser
	session string

	mu      sync.Mutex
	nextID  int
	pending map[int]chan cdpReply
	done    chan struct{}
}

type cdpReply struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// startBrowser starts Chromium with a page of width×height CSS pixels and
// stops it when the test ends. JavaScript dialogs (confirm) are accepted,
// as a user clicking OK.
func startBrowser(t *testing.T, width, height int) *browser {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not found: scripts/test.sh installs Debian's chromium package")
	}
	cmdR, cmdW, err := os.Pipe() // we write commands, Chromium reads fd 3
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe() // Chromium writes fd 4, we read
	if err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{}, chromiumFlags...), "--remote-debugging-pipe", "--user-data-dir="+t.TempDir(),
		fmt.Sprintf("--window-size=%d,%d", width, height), "about:blank")
	cmd := exec.Command(bin, args...)
	cmd.ExtraFiles = []*os.File{cmdR, outW}
	if err := cmd.Start(); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	cmdR.Close()
	outW.Close()
	b := &browser{t: t, cmd: cmd, w: cmdW, pending: map[int]chan cdpReply{}, done: make(chan struct{})}
	go b.read(outR)
	t.Cleanup(func() {
		cmdW.Close() // Chromium exits when its pipe closes
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	var target struct{ TargetID string }
	b.call("", "Target.createTarget", map[string]any{"url": "about:blank"}, &target)
	var att struct{ SessionID string }
	b.call("", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &att)
	b.session = att.SessionID
	b.call(b.session, "Page.enable", nil, nil)
	b.call(b.session, "Emulation.setDeviceMetricsOverride", map[string]any{"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}, nil)
	return b
}

func (b *browser) read(r io.Reader) {
	defer close(b.done)
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		msg, err := br.ReadBytes(0)
		if err != nil {
			return
		}
		var m struct {
			ID        int             `json:"id"`
			Method    string          `json:"method"`
			SessionID string          `json:"sessionId"`
			Result    json.RawMessage `json:"result"`
			Error     *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(msg[:len(msg)-1], &m) != nil {
			continue
		}
		if m.Method == "Page.javascriptDialogOpening" {
			go b.send(0, m.SessionID, "Page.handleJavaScriptDialog", map[string]any{"accept": true})
			continue
		}
		b.mu.Lock()
		ch := b.pending[m.ID]
		delete(b.pending, m.ID)
		b.mu.Unlock()
		if ch != nil {
			ch <- cdpReply{Result: m.Result, Error: m.Error}
		}
	}
}

func (b *browser) send(id int, session, method string, params any) {
	msg := map[string]any{"id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	if session != "" {
		msg["sessionId"] = session
	}
	raw, _ := json.Marshal(msg)
	b.wmu.Lock()
	defer b.wmu.Unlock()
	_, _ = b.w.Write(append(raw, 0))
}

// call sends one command and decodes its result into out (if not nil).
func (b *browser) call(session, method string, params, out any) {
	b.t.Helper()
	b.mu.Lock()
	b.nextID++
	id := b.nextID + 1000 // ids below 1000 are the dialog answers' (0)
	ch := make(chan cdpReply, 1)
	b.pending[id] = ch
	b.mu.Unlock()
	b.send(id, session, method, params)
	select {
	case r := <-ch:
		if r.Error != nil {
			b.t.Fatalf("chromium %s: %s", method, r.Error.Message)
		}
		if out != nil {
			if err := json.Unmarshal(r.Result, out); err != nil {
				b.t.Fatalf("chromium %s: %v", method, err)
			}
		}
	case <-b.done:
		b.t.Fatalf("chromium exited during %s", method)
	case <-time.After(30 * time.Second):
		b.t.Fatalf("chromium did not answer %s", method)
	}
}

func (b *browser) navigate(url string) {
	b.t.Helper()
	b.call(b.session, "Page.navigate", map[string]any{"url": url}, nil)
}

// eval runs a JavaScript expression in the page (awaiting a promise) and
// decodes its value into out.
func (b *browser) eval(expr string, out any) {
	b.t.Helper()
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	b.call(b.session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true}, &r)
	if e := r.ExceptionDetails; e != nil {
		b.t.Fatalf("page script %q: %s %s", expr, e.Text, e.Exception.Description)
	}
	if out != nil && len(r.Result.Value) > 0 {
		if err := json.Unmarshal(r.Result.Value, out); err != nil {
			b.t.Fatalf("page script %q returned %s: %v", expr, r.Result.Value, err)
		}
	}
}

// waitFor evaluates cond (a JavaScript boolean expression) until it is true,
// polling at most for 30 s; what says what is awaited.
func (b *browser) waitFor(what, cond string) {
	b.t.Helper()
	for range 300 {
		var ok bool
		b.eval("(() => { try { return Boolean("+cond+") } catch (e) { return false } })()", &ok) // false while the page loads
		if ok {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	var status string
	b.eval(`document.querySelector("#status") ? document.querySelector("#status").textContent : document.body.innerText`, &status)
	b.t.Fatalf("the dashboard never showed %s (status line: %q)", what, status)
}

// screenshot saves the whole page as name and returns its path; see shot.
func (b *browser) screenshot(name string) string {
	b.t.Helper()
	return b.shot(name, true)
}

// shot saves a PNG of the page (whole, or what the viewport shows) as name
// in $TAILGATE_SCREENSHOTS when set, else in the test's temp dir, and logs
// its path. TAILGATE_ARTIFACTS, when set, gets a copy too.
func (b *browser) shot(name string, whole bool) string {
	b.t.Helper()
	var r struct{ Data string }
	b.call(b.session, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": whole}, &r)
	png, err := base64.StdEncoding.DecodeString(r.Data)
	if err != nil || len(png) == 0 {
		b.t.Fatalf("screenshot: %v (%d bytes)", err, len(png))
	}
	dir := os.Getenv("TAILGATE_SCREENSHOTS")
	if dir == "" {
		dir = b.t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Fatalf("TAILGATE_SCREENSHOTS: %v", err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	if dir := os.Getenv("TAILGATE_ARTIFACTS"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err == nil {
			_ = os.WriteFile(filepath.Join(dir, name), png, 0o644)
		}
	}
	b.t.Logf("screenshot: %s", path)
	return path
}

// ctxDone is a context for calls the test makes beside the browser.
func ctxDone(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}
