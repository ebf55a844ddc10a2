package protocol

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Signed calls: every call between the sidecar, the hook and the worker is
// signed with the pod's token, which itself never crosses the wire, and
// carries a timestamp and a nonce, so that a call read off the wire can
// neither be replayed nor altered, and none can be made without the token
// (docs/protocol.md, "Signed calls").
//
// A call carries three headers:
//
//	Handoff-Timestamp: <Unix time in milliseconds, decimal>
//	Handoff-Nonce: <16 to 64 characters of A-Z a-z 0-9 - _; random, new for every call>
//	Authorization: HANDOFF-HMAC-SHA256 <64 lowercase hex digits>
//
// The signature is the HMAC-SHA256, keyed with the token's bytes, of the
// lines (joined by "\n", no final newline)
//
//	HANDOFF-HMAC-SHA256
//	<method, like POST>
//	<request target as sent on the request line, like /handoff/v1/drain?waitMillis=500>
//	<the Handoff-Timestamp value>
//	<the Handoff-Nonce value>
//	<lowercase hex SHA-256 of the body; of no bytes for a call without one>
const (
	// AuthScheme is the Authorization scheme of a signed call.
	AuthScheme = "HANDOFF-HMAC-SHA256"
	// TimestampHeader carries the call's Unix time in milliseconds.
	TimestampHeader = "Handoff-Timestamp"
	// NonceHeader carries the call's nonce.
	NonceHeader = "Handoff-Nonce"
	// MaxClockSkew is how far a call's timestamp may be from the receiver's
	// clock, either way. The sidecar, the hook and the worker share the
	// node's clock, so a genuine call is off by the moment it takes.
	MaxClockSkew = 30 * time.Second
	// MaxNonces bounds the nonces a receiver remembers at once, each for as
	// long as its call's timestamp is acceptable (at most 2 ×
	// MaxClockSkew). Only calls whose signature is good are remembered, so
	// only the token's holders fill it; a genuine sidecar sends a few calls
	// per Lease per retry period.
	MaxNonces = 1 << 16
	// minNonce and maxNonce bound a nonce's length in characters.
	minNonce, maxNonce = 16, 64
	// maxTimestampDigits bounds the Handoff-Timestamp value: Unix
	// milliseconds have 13 digits until the year 2286.
	maxTimestampDigits = 15
)

// Errors of Verifier.Verify, each wrapped with what was wrong.
var (
	// ErrUnsigned: the call lacks a header of a signed call, or one is
	// malformed.
	ErrUnsigned = errors.New("not a signed call")
	// ErrBadSignature: the signature is not the token's for this call.
	ErrBadSignature = errors.New("bad signature")
	// ErrClockSkew: the timestamp is more than MaxClockSkew from the
	// receiver's clock.
	ErrClockSkew = errors.New("timestamp out of range")
	// ErrReplayed: a call with this nonce was accepted before.
	ErrReplayed = errors.New("replayed call")
	// ErrBeforeStart: the call was signed before this receiver started (its
	// Verifier was made), so it was not made to this receiver: a call read
	// off the wire and sent again after the receiver restarted, whose nonce
	// the new process cannot remember. A genuine sender meets it only when
	// its call was in flight across the restart; it signs anew and retries.
	ErrBeforeStart = errors.New("signed before this receiver started")
	// ErrBusy: MaxNonces calls are remembered and none has expired; the
	// caller may retry once one has.
	ErrBusy = errors.New("too many calls to remember")
)

