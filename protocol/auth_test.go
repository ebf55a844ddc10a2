package protocol_test

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/protocol"
)

// signed is a request as a client makes it, as a server receives it.
func signed(t *testing.T, method, target string, body []byte, tok string, at time.Time) *http.Request {
	t.Helper()
	out := httptest.NewRequest(method, "http://localhost"+target, bytes.NewReader(body))
	protocol.Sign(out, tok, body, at)
	in := httptest.NewRequest(method, target, bytes.NewReader(body))
	in.Header = out.Header.Clone()
	return in
}

// The signature is HMAC-SHA256 over the documented lines, so that an app in
// any language can check it: this vector is in docs/protocol.md, computed
// there with Python's hmac and hashlib.
func TestSignatureVector(t *testing.T) {
	got := protocol.Signature(token, "PUT", "/handoff/v1/leases/orders", "1767225600000", "0123456789abcdef0123456789abcdef",
		protocol.BodyDigest([]byte(`{"lease":"orders","leader":false,"sequence":1}`)))
	const want = "a0f1c8d2ed8f4e07198cb8d99f3dab235a5951df319652a0efa706b242fa2a7e" // Python's hmac module, from the documented lines
	if got != want {
		t.Errorf("Signature = %s, want %s (the vector in docs/protocol.md)", got, want)
	}
	if d := protocol.BodyDigest(nil); d != "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Errorf("BodyDigest(nil) = %s, want SHA-256 of no bytes", d)
	}
}

func TestVerify(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	body := []byte(`{"cancel":true}`)
	// A receiver that started an hour ago.
	v := func() *protocol.Verifier {
		clock := now.Add(-time.Hour)
		v := protocol.NewVerifier(token, func() time.Time { return clock })
		clock = now
		return v
	}
	other := strings.Repeat("f", 64)
	for _, tc := range []struct {
		name string
		req  func() *http.Request
		want error
	}{
		{"signed", func() *http.Request { return signed(t, "POST", "/handoff/v1/return", body, token, now) }, nil},
		{"a second old", func() *http.Request {
			return signed(t, "POST", "/handoff/v1/return", body, token, now.Add(-time.Second))
		}, nil},
		{"no header", func() *http.Request { return httptest.NewRequest("POST", "/handoff/v1/return", nil) }, protocol.ErrUnsigned},
		{"bearer token", func() *http.Request {
			r := httptest.NewRequest("POST", "/handoff/v1/return", nil)
			r.Header.Set("Authorization", "Bearer "+token)
			return r
		}, protocol.ErrUnsigned},
		{"another token", func() *http.Request { return signed(t, "POST", "/handoff/v1/return", body, other, now) }, protocol.ErrBadSignature},
		{"another body", func() *http.Request {
			r := signed(t, "POST", "/handoff/v1/return", body, token, now)
			r.Body = http.NoBody
			return r
		}, protocol.ErrBadSignature},
		{"another path", func() *http.Request {
			r := signed(t, "POST", "/handoff/v1/return", body, token, now)
			r.RequestURI = "/handoff/v1/stop-claiming"
			return r
		}, protocol.ErrBadSignature},
		{"another query", func() *http.Request {
			r := signed(t, "GET", "/handoff/v1/drain?waitMillis=0", nil, token, now)
			r.RequestURI = "/handoff/v1/drain?waitMillis=30000"
			return r
		}, protocol.ErrBadSignature},
		{"another method", func() *http.Request {
			r := signed(t, "POST", "/handoff/v1/return", body, token, now)
			r.Method = "PUT"
			return r
		}, protocol.ErrBadSignature},
		{"a later timestamp than signed", func() *http.Request {
			r := signed(t, "POST", "/handoff/v1/return", body, token, now.Add(-time.Minute))
			r.Header.Set(protocol.TimestampHeader, strconv.FormatInt(now.UnixMilli(), 10))
			return r
		}, protocol.ErrBadSignature},
		{"a minute old", func() *http.Request {
			return signed(t, "POST", "/handoff/v1/return", body, token, now.Add(-time.Minute))
		}, protocol.ErrClockSkew},
		{"a minute ahead", func() *http.Request {
			return signed(t, "POST", "/handoff/v1/return", body, token, now.Add(time.Minute))
		}, protocol.ErrClockSkew},
		{"short nonce", func() *http.Request {
			r := signed(t, "POST", "/handoff/v1/return", body, token, now)
			r.Header.Set(protocol.NonceHeader, "abc")
			return r
		}, protocol.ErrUnsigned},
		{"timestamp not a number", func() *http.Request {
			r := signed(t, "POST", "/handoff/v1/return", body, token, now)
			r.Header.Set(protocol.TimestampHeader, "-1")
			return r
		}, protocol.ErrUnsigned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.req()
			b := new(bytes.Buffer)
			_, _ = b.ReadFrom(r.Body)
			err := v().Verify(r, b.Bytes())
			if !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), token) {
				t.Errorf("the error %q tells the token", err)
			}
		})
	}
}

// A call read off the wire and sent again is refused, however soon; a
// signed call with a new nonce is not.
func TestVerifyRefusesAReplay(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	v := protocol.NewVerifier(token, func() time.Time { return now })
	r := signed(t, "POST", "/v1/prestop", nil, token, now)
	if err := v.Verify(r, nil); err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(r, nil); !errors.Is(err, protocol.ErrReplayed) {
		t.Fatalf("the same call again: %v, want ErrReplayed", err)
	}
	// Until its timestamp is too old, then for that.
	now = now.Add(protocol.MaxClockSkew + time.Millisecond)
	if err := v.Verify(r, nil); !errors.Is(err, protocol.ErrClockSkew) {
		t.Fatalf("the same call past the skew: %v, want ErrClockSkew", err)
	}
	if err := v.Verify(signed(t, "POST", "/v1/prestop", nil, token, now), nil); err != nil {
		t.Fatalf("a new call: %v", err)
	}
}

// The nonce memory is bounded: past MaxNonces unexpired nonces a call is
// refused busy (503), and expired ones make room.
func TestVerifyNonceMemoryIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("signs 65,537 calls")
	}
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	v := protocol.NewVerifier(token, func() time.Time { return now })
	for i := range protocol.MaxNonces {
		if err := v.Verify(signed(t, "GET", "/v1/status", nil, token, now), nil); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	err := v.Verify(signed(t, "GET", "/v1/status", nil, token, now), nil)
	if !errors.Is(err, protocol.ErrBusy) {
		t.Fatalf("call past MaxNonces: %v, want ErrBusy", err)
	}
	w := httptest.NewRecorder()
	protocol.Refuse(w, err)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Errorf("Refuse(ErrBusy): %d, Retry-After %q; want 503 with Retry-After", w.Code, w.Header().Get("Retry-After"))
	}
	now = now.Add(protocol.MaxClockSkew + time.Millisecond)
	if err := v.Verify(signed(t, "GET", "/v1/status", nil, token, now), nil); err != nil {
		t.Fatalf("once the first calls expired: %v", err)
	}
}

func TestRefuseUnauthorized(t *testing.T) {
	w := httptest.NewRecorder()
	protocol.Refuse(w, protocol.ErrBadSignature)
	if w.Code != http.StatusUnauthorized || !strings.HasPrefix(w.Header().Get("WWW-Authenticate"), protocol.AuthScheme) ||
		!strings.Contains(w.Body.String(), `"error":"bad signature"`) {
		t.Errorf("Refuse: %d %q %s; want 401, a %s challenge and the error", w.Code, w.Header().Get("WWW-Authenticate"), w.Body, protocol.AuthScheme)
	}
}
