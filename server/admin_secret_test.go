package server_test

import (
	"net/http"
	"testing"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// TestAdminRefusesASecretInTheURLPath: DELETE /admin/v1/keys/{ref} takes a
// key's id or prefix; its secret in a path would land in access logs, so it
// is refused (400) and the key keeps working.
func TestAdminRefusesASecretInTheURLPath(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	secret := h.Key(policy.KeyOptions{})
	req, _ := http.NewRequest(http.MethodDelete, h.Admin.URL+"/admin/v1/keys/"+secret, nil)
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", resp.StatusCode)
	}
	if _, err := h.Gate.Authenticate(t.Context(), secret); err != nil {
		t.Fatalf("the key stopped working: %v", err)
	}
}