// BodyDigest is the lowercase hex SHA-256 of body, the last line of the
// string a call's signature covers.
func BodyDigest(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// Signature is the lowercase hex HMAC-SHA256 of a call, keyed with token.
// target is the request target as sent (path and query); bodyDigest is
// BodyDigest of the body.
func Signature(token, method, target, timestamp, nonce, bodyDigest string) string {
	mac := hmac.New(sha256.New, []byte(token))
	mac.Write([]byte(AuthScheme + "\n" + method + "\n" + target + "\n" + timestamp + "\n" + nonce + "\n" + bodyDigest))
	return hex.EncodeToString(mac.Sum(nil))
}

// NewNonce returns 32 random hex digits.
func NewNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// Sign makes req a signed call with token, at now, over body (the bytes
// req will send; nil for none). Call it for every send: a retry needs a
// new nonce.
func Sign(req *http.Request, token string, body []byte, now time.Time) {
	ts := strconv.FormatInt(now.UnixMilli(), 10)
	nonce := NewNonce()
	req.Header.Set(TimestampHeader, ts)
	req.Header.Set(NonceHeader, nonce)
	req.Header.Set("Authorization", AuthScheme+" "+Signature(token, req.Method, req.URL.RequestURI(), ts, nonce, BodyDigest(body)))
}

// Verifier checks signed calls for one receiver and remembers their nonces.
// Its methods are safe for concurrent use.
//
// The nonces live in memory only, so a Verifier also refuses every call
// signed before it was made (ErrBeforeStart): a call captured before a
// restart cannot be replayed to the new process, which never saw its
// nonce. The bound is the start itself, not the start less MaxClockSkew:
// the sender and the receiver read the node's one clock, so no genuine
// call to this receiver bears an earlier timestamp, while a replay 15 s
// after a restart would pass a bound that allowed the skew.
type Verifier struct {
	token string
	now   func() time.Time
	// startMillis is the Unix time in milliseconds when the Verifier was
	// made, truncated as a Handoff-Timestamp is, so that a call signed in
	// the same millisecond is not refused.
	startMillis int64

	mu sync.Mutex
	// seen holds the nonces of accepted calls, each until its timestamp
	// leaves the accepted range: a later copy is refused as replayed, and
	// one after that would be refused for its timestamp.
	seen map[string]time.Time
}

// NewVerifier returns a Verifier of calls signed with token (CheckToken's
// form), reading the time from now (time.Now when nil). It refuses calls
// signed before this moment (ErrBeforeStart), so a receiver makes it
// before it opens its listener.
func NewVerifier(token string, now func() time.Time) *Verifier {
	if now == nil {
		now = time.Now
	}
	return &Verifier{token: token, now: now, startMillis: now().UnixMilli(), seen: map[string]time.Time{}}
}

// Started is when v was made, to the millisecond: calls signed before it
// are refused with ErrBeforeStart.
func (v *Verifier) Started() time.Time { return time.UnixMilli(v.startMillis) }

// Verify checks that r, whose body is body (read whole by the caller), is a
// signed call with the Verifier's token, made within MaxClockSkew of now
// and not before the Verifier was made, whose nonce was not accepted
// before; it then remembers the nonce. The error wraps ErrUnsigned,
// ErrBadSignature, ErrClockSkew, ErrBeforeStart, ErrReplayed or ErrBusy
// and says what was wrong, never the token or the signature
// expected. The signature is compared in constant time (crypto/hmac) and
// checked before the timestamp and the nonce, so that only the token's
// holders learn anything from the answer or fill the nonce memory.
func (v *Verifier) Verify(r *http.Request, body []byte) error {
	scheme, sig, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	ts, nonce := r.Header.Get(TimestampHeader), r.Header.Get(NonceHeader)
	switch {
	case r.Header.Get("Authorization") == "":
		return fmt.Errorf("%w: no Authorization header; want %q, %s and %s headers (docs/protocol.md, \"Signed calls\")", ErrUnsigned, AuthScheme+" <signature>", TimestampHeader, NonceHeader)
	case !strings.EqualFold(scheme, AuthScheme):
		return fmt.Errorf("%w: Authorization scheme %.24q; want %s (a bearer token is no longer accepted: the token never crosses the wire)", ErrUnsigned, scheme, AuthScheme)
	case len(sig) != 2*sha256.Size:
		return fmt.Errorf("%w: the signature has %d characters; want 64 lowercase hex digits", ErrUnsigned, len(sig))
	case !validTimestamp(ts):
		return fmt.Errorf("%w: %s %.24q; want the Unix time in milliseconds, a whole number of at most %d digits", ErrUnsigned, TimestampHeader, ts, maxTimestampDigits)
	case !validNonce(nonce):
		return fmt.Errorf("%w: %s %.72q; want %d to %d characters of A-Z, a-z, 0-9, - and _", ErrUnsigned, NonceHeader, nonce, minNonce, maxNonce)
	}
	want := Signature(v.token, r.Method, r.RequestURI, ts, nonce, BodyDigest(body))
	if !hmac.Equal([]byte(strings.ToLower(sig)), []byte(want)) {
		return fmt.Errorf("%w: the signature is not the pod's token's over this method, target, timestamp, nonce and body", ErrBadSignature)
	}
	ms, _ := strconv.ParseInt(ts, 10, 64) // validTimestamp: at most 15 digits
	at := time.UnixMilli(ms)
	now := v.now()
	if d := now.Sub(at); d > MaxClockSkew || d < -MaxClockSkew {
		return fmt.Errorf("%w: %s is %s from this process's clock; want at most %s either way", ErrClockSkew, TimestampHeader, d.Round(time.Millisecond), MaxClockSkew)
	}
	if ms < v.startMillis {
		return fmt.Errorf("%w: %s %d is %s before this receiver started (%d); a call made before a restart is not accepted after it: sign it anew and retry", ErrBeforeStart, TimestampHeader, ms, time.Duration(v.startMillis-ms)*time.Millisecond, v.startMillis)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.seen[nonce]; ok {
		return fmt.Errorf("%w: %s %s was accepted before; want a new nonce for every call", ErrReplayed, NonceHeader, nonce)
	}
	if len(v.seen) >= MaxNonces {
		for n, until := range v.seen {
			if now.After(until) {
				delete(v.seen, n)
			}
		}
		if len(v.seen) >= MaxNonces {
			return fmt.Errorf("%w: %d calls in the last %s", ErrBusy, MaxNonces, 2*MaxClockSkew)
		}
	}
	v.seen[nonce] = at.Add(MaxClockSkew)
	return nil
}

func validTimestamp(ts string) bool {
	if ts == "" || len(ts) > maxTimestampDigits {
		return false
	}
	for i := 0; i < len(ts); i++ {
		if ts[i] < '0' || ts[i] > '9' {
			return false
		}
	}
	return true
}

func validNonce(n string) bool {
	if len(n) < minNonce || len(n) > maxNonce {
		return false
	}
	for i := 0; i < len(n); i++ {
		switch c := n[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// Refuse answers a call Verify refused: 503 with Retry-After for ErrBusy,
// else 401 with a WWW-Authenticate challenge; the body is {"error": "..."}
// with err's text. The sidecar's control API and package worker's app API
// answer every refused call so.
func Refuse(w http.ResponseWriter, err error) {
	code := http.StatusUnauthorized
	if errors.Is(err, ErrBusy) {
		code = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
	} else {
		w.Header().Set("WWW-Authenticate", AuthScheme+` realm="handoff"`)
	}
	writeError(w, code, err.Error())
}

// Signed serves h only the calls v verifies. It reads a call's body first,
// at most maxBody bytes (a larger one is answered 413 and the connection
// closed; one that cannot be read, 400), verifies the call with that body
// (a refused one is answered by Refuse), and passes it on with the body
// restored. A nil v verifies nothing (an app made for local development
// without a token) but still bounds the body.
func Signed(v *Verifier, maxBody int64, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if err != nil || int64(len(body)) > maxBody {
			code, msg := http.StatusRequestEntityTooLarge, fmt.Sprintf("body: larger than %d bytes; want at most %d bytes of JSON", maxBody, maxBody)
			if err != nil {
				code, msg = http.StatusBadRequest, fmt.Sprintf("body: %v; want at most %d bytes of JSON, sent at once", err, maxBody)
			}
			w.Header().Set("Connection", "close")
			writeError(w, code, msg)
			return
		}
		if v != nil {
			if err := v.Verify(r, body); err != nil {
				Refuse(w, fmt.Errorf("%w (the pod's token is the file named by %s)", err, TokenFileEnv))
				return
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	})
}

// writeError answers {"error": msg} with code, in one write.
func writeError(w http.ResponseWriter, code int, msg string) {
	body, _ := json.Marshal(map[string]string{"error": msg})
	body = append(body, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
