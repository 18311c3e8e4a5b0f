package policy

import (
	"strings"
	"testing"
)

func TestCheckTokenRefusesShortTokens(t *testing.T) {
	for _, tc := range []struct {
		name, tok string
		ok        bool
	}{
		{"five characters", "s3cr1", false},
		{"16 bytes of hex", strings.Repeat("ab", 16), false},
		{"31 bytes of hex", strings.Repeat("ab", 31), false},
		{"openssl rand -hex 32", strings.Repeat("0f", 32), true},
		{"32 bytes in base64 (head -c 32 | base64)", strings.Repeat("Q", 43) + "=", true},
		{"24 bytes in base64", strings.Repeat("Q", 32), false},
		{"made by this gateway", "tga-" + strings.Repeat("3c", 32), true},
		{"made by an earlier gateway (24 bytes)", "tgc-" + strings.Repeat("3c", 24), true},
		{"prefix does not count", "tga-" + strings.Repeat("3c", 30), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckToken(tc.tok, "DIR/admin.token")
			if (err == nil) != tc.ok {
				t.Fatalf("CheckToken(%q) = %v, want ok %v", tc.tok, err, tc.ok)
			}
			if err != nil && (!strings.Contains(err.Error(), "DIR/admin.token") || !strings.Contains(err.Error(), "openssl rand -hex 32")) {
				t.Errorf("error %q does not name the file and how to make a token", err)
			}
			if err != nil && strings.Contains(err.Error(), tc.tok) {
				t.Errorf("error %q holds the token", err)
			}
		})
	}
}
