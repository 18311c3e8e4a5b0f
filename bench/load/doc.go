// Package load is the engine of `tailgate bench`: a matched-workload load
// generator for OpenAI-compatible endpoints, with phases that kill and add
// replicas, and the report that turns what it saw into per-phase latency
// figures and failover figures.
//
// # Overview
//
// A [Workload] yields request i from a seed alone (prompt and output lengths
// drawn from a [Dist], or replayed from a JSONL file), and [OpenLoop] yields
// the Poisson arrival schedule of a [Plan] (parsed from a --phases list by
// [ParsePhases]), so two runs with the same seed send the same requests at
// the same offsets: matched runs. [Run] sends them — open loop on schedule
// whatever the server does, latencies counted from the intended send time,
// or closed loop with a fixed number of clients — carries out kill and
// scaleout actions through a [Fleet], and polls a tailgate gateway's admin
// API for replica queue depth and for stream stage timings. [Analyze] turns
// the [Result] into a [Report]; a report writes itself as text, JSON and a
// self-contained HTML page, and [Compare] sets two side by side.
//
// [StartLocal] runs a fleet on loopback (a gateway and simulated workers,
// child processes of the tailgate binary) for the built-in [Scenarios];
// [Hooks] act on a fleet the bench did not start, through user commands.
//
// [Main] is the whole command: from [Options] (the command's flags, as
// typed fields whose zero value is the default, checked by
// [Options.Validate]) it runs a scenario or the targets named, once or A
// then B, and prints and writes the reports. Package main only maps flags
// to Options.
//
// The package talks to the product only over HTTP and through its command
// line; it imports no other tailgate package, so it measures what a client
// would see.
package load
