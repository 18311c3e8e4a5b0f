package sim

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
)

// ListenUnix opens a listener on a new Unix socket at path that only this
// user may connect to (mode 0600), as an engine a worker starts listens:
// the worker's launcher gives vLLM --uds PATH in a directory only the worker
// can open, so that nothing else on the box reaches the engine, whose API
// key guards only its /v1 paths. Closing the listener removes the socket.
//
// A path that exists is refused, as vLLM's bind refuses it: it may be a
// socket another engine serves.
func ListenUnix(path string) (net.Listener, error) {
	if _, err := os.Lstat(path); err == nil {
		return nil, fmt.Errorf("listen on %s: the path exists (a socket left by an engine that did not shut down?): remove it or choose another path", path)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	// The socket was made with the umask's mode; narrow it at once. Until
	// then its directory is what guards it.
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return ln, nil
}
