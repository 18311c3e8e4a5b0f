package data

import (
	"context"
	"fmt"
	"strings"
)

// RequestFilter selects ledger rows for the admin API's request log. Empty
// fields (0 for Status) match everything.
type RequestFilter struct {
	Tenant  string
	KeyID   string
	Model   string
	Replica string // the upstream that answered
	Status  int
	ID      string // one request id
	Limit   int    // at most this many rows; <= 0 means DefaultRecentLimit
}

// FindRequests returns the ledger rows f selects, newest first, with the
// tenant name and every attempt of each request filled.
func (s *Store) FindRequests(ctx context.Context, f RequestFilter) ([]LedgerRow, error) {
	if f.Limit <= 0 {
		f.Limit = DefaultRecentLimit
	}
	where, args := UsageFilter{Tenant: f.Tenant}.where()
	conds := []string{}
	if where != "" {
		conds = append(conds, strings.TrimPrefix(where, " WHERE "))
	}
	for _, c := range []struct {
		col string
		v   any
		set bool
	}{
		{"l.id", f.ID, f.ID != ""}, {"l.key_id", f.KeyID, f.KeyID != ""}, {"l.model", f.Model, f.Model != ""},
		{"l.upstream", f.Replica, f.Replica != ""}, {"l.status", f.Status, f.Status != 0},
	} {
		if c.set {
			conds = append(conds, c.col+" = ?")
			args = append(args, c.v)
		}
	}
	q := ledgerSelect
	if len(conds) > 0 {
		q += " WHERE " + strings.Join(conds, " AND ")
	}
	out, err := s.queryLedger(ctx, q+` ORDER BY l.ts DESC, l.rowid DESC LIMIT ?`, append(args, f.Limit)...)
	if err == nil {
		err = s.fillAttempts(ctx, out)
	}
	if err != nil {
		return nil, fmt.Errorf("find requests: %w", err)
	}
	return out, nil
}
