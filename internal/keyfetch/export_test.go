package keyfetch

import "time"

// SetClock replaces f's clock, for the cache-lifetime tests.
func SetClock(f *Fetcher, now func() time.Time) { f.now = now }
