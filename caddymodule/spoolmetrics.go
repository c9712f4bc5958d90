package caddymodule

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/spool"
)

// Spool metrics, on Caddy's registry next to the handler's. The gauges and
// the *_total counters of a spool are read from it at scrape time, labelled
// by its directory; the counters count since the spool was opened (a config
// reload keeps it open, a restart starts them again).
//
//	caddy_webhook_idempotency_spool_records{spool}              deliveries waiting to be claimed and forwarded
//	caddy_webhook_idempotency_spool_bytes{spool}                their bytes (what spool_max bounds)
//	caddy_webhook_idempotency_spool_max_bytes{spool}            spool_max
//	caddy_webhook_idempotency_spool_disk_bytes{spool}           the spool's files, settled records not yet deleted included
//	caddy_webhook_idempotency_spool_oldest_age_seconds{spool}   age of the oldest waiting delivery; 0 when none
//	caddy_webhook_idempotency_spool_waiting{spool}              waiting deliveries tried at least once (claim held elsewhere, upstream refused)
//	caddy_webhook_idempotency_spool_dead{spool}                 deliveries set aside after refusals (kept, not tried): retry or drop them
//	caddy_webhook_idempotency_spool_store_down{spool}           1 while deliveries pause because the store was unreachable
//	caddy_webhook_idempotency_spool_appended_total{spool}       deliveries written to the spool
//	caddy_webhook_idempotency_spool_settled_total{spool,outcome}  forwarded (upstream 2xx), duplicate (completed meanwhile) or dropped (dead, by an operator)
//	caddy_webhook_idempotency_spool_full_total{spool}           deliveries refused 503 because the spool was full
//	caddy_webhook_idempotency_spool_torn_total{spool}           torn records dropped when the spool was opened (never acknowledged)
//	caddy_webhook_idempotency_spool_tries_total{scope,outcome}  tries of spooled deliveries: forwarded, duplicate, wait, refused, unavailable
var spoolMetrics = struct {
	once  sync.Once
	tries *prometheus.CounterVec
}{}

// initSpoolMetrics creates the spool collectors once and registers them.
func initSpoolMetrics(reg *prometheus.Registry) error {
	spoolMetrics.once.Do(func() {
		spoolMetrics.tries = newCounterVec("spool_tries_total",
			"Tries of spooled deliveries by this instance, by outcome: forwarded, duplicate, wait, refused, unavailable.",
			"scope", "outcome")
	})
	return register(reg, spoolMetrics.tries, spoolCollector{})
}

// spoolCollector reads every open spool's Stats at scrape time.
type spoolCollector struct{}

func spoolDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(ns, sub, name), help, append([]string{"spool"}, labels...), nil)
}

var spoolDescs = struct {
	records, bytes, maxBytes, diskBytes, oldest, waiting, dead, storeDown *prometheus.Desc
	appended, settled, full, torn                                         *prometheus.Desc
}{
	records:   spoolDesc("spool_records", "Deliveries waiting in the spool to be claimed and forwarded."),
	bytes:     spoolDesc("spool_bytes", "Bytes of the deliveries waiting in the spool (what spool_max bounds)."),
	maxBytes:  spoolDesc("spool_max_bytes", "The spool's bound (spool_max), in bytes."),
	diskBytes: spoolDesc("spool_disk_bytes", "Bytes of the spool's files, settled records not yet deleted with their segment included."),
	oldest:    spoolDesc("spool_oldest_age_seconds", "Age of the oldest delivery waiting in the spool, in seconds; 0 when none."),
	waiting:   spoolDesc("spool_waiting", "Spooled deliveries tried at least once and waiting to be tried again."),
	dead:      spoolDesc("spool_dead", "Spooled deliveries set aside after the upstream refused them for 72h: kept, no longer tried; retry or drop them through the admin API."),
	storeDown: spoolDesc("spool_store_down", "1 while the spool's deliveries pause because the store was unreachable at the last try."),
	appended:  spoolDesc("spool_appended_total", "Deliveries written to the spool since it was opened."),
	settled:   spoolDesc("spool_settled_total", "Spooled deliveries settled since the spool was opened: forwarded (upstream 2xx), duplicate, or dropped (dead, by an operator).", "outcome"),
	full:      spoolDesc("spool_full_total", "Deliveries answered 503 because the spool was full, since it was opened."),
	torn:      spoolDesc("spool_torn_total", "Torn records (never acknowledged) dropped when the spool was opened."),
}

func (spoolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{spoolDescs.records, spoolDescs.bytes, spoolDescs.maxBytes,
		spoolDescs.diskBytes, spoolDescs.oldest, spoolDescs.waiting, spoolDescs.dead, spoolDescs.storeDown, spoolDescs.appended,
		spoolDescs.settled, spoolDescs.full, spoolDescs.torn} {
		ch <- d
	}
}

func (spoolCollector) Collect(ch chan<- prometheus.Metric) {
	openSpools.Range(func(k, v any) bool {
		dir, st := k.(string), v.(*pooledSpool).Stats()
		gauge := func(d *prometheus.Desc, x float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, x, dir)
		}
		counter := func(d *prometheus.Desc, x uint64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(x), append([]string{dir}, labels...)...)
		}
		gauge(spoolDescs.records, float64(st.Records))
		gauge(spoolDescs.bytes, float64(st.Bytes))
		gauge(spoolDescs.maxBytes, float64(st.MaxBytes))
		gauge(spoolDescs.diskBytes, float64(st.DiskBytes))
		gauge(spoolDescs.oldest, oldestAge(st).Seconds())
		gauge(spoolDescs.waiting, float64(st.Waiting))
		gauge(spoolDescs.dead, float64(st.Dead))
		down := 0.0
		if st.StoreDown {
			down = 1
		}
		gauge(spoolDescs.storeDown, down)
		counter(spoolDescs.appended, st.Counts.Spooled)
		counter(spoolDescs.settled, st.Counts.Forwarded, "forwarded")
		counter(spoolDescs.settled, st.Counts.Duplicates, "duplicate")
		counter(spoolDescs.settled, st.Counts.Dropped, "dropped")
		counter(spoolDescs.full, st.Counts.Full)
		counter(spoolDescs.torn, st.Counts.Torn)
		return true
	})
}

// oldestAge is the age of the oldest waiting delivery, 0 when none.
func oldestAge(st spool.Stats) time.Duration {
	if st.Oldest.IsZero() {
		return 0
	}
	return max(time.Since(st.Oldest), 0)
}
