package main

import (
	"context"

	"github.com/tailgate-dev/tailgate/bench/load"
	"github.com/tailgate-dev/tailgate/data/pglocal"
)

// benchPostgres starts the throwaway PostgreSQL of `tailgate bench
// --scenario databases` (initdb in a temporary directory, 127.0.0.1 only;
// $TAILGATE_PG_BINDIR or Debian's /usr/lib/postgresql/N/bin) and returns
// an empty database on it. Commits are not synchronous, as on a database
// host with a battery-backed cache: the figures are the round trips, not
// this machine's disk.
func benchPostgres(context.Context) (string, func() error, error) {
	s, err := pglocal.Start(false)
	if err != nil {
		return "", nil, err
	}
	url, err := s.CreateDatabase("bench")
	if err != nil {
		_ = s.Close()
		return "", nil, err
	}
	return url, s.Close, nil
}

var _ load.PostgresFunc = benchPostgres
