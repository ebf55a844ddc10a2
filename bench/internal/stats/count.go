package stats

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
)

// Requests counts the API requests sent through its RoundTripper by kind:
// GET, LIST, WATCH, PUT, POST, ... Use it as a rest.Config's WrapTransport.
type Requests struct {
	mu sync.Mutex
	n  map[string]int
}

// Wrap returns rt counting into r.
func (r *Requests) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		r.add(kind(req))
		return rt.RoundTrip(req)
	})
}

// Total is the number of requests counted.
func (r *Requests) Total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := 0
	for _, n := range r.n {
		t += n
	}
	return t
}

// String is "GET 3 PUT 30", kinds sorted.
func (r *Requests) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	kinds := make([]string, 0, len(r.n))
	for k := range r.n {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	if len(kinds) == 0 {
		return "none"
	}
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s %d", k, r.n[k])
	}
	return strings.Join(parts, " ")
}

// Reset clears the counts and returns them as String did.
func (r *Requests) Reset() string {
	before := r.String()
	r.mu.Lock()
	r.n = nil
	r.mu.Unlock()
	return before
}

func (r *Requests) add(k string) {
	r.mu.Lock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[k]++
	r.mu.Unlock()
}

func kind(req *http.Request) string {
	switch {
	case req.URL.Query().Get("watch") == "true":
		return "WATCH"
	case req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/leases"):
		return "LIST"
	}
	return req.Method
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
