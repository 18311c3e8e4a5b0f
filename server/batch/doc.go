// Package batch is tailgate's Batch API, OpenAI's subset: upload a JSONL
// file of requests (POST /v1/files, purpose "batch"), start a batch on it
// (POST /v1/batches), follow it (GET /v1/batches/{id}), cancel it, and
// download its output and error files (GET /v1/files/{id}/content) — and
// the executor that runs the batches' lines.
//
// # Overview
//
// [New] takes a [Config] and [Deps]; [Batches.Routes] registers the
// handlers on the public API's /v1 group and [Batches.Run] runs batches
// until its context ends. File bodies live on disk under Config.FilesDir;
// their owners, the batches' state and one row per finished line live in
// the database (package data), so a restarted gateway resumes every
// unfinished batch and runs only the lines without a row. Gateways sharing
// a PostgreSQL database (and a files directory) each run the batches they
// claimed; a dead gateway's batches are taken over once its lease runs out.
//
// The package owns the Batch API's wire format, input validation, the
// executor's scheduling (global and per-tenant concurrency, rate-limit
// waits, bounded retries of upstream failures, cancel, expiry, revoked
// keys) and the result files. It does not generate: every line runs
// through a [Generator] (the gateway's one request pipeline, so a line is
// admitted, routed, hedged and metered like a request to the public API),
// and it does not authenticate or decide which error a failure becomes
// (Deps.Authenticate and Deps.APIError, the gateway's error table). It must
// not import package server, and it never drives an HTTP handler.
package batch
