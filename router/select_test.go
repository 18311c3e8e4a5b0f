package router

import (
	"strings"
	"testing"
)

func TestParsePolicy(t *testing.T) {
	for _, tc := range []struct {
		name, policy string
		want         string // the Selector's type; "nil" for the default P2C
		err          bool
	}{
		{"p2c is the default (nil)", "p2c", "nil", false},
		{"empty means the default", "", "nil", false},
		{"round-robin is the baseline", "round-robin", "*router.RoundRobin", false},
		{"names are case-sensitive", "P2C", "", true},
		{"an unknown name is an error naming the choices", "random", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sel, err := ParsePolicy(tc.policy)
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), "p2c or round-robin") {
					t.Fatalf("ParsePolicy(%q) err = %v, want one naming p2c and round-robin", tc.policy, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := "nil"
			if sel != nil {
				got = typeName(sel)
			}
			if got != tc.want {
				t.Fatalf("ParsePolicy(%q) = %s, want %s", tc.policy, got, tc.want)
			}
		})
	}
}

func typeName(s Selector) string {
	switch s.(type) {
	case *RoundRobin:
		return "*router.RoundRobin"
	case *P2C:
		return "*router.P2C"
	}
	return "other"
}

func TestNilSelectorIsP2C(t *testing.T) {
	reg := newRegistry(t, Config{})
	if _, ok := reg.sel.(*P2C); !ok {
		t.Fatalf("a nil Config.Selector gave %T, want *P2C", reg.sel)
	}
}
