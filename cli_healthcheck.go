package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

const healthcheckSynopsis = `healthcheck [--url URL | --admin HOST:PORT] [--alive] [--cluster-token-file F] [--timeout DUR]

Exits 0 when the endpoint answers healthy, 1 otherwise (one line on stderr says why): for
a container's HEALTHCHECK or a Kubernetes exec probe, where there is no curl.
  tailgate healthcheck                          the gateway's /healthz (a replica is ready)
  tailgate healthcheck --admin 127.0.0.1:8081   the gateway's /readyz (takes registrations and traffic)
  tailgate healthcheck --url http://127.0.0.1:9000/health   a worker's sidecar (cluster token from
                                                $TAILGATE_CLUSTER_TOKEN or --cluster-token-file)`

// cmdHealthcheck asks one health endpoint and exits 0 for a 2xx answer;
// with --alive, for any answer that shows the process is up (a worker whose
// engine still loads answers 503).
func cmdHealthcheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("healthcheck", healthcheckSynopsis, stderr)
	target := fs.String("url", "http://127.0.0.1:8080/healthz", "URL to ask")
	admin := fs.String("admin", "", "the gateway's admin listener HOST:PORT: ask its /readyz instead of --url")
	alive := fs.Bool("alive", false, "healthy when the process answers at all (e.g. 503 while a worker's engine loads); only a missing answer, 401, 403 or 404 fail")
	token := fs.String("cluster-token", "", "bearer token to send (default: $TAILGATE_CLUSTER_TOKEN unless --cluster-token-file is given); a worker's sidecar needs it")
	tokenFile := fs.String("cluster-token-file", "", "file holding the bearer token to send")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := secretsFromEnv(fs, os.Getenv); err != nil {
		return err
	}
	if *admin != "" {
		if flagGiven(fs, "url") {
			fmt.Fprintln(stderr, "tailgate healthcheck: give --url or --admin, not both")
			return errUsage
		}
		*target = "http://" + strings.TrimPrefix(*admin, "http://") + "/readyz"
	}
	u, err := url.Parse(*target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		fmt.Fprintf(stderr, "tailgate healthcheck: --url %q: want an http URL such as http://127.0.0.1:8080/healthz\n", *target)
		return errUsage
	}
	if *tokenFile != "" {
		raw, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("--cluster-token-file: %w", err)
		}
		*token = strings.TrimSpace(string(raw))
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	if *token != "" {
		req.Header.Set("Authorization", "Bearer "+*token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("unhealthy: %s: no answer within %v", u, *timeout)
		}
		return fmt.Errorf("unhealthy: %s: %w", u, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	what := strings.TrimSpace(string(body))
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		fmt.Fprintf(stdout, "healthy: %s: %d %s\n", u, code, what)
		return nil
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return fmt.Errorf("unhealthy: %s: %d: the endpoint wants a token (--cluster-token-file, $TAILGATE_CLUSTER_TOKEN)", u, code)
	case code == http.StatusNotFound:
		return fmt.Errorf("unhealthy: %s: 404: no health endpoint at this path", u)
	case *alive:
		fmt.Fprintf(stdout, "alive: %s: %d %s\n", u, code, what)
		return nil
	default:
		return fmt.Errorf("unhealthy: %s: %d %s", u, code, what)
	}
}
