package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tailgate-dev/tailgate/router"
)

// kvCacheDesc is each replica's engine KV-cache use as its worker last
// reported it. It belongs beside the router's other per-replica gauges
// (router/metrics.go) and lives here only until it moves there.
var kvCacheDesc = prometheus.NewDesc("tailgate_replica_kv_cache_usage_ratio",
	"Share of the replica engine's KV cache in use (0..1), from its last heartbeat; 0 for static upstreams.", []string{"replica"}, nil)

type kvCacheCollector struct{ reg *router.Registry }

// Describe implements prometheus.Collector.
func (c kvCacheCollector) Describe(ch chan<- *prometheus.Desc) { ch <- kvCacheDesc }

// Collect implements prometheus.Collector.
func (c kvCacheCollector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range c.reg.Replicas() {
		ch <- prometheus.MustNewConstMetric(kvCacheDesc, prometheus.GaugeValue, r.Load().KVCacheUsage, r.ID)
	}
}
