package gateway

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/tailgate-dev/tailgate/serving/fleet"
)

// FleetConfig is the fleet controller's part of Config: the file's fleet
// key and the --fleet-* flags (a flag given wins over the file).
//
//	fleet:
//	  provider: exec                 # local (tailgate up's child workers) or exec
//	  exec:
//	    start: /etc/tailgate/start-replica
//	    stop: /etc/tailgate/stop-replica
//	    gateway_url: http://tg-gateway:8081
//	  models:
//	    llama-3.1-8b: {min: 0, max: 4, idle_after: 10m, scale_up_inflight: 16}
//
// With no models the controller does not run (`up --fleet-max N` adds its
// --model).
type FleetConfig struct {
	// Provider is where replicas come from: "local" (child workers of this
	// binary, `up` only) or "exec" (the operator's scripts); "" means exec
	// when Exec.Start is set, else local.
	Provider string `yaml:"provider"`
	Exec     struct {
		Start string `yaml:"start"` // --fleet-exec-start: run to start a replica
		Stop  string `yaml:"stop"`  // --fleet-exec-stop: run to stop one
		// GatewayURL is GATEWAY_URL in the scripts' environment, the admin
		// URL a new worker registers at (--gateway); "": the admin
		// listener's address (on the tailnet with --mesh).
		GatewayURL string `yaml:"gateway_url"`
	} `yaml:"exec"`
	Models map[string]fleet.Model `yaml:"models"`
	// Autoscaled are the models an autoscaler outside the gateway (KEDA,
	// an HPA) scales from zero, when no fleet controller runs: requests for
	// them are held while none of their replicas is ready (see
	// fleet.Outside). "*" holds for every model a replica has served.
	// --autoscaled-models.
	Autoscaled []string `yaml:"autoscaled_models"`

	flags struct{ provider, start, stop, gatewayURL string }
}

func (c *FleetConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.flags.provider, "fleet-provider", "", "where the fleet controller gets replicas: local (child workers, up only) or exec (--fleet-exec-start and --fleet-exec-stop scripts; default when a start script is given); fleet.provider in --config")
	fs.StringVar(&c.flags.start, "fleet-exec-start", "", "executable run to start a replica, with MODEL, REPLICA_ID, JOIN_TOKEN, GATEWAY_URL and CLUSTER_TOKEN_FILE in its environment; it returns once the machine is on its way (fleet.exec.start)")
	fs.StringVar(&c.flags.stop, "fleet-exec-stop", "", "executable run to stop a replica, with MODEL, REPLICA_ID and GATEWAY_URL in its environment (fleet.exec.stop)")
	fs.Func("autoscaled-models", "models an autoscaler outside the gateway (KEDA, an HPA) scales from zero, comma-separated: at zero replicas a request for one is held (tailgate_model_waiting_requests rises) instead of answered 503 no_replica; * adds every model a replica has served (fleet.autoscaled_models)",
		func(s string) error {
			c.Autoscaled = nil
			for m := range strings.SplitSeq(s, ",") {
				if m = strings.TrimSpace(m); m != "" {
					c.Autoscaled = append(c.Autoscaled, m)
				}
			}
			return nil
		})
	fs.StringVar(&c.flags.gatewayURL, "fleet-gateway-url", "", "GATEWAY_URL the exec scripts pass a new worker's --gateway (default: the admin listener's address; fleet.exec.gateway_url)")
}

// load puts the flags over the file's keys.
func (c *FleetConfig) load() {
	for _, f := range []struct {
		flag string
		dst  *string
	}{
		{c.flags.provider, &c.Provider}, {c.flags.start, &c.Exec.Start}, {c.flags.stop, &c.Exec.Stop}, {c.flags.gatewayURL, &c.Exec.GatewayURL},
	} {
		if f.flag != "" {
			*f.dst = f.flag
		}
	}
	c.flags = struct{ provider, start, stop, gatewayURL string }{}
	if c.Provider == "" {
		c.Provider = "local"
		if c.Exec.Start != "" {
			c.Provider = "exec"
		}
	}
}

// validate reports the first fleet setting that cannot work.
func (c *FleetConfig) validate() error {
	switch c.Provider {
	case "local", "exec", "":
	default:
		return fmt.Errorf("--fleet-provider (fleet.provider) %q: want local or exec", c.Provider)
	}
	if c.Provider == "exec" {
		for _, s := range []struct{ flag, key, path string }{
			{"--fleet-exec-start", "fleet.exec.start", c.Exec.Start}, {"--fleet-exec-stop", "fleet.exec.stop", c.Exec.Stop},
		} {
			if s.path == "" {
				return fmt.Errorf("--fleet-provider exec needs %s PATH (%s): the script that %s a replica", s.flag, s.key,
					strings.TrimPrefix(s.flag, "--fleet-exec-")+"s")
			}
			fi, err := os.Stat(s.path)
			switch {
			case err != nil:
				return fmt.Errorf("%s (%s) %s: %w", s.flag, s.key, s.path, errors.Unwrap(err))
			case fi.IsDir() || fi.Mode().Perm()&0o111 == 0:
				return fmt.Errorf("%s (%s) %s: not an executable file (chmod +x it)", s.flag, s.key, s.path)
			}
		}
	} else if c.Exec.Start != "" || c.Exec.Stop != "" {
		return fmt.Errorf("--fleet-exec-start and --fleet-exec-stop (fleet.exec) are for --fleet-provider exec, not %s", c.Provider)
	}
	if u := c.Exec.GatewayURL; u != "" {
		if _, _, err := ParseUpstream(u); err != nil {
			return fmt.Errorf("--fleet-gateway-url (fleet.exec.gateway_url) %q: want the admin URL a worker registers at, e.g. http://gateway-host:8081", u)
		}
	}
	if len(c.Autoscaled) > 0 && c.Enabled() {
		return errors.New("--autoscaled-models (fleet.autoscaled_models) is for a gateway whose replicas an outside autoscaler adds; with fleet.models the fleet controller holds the requests itself")
	}
	names := make([]string, 0, len(c.Models))
	for name := range c.Models {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if name == "" {
			return errors.New("fleet.models: a model name is empty")
		}
		m := c.Models[name]
		if m.Min < 0 || m.Max < 0 || (m.Max > 0 && m.Max < m.Min) {
			return fmt.Errorf("fleet.models.%s: min %d, max %d: want 0 <= min <= max", name, m.Min, m.Max)
		}
		if m.ScaleUpWaiting < 0 || m.ScaleUpInflight < 0 || m.IdleAfter < 0 {
			return fmt.Errorf("fleet.models.%s: scale_up_waiting, scale_up_inflight and idle_after must not be negative", name)
		}
	}
	return nil
}

// Enabled reports whether the fleet controller has models to manage.
func (c *FleetConfig) Enabled() bool { return len(c.Models) > 0 }
