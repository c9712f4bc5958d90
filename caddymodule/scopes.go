package caddymodule

import "sync"

// scopeIndex maps each scope of the provisioned handlers to the pooled
// values (store backends, queues) serving it, so the admin APIs find an
// event's store or queue. Several handlers, and during a reload two
// configs, may register the same scope and value: registrations are
// counted, and a value leaves the scope with its last registration.
type scopeIndex[V comparable] struct {
	mu sync.Mutex
	m  map[string]map[V]int
}

func newScopeIndex[V comparable]() *scopeIndex[V] {
	return &scopeIndex[V]{m: map[string]map[V]int{}}
}

// add registers v for scope.
func (x *scopeIndex[V]) add(scope string, v V) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.m[scope] == nil {
		x.m[scope] = map[V]int{}
	}
	x.m[scope][v]++
}

// remove drops one registration of v for scope.
func (x *scopeIndex[V]) remove(scope string, v V) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if n := x.m[scope][v]; n > 1 {
		x.m[scope][v] = n - 1
		return
	}
	delete(x.m[scope], v)
	if len(x.m[scope]) == 0 {
		delete(x.m, scope)
	}
}

// lookup returns the values of scope by scope; with scope "" every scope's.
func (x *scopeIndex[V]) lookup(scope string) map[string][]V {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[string][]V{}
	for s, vs := range x.m {
		if scope != "" && s != scope {
			continue
		}
		for v := range vs {
			out[s] = append(out[s], v)
		}
	}
	return out
}
