package gateway

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestGatewayTenantSharesAndTrustedNetworksReachTheServer: the per-tenant
// shares and the trusted networks given as flags are the server's; a
// network that does not parse names its flag.
func TestGatewayTenantSharesAndTrustedNetworksReachTheServer(t *testing.T) {
	st, err := resolveGateway(t, "", "--max-body-bytes-per-tenant", "1048576", "--hold-queue-per-tenant", "3",
		"--admit-queue-per-tenant", "5", "--trusted-proxy", "10.0.0.0/8, 192.0.2.7", "--trusted-proxy", "::1",
		"--trust-trace-from", "172.16.0.0/12")
	if err != nil {
		t.Fatal(err)
	}
	s := st.srvCfg
	if s.MaxBodyBytesPerTenant != 1<<20 || s.Hold.PerTenant != 3 || s.Admission.MaxQueuePerTenant != 5 {
		t.Errorf("shares: body %d, hold %d, admission %d", s.MaxBodyBytesPerTenant, s.Hold.PerTenant, s.Admission.MaxQueuePerTenant)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("::1/128")}
	if !reflect.DeepEqual(s.TrustedProxies, want) {
		t.Errorf("trusted proxies %v, want %v", s.TrustedProxies, want)
	}
	if !reflect.DeepEqual(s.TraceFrom, []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")}) {
		t.Errorf("trace from %v", s.TraceFrom)
	}
	if _, err := resolveGateway(t, "", "--trusted-proxy", "edge.example"); err == nil || !strings.Contains(err.Error(), "trusted-proxy") {
		t.Errorf("a host name as a trusted proxy: %v, want an error naming the flag", err)
	}
}

// TestCacheSaltKeyIsMadeOnceAndPrivate: the cache_salt secret is made on
// first start, mode 0600, and the same on the next; one other users may
// read is refused.
func TestCacheSaltKeyIsMadeOnceAndPrivate(t *testing.T) {
	dir := t.TempDir()
	first, err := ensureCacheSaltKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "cache_salt.key")
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("cache_salt.key: %v mode %v, want 0600", err, fi.Mode().Perm())
	}
	again, err := ensureCacheSaltKey(dir)
	if err != nil || string(again) != string(first) || len(first) < 64 {
		t.Fatalf("second start: %q (%v), want the first %q", again, err, first)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ensureCacheSaltKey(dir); err == nil {
		t.Fatal("a cache_salt.key other users may read was taken")
	}
}
