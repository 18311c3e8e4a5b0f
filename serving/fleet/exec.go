package fleet

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Exec is a provider that runs an operator's scripts: Start runs StartCmd,
// Stop runs StopCmd, each with the environment
//
//	MODEL        the model to serve
//	REPLICA_ID   the replica id the worker must register as (--replica-id)
//	JOIN_TOKEN   a worker join token (--join-token), when JoinToken is set
//	GATEWAY_URL  the gateway's admin URL the worker registers at (--gateway)
//	CLUSTER_TOKEN_FILE  the gateway's cluster token file, when ClusterTokenFile
//	             is set (start only; copy the token to the machine as the
//	             worker's --cluster-token-file)
//
// on top of the gateway's own. A script that exits non-zero failed (its
// last output line says why); it is killed at the action's deadline. A
// start script must return once the machine is on its way (the worker
// registers by itself), e.g. after `runpodctl create pod …`.
type Exec struct {
	StartCmd, StopCmd []string
	GatewayURL        string
	ClusterTokenFile  string
	// JoinToken returns a join token for a new worker; nil: none is passed.
	JoinToken func(ctx context.Context, id string) (string, error)
}

// Name says the provider's kind in the fleet's status.
func (e *Exec) Name() string { return "exec" }

func (e *Exec) Start(ctx context.Context, model, id string) error {
	return e.run(ctx, e.StartCmd, model, id, true)
}

func (e *Exec) Stop(ctx context.Context, model, id string) error {
	return e.run(ctx, e.StopCmd, model, id, false)
}

func (e *Exec) run(ctx context.Context, argv []string, model, id string, join bool) error {
	if len(argv) == 0 {
		return nil
	}
	env := append(os.Environ(), "MODEL="+model, "REPLICA_ID="+id, "GATEWAY_URL="+e.GatewayURL)
	if join && e.JoinToken != nil {
		tok, err := e.JoinToken(ctx, id)
		if err != nil {
			return fmt.Errorf("join token: %w", err)
		}
		env = append(env, "JOIN_TOKEN="+tok)
	}
	if join && e.ClusterTokenFile != "" {
		env = append(env, "CLUSTER_TOKEN_FILE="+e.ClusterTokenFile)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		last := strings.TrimSpace(out.String())
		if i := strings.LastIndexByte(last, '\n'); i >= 0 {
			last = last[i+1:]
		}
		return fmt.Errorf("%s: %w: %s", argv[0], err, last)
	}
	return nil
}
