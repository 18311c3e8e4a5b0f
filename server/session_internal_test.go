package server

import (
	"testing"

	"github.com/tailgate-dev/tailgate/policy"
)

// TestSessionNamesAreScopedToTenantAndModel: two tenants that pick the same
// session name (a user id, "default") are two sessions, and so is one
// tenant's name used with two models; the same tenant, model and name is
// one session, whether the name came in the header or the body.
func TestSessionNamesAreScopedToTenantAndModel(t *testing.T) {
	name := hashString("user-42")
	key := func(tenant, model string, header bool) uint64 {
		cl := &call{principal: &policy.Principal{Tenant: tenant}}
		pr := &parsedRequest{model: model}
		if header {
			cl.session = name
		} else {
			pr.session = name
		}
		return cl.sessionKey(pr)
	}
	acme := key("acme", "m", false)
	switch {
	case acme == 0:
		t.Fatal("a named session has no key")
	case key("globex", "m", false) == acme:
		t.Error("two tenants' sessions of the same name are one session")
	case key("acme", "other", false) == acme:
		t.Error("one session name used with two models is one session")
	case key("acme", "m", true) != acme:
		t.Error("the same session named in the header and in the body are two sessions")
	case key("acme", "m", false) != acme:
		t.Error("the same tenant, model and name gave two keys")
	}
	if (&call{principal: &policy.Principal{Tenant: "acme"}}).sessionKey(&parsedRequest{model: "m"}) != 0 {
		t.Error("a request that names no session has a session key")
	}
}
