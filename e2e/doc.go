// Package e2e holds the end-to-end tests: they build the tailgate binary once
// (TestMain) and run its commands as a user would, as child processes on
// loopback, against real SQLite files, PostgreSQL and the simulated engine.
package e2e
