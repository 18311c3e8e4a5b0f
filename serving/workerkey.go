package serving

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// HeaderWorkerKey carries a worker's key on its heartbeats while it has no
// credential. An operator's approval binds the key's [ApprovalCode] (the
// worker prints it while it waits): only the worker holding the key is
// admitted, not any holder of the cluster token asking under the same
// replica id.
const HeaderWorkerKey = "X-Tailgate-Worker-Key"

// ApprovalCode is a worker key's fingerprint as an operator types it:
// 60 bits of its SHA-256 in base32, as XXXX-XXXX-XXXX.
func ApprovalCode(key string) string {
	if key == "" {
		return ""
	}
	h := sha256.Sum256([]byte(key))
	s := base32.StdEncoding.EncodeToString(h[:8])[:12]
	return s[:4] + "-" + s[4:8] + "-" + s[8:]
}

// NormalizeApprovalCode accepts a code typed with or without dashes, in
// either case.
func NormalizeApprovalCode(code string) string {
	c := strings.ToUpper(strings.NewReplacer("-", "", " ", "").Replace(code))
	if len(c) != 12 {
		return c
	}
	return c[:4] + "-" + c[4:8] + "-" + c[8:]
}

// LoadWorkerKey returns the worker key kept in path, making one (mode
// 0600) if there is none, so a restarted worker keeps its approval code.
func LoadWorkerKey(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		if k := strings.TrimSpace(string(b)); k != "" {
			return k, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("worker key: %w", err)
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	k := "tgk_" + hex.EncodeToString(b[:])
	if err := os.WriteFile(path, []byte(k+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("worker key: %w", err)
	}
	return k, nil
}
