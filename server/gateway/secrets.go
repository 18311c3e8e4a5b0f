package gateway

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tailgate-dev/tailgate/policy"
)

// writeSecretFile replaces path with content, mode 0600 whatever the old
// file's mode was: written beside it and renamed over it.
func writeSecretFile(path, content string) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after a successful rename, there is nothing to remove
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// ensureTokens creates DIR/admin.token and DIR/cluster.token (mode 0600) on
// first start and returns their contents.
func ensureTokens(dir string) (admin, cluster string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("--data: %w", err)
	}
	if admin, err = ensureSecretFile(filepath.Join(dir, "admin.token"), "tga-"); err != nil {
		return "", "", err
	}
	if cluster, err = ensureSecretFile(filepath.Join(dir, "cluster.token"), "tgc-"); err != nil {
		return "", "", err
	}
	return admin, cluster, nil
}

// checkPrivate refuses a secret file that users other than its owner may
// read; risk says what they could do with it.
func checkPrivate(path, risk string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%s is readable by other users (mode %04o): %s; run: chmod 600 %s", path, fi.Mode().Perm(), risk, path)
	}
	return nil
}

func ensureSecretFile(path, prefix string) (string, error) {
	raw, err := os.ReadFile(path)
	if err == nil {
		if err := checkPrivate(path, "anyone on this box could take over the gateway"); err != nil {
			return "", err
		}
		tok := strings.TrimSpace(string(raw))
		if tok == "" {
			return "", fmt.Errorf("%s is empty; delete it to have a new token made", path)
		}
		if err := policy.CheckToken(tok, path); err != nil {
			return "", fmt.Errorf("%w, or delete the file to have one made", err)
		}
		return tok, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	b := make([]byte, policy.MinTokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	tok := prefix + hex.EncodeToString(b)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) { // another process made it first
			return ensureSecretFile(path, prefix)
		}
		return "", err
	}
	if _, err := f.WriteString(tok + "\n"); err != nil {
		f.Close()
		return "", err
	}
	return tok, f.Close()
}

// ensureCacheSaltKey creates DIR/cache_salt.key (mode 0600) on first start
// and returns it: the secret each tenant's cache_salt is derived from
// (server.Config.CacheSaltSecret). Gateways that share a database should
// share it too (copy the file), so a tenant's requests share their cache
// through every gateway; a new key only makes engines' caches cold once.
func ensureCacheSaltKey(dir string) ([]byte, error) {
	tok, err := ensureSecretFile(filepath.Join(dir, "cache_salt.key"), "tgs-")
	if err != nil {
		return nil, err
	}
	return []byte(tok), nil
}
