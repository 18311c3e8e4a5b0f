package gateway

import (
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/server"
)

// The admin API's JSON views, for the commands that print the same shapes
// from the database while no gateway runs (`tailgate keys list --json`,
// `tailgate tenants`, `tailgate usage`): one shape, defined by the server.
type (
	KeyView    = server.KeyView
	TenantView = server.TenantView
	UsageView  = server.UsageView
)

// ViewKey is a key as the admin API shows it at now.
func ViewKey(k data.Key, now time.Time) KeyView { return server.ViewKey(k, now) }

// ViewTenant is a tenant as the admin API shows it; reserved is nil where
// only a running gateway knows it.
func ViewTenant(t data.Tenant, spent data.Spend, reserved *data.Spend) TenantView {
	return server.ViewTenant(t, spent, reserved)
}

// UsageJSON is usage rows as the admin API shows them.
func UsageJSON(rows []data.UsageRow) []UsageView { return server.UsageJSON(rows) }
