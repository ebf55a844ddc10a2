package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/handoff-dev/handoff/protocol"
)

// Signers of refused calls, for the auth cases.

// unsigned sends the Authorization value authz (none when ""), and no
// timestamp or nonce.
func unsigned(authz string) signer {
	return func(req *http.Request, _ []byte) {
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
	}
}

// signedWith signs with token at the time at.
func signedWith(token string, at time.Time) signer {
	return func(req *http.Request, body []byte) { protocol.Sign(req, token, body, at) }
}

// thenAltered signs as the sidecar does, then changes the call: what the
// signature covers no longer matches.
func (s *suite) thenAltered(alter func(req *http.Request)) signer {
	return func(req *http.Request, body []byte) {
		protocol.Sign(req, s.t.Token, body, time.Now())
		alter(req)
	}
}

// otherToken is a token of the same length that is not the pod's.
func (s *suite) otherToken() string {
	wrong := strings.Repeat("0", len(s.t.Token))
	if wrong == s.t.Token {
		wrong = strings.Repeat("1", len(s.t.Token))
	}
	return wrong
}

// refusal is a way of signing a call that the app must refuse: what says
// how, in a failure's reason.
type refusal struct {
	what string
	sign signer
}

// refusedCalls sends each state-changing call (stop-claiming, return, a
// grant and a revoke carrying a later sequence) and the drain status once
// with each signer, wants every one refused 401 with a JSON error (that
// begins with says, when says is set) and a HANDOFF-HMAC-SHA256
// challenge, and then checks that none was acted on: the app is not
// stopping, and a grant with the next sequence is applied (it would be
// stale had a refused message been recorded). It returns how many calls
// were refused.
func (s *suite) refusedCalls(ctx context.Context, lease, says string, signers []refusal) (int, error) {
	refusedSeq := time.Now().Add(500 * time.Millisecond).UnixNano()
	calls := []struct{ method, path, body string }{
		{http.MethodPost, protocol.StopClaimingPath, "{}"},
		{http.MethodGet, protocol.DrainPath + "?waitMillis=0", ""},
		{http.MethodPost, protocol.ReturnPath, `{"cancel": false}`},
		{http.MethodPut, protocol.LeasePathPrefix + lease, grantBody(lease, refusedSeq, s.term, time.Now().Add(s.term))},
		{http.MethodPut, protocol.LeasePathPrefix + lease, revokeBody(lease, refusedSeq)},
	}
	n := 0
	for _, c := range calls {
		for _, sg := range signers {
			a, err := s.call(ctx, c.method, c.path, c.body, sg.sign, 0)
			if err != nil {
				return n, err
			}
			what := fmt.Sprintf("%s %s %s", c.method, c.path, sg.what)
			if err := wantError(what, a, http.StatusUnauthorized); err != nil {
				return n, err
			}
			if ch := a.header.Get("WWW-Authenticate"); !strings.HasPrefix(strings.ToUpper(ch), protocol.AuthScheme) {
				return n, fmt.Errorf("%s: WWW-Authenticate %q, want a %s challenge", what, ch, protocol.AuthScheme)
			}
			if says != "" {
				var e struct {
					Error string `json:"error"`
				}
				if json.Unmarshal(a.body, &e) != nil || !strings.HasPrefix(e.Error, says) {
					return n, fmt.Errorf("%s = %s: want an error that begins %q", what, a, says)
				}
			}
			n++
		}
	}
	st, err := s.status(ctx)
	if err != nil {
		return n, err
	}
	if st.Stopping {
		return n, fmt.Errorf("after stop-claiming calls refused 401 the app says stopping: a refused call was acted on")
	}
	// The refused messages carried a later sequence (within
	// protocol.MaxSequenceAhead): had one been recorded, this grant would
	// be stale.
	if err := s.grant(ctx, lease, s.next()); err != nil {
		return n, fmt.Errorf("after leadership calls refused 401: %w (a refused call was acted on)", err)
	}
	return n, s.revoke(ctx, lease, s.next())
}

// authUnsigned: a call that is not signed (no Authorization header, the
// pod's token as a bearer token, another scheme) is refused 401 and acted
// on by none.
func (s *suite) authUnsigned(ctx context.Context) (string, error) {
	n, err := s.refusedCalls(ctx, s.lease("unsigned"), "", []refusal{
		{"with no Authorization header", unsigned("")},
		{"with the token as a bearer token", unsigned("Bearer " + s.t.Token)},
		{"with another scheme", unsigned("Basic " + s.t.Token)},
		{"with the scheme and no timestamp or nonce", unsigned(protocol.AuthScheme + " " + strings.Repeat("0", 64))},
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d unsigned calls answered 401 with a %s challenge and acted on by none", n, protocol.AuthScheme), nil
}

// authBadSignature: a call signed with another token, or changed after it
// was signed (its body, its query, its method's target, its timestamp), is
// refused 401 and acted on by none.
func (s *suite) authBadSignature(ctx context.Context) (string, error) {
	wrong := s.otherToken()
	n, err := s.refusedCalls(ctx, s.lease("badsig"), "", []refusal{
		{"signed with another token", signedWith(wrong, time.Now())},
		{"with another target than signed", s.thenAltered(func(r *http.Request) { r.URL.RawQuery = "x=1" })},
		{"with another timestamp than signed", s.thenAltered(func(r *http.Request) {
			r.Header.Set(protocol.TimestampHeader, strconv.FormatInt(time.Now().Add(-time.Second).UnixMilli(), 10))
		})},
		{"with another nonce than signed", s.thenAltered(func(r *http.Request) { r.Header.Set(protocol.NonceHeader, protocol.NewNonce()) })},
		{"with another body than signed", s.thenAltered(func(r *http.Request) {
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader(`{"other": true}`)), int64(len(`{"other": true}`))
		})},
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d calls signed with another token or altered after signing answered 401 and acted on by none", n), nil
}

// authStale: a call signed at a time more than protocol.MaxClockSkew from
// now, either way, is refused 401 and acted on by none.
func (s *suite) authStale(ctx context.Context) (string, error) {
	off := protocol.MaxClockSkew + 5*time.Second
	n, err := s.refusedCalls(ctx, s.lease("stale"), "", []refusal{
		{fmt.Sprintf("signed %s ago", off), signedWith(s.t.Token, time.Now().Add(-off))},
		{fmt.Sprintf("signed %s ahead", off), signedWith(s.t.Token, time.Now().Add(off))},
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d calls signed more than %s away from now answered 401 and acted on by none", n, protocol.MaxClockSkew), nil
}

// authReplay: a signed call sent again as it was (read off the wire) is
// refused 401: a drain status, and a revoke, which the app must not apply
// a second time after a later grant.
func (s *suite) authReplay(ctx context.Context) (string, error) {
	lease := s.lease("replay")
	var sent http.Header
	keep := func(req *http.Request, body []byte) {
		protocol.Sign(req, s.t.Token, body, time.Now())
		sent = req.Header.Clone()
	}
	again := func(req *http.Request, _ []byte) {
		for k, v := range sent {
			req.Header[k] = v
		}
	}
	path := protocol.DrainPath + "?waitMillis=0"
	if a, err := s.call(ctx, http.MethodGet, path, "", keep, 0); err != nil {
		return "", err
	} else if a.code != http.StatusOK {
		return "", fmt.Errorf("a signed drain status = %s, want 200", a)
	}
	a, err := s.call(ctx, http.MethodGet, path, "", again, 0)
	if err != nil {
		return "", err
	}
	if err := wantError("the same drain status call again", a, http.StatusUnauthorized); err != nil {
		return "", err
	}
	// A revoke, a grant after it, then the revoke again: applied, it would
	// end the later term.
	if err := s.grant(ctx, lease, s.next()); err != nil {
		return "", err
	}
	rv := revokeBody(lease, s.next())
	if a, err := s.call(ctx, http.MethodPut, protocol.LeasePathPrefix+lease, rv, keep, 0); err != nil {
		return "", err
	} else if a.code != http.StatusOK {
		return "", fmt.Errorf("a signed revoke = %s, want 200", a)
	}
	if err := s.grant(ctx, lease, s.next()); err != nil {
		return "", err
	}
	a, err = s.call(ctx, http.MethodPut, protocol.LeasePathPrefix+lease, rv, again, 0)
	if err != nil {
		return "", err
	}
	if err := wantError("the same revoke again", a, http.StatusUnauthorized); err != nil {
		return "", err
	}
	if err := s.revoke(ctx, lease, s.next()); err != nil {
		return "", err
	}
	return "a drain status and a revoke sent again as they were answered 401", nil
}

// authSchemeCase: the scheme is read in any case (RFC 9110). Checked only
// once an unsigned call is refused: an app that checks no signature would
// pass it whatever it does.
func (s *suite) authSchemeCase(ctx context.Context) (string, error) {
	path := protocol.DrainPath + "?waitMillis=0"
	a, err := s.call(ctx, http.MethodGet, path, "", unsigned(""), 0)
	if err != nil {
		return "", err
	}
	if a.code != http.StatusUnauthorized {
		return "", fmt.Errorf("an unsigned drain status = %s, want 401: the app checks no signature, so the scheme's case cannot be checked", a)
	}
	for _, scheme := range []string{strings.ToLower(protocol.AuthScheme), "Handoff-Hmac-Sha256"} {
		sign := s.thenAltered(func(r *http.Request) {
			_, sig, _ := strings.Cut(r.Header.Get("Authorization"), " ")
			r.Header.Set("Authorization", scheme+" "+sig)
		})
		a, err := s.call(ctx, http.MethodGet, path, "", sign, 0)
		if err != nil {
			return "", err
		}
		if a.code != http.StatusOK {
			return "", fmt.Errorf("drain with scheme %q = %s, want 200: the scheme is read in any case", scheme, a)
		}
	}
	// The scheme in another case with a signature of another token: still
	// refused, so that an app that reads the scheme and checks no
	// signature does not pass.
	other := s.otherToken()
	a, err = s.call(ctx, http.MethodGet, path, "", func(r *http.Request, body []byte) {
		protocol.Sign(r, other, body, time.Now())
		_, sig, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		r.Header.Set("Authorization", strings.ToLower(protocol.AuthScheme)+" "+sig)
	}, 0)
	if err != nil {
		return "", err
	}
	if a.code != http.StatusUnauthorized {
		return "", fmt.Errorf("drain with scheme %q and a signature of another token = %s, want 401: the app reads the scheme but checks no signature", strings.ToLower(protocol.AuthScheme), a)
	}
	return fmt.Sprintf("unsigned refused; %q and %q accepted as %s; the scheme in lower case with another token's signature refused", strings.ToLower(protocol.AuthScheme), "Handoff-Hmac-Sha256", protocol.AuthScheme), nil
}

// transportSocket: an app served on a Unix socket (the default transport)
// made it a socket of mode 0666 at the path itself, not a symbolic link to
// one: the sidecar runs as another user than the worker and connects only
// to a path that is a socket itself. Skipped for an app on TCP.
func (s *suite) transportSocket(context.Context) (string, error) {
	e, _ := protocol.ParseEndpoint(s.t.URL) // checked by ready
	if e.Network != "unix" {
		return "", errSkip{"the app is on TCP (" + s.t.URL + "), a transport a pod opts into: no socket to check"}
	}
	fi, err := os.Lstat(e.Address)
	switch {
	case err != nil:
		return "", fmt.Errorf("the app's socket: %w", err)
	case fi.Mode().Type() == fs.ModeSymlink:
		return "", fmt.Errorf("%s is a symbolic link; want the socket itself at the path (the sidecar follows no link)", e.Address)
	case fi.Mode().Type() != fs.ModeSocket:
		return "", fmt.Errorf("%s is not a socket (%s)", e.Address, fi.Mode().Type())
	case fi.Mode().Perm() != protocol.SocketMode:
		return "", fmt.Errorf("%s has mode %o; want %o: the sidecar runs as another user than the worker, and the volume, not the mode, keeps others out", e.Address, fi.Mode().Perm(), protocol.SocketMode)
	}
	return fmt.Sprintf("%s is a socket of mode %o", e.Address, protocol.SocketMode), nil
}

// badWaitMillis: a waitMillis that is not a whole number of milliseconds ≥ 0,
// or given twice, is answered 400.
func (s *suite) badWaitMillis(ctx context.Context) (string, error) {
	queries := []string{"-1", "1.5", "1e3", "soon", "0x10", "1&waitMillis=2"}
	for _, q := range queries {
		a, err := s.call(ctx, http.MethodGet, protocol.DrainPath+"?waitMillis="+q, "", nil, 0)
		if err != nil {
			return "", err
		}
		if err := wantError("drain ?waitMillis="+q, a, http.StatusBadRequest); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("%d bad waitMillis answered 400 with a JSON error", len(queries)), nil
}

// oversized is a body over the 64 KiB limit, valid JSON otherwise.
func oversized(prefix string) string {
	return prefix + `, "pad": "` + strings.Repeat("x", 64<<10) + `"}`
}

// badReturn: a return body that is not one JSON object of the protocol's
// shape is answered 400; one over 64 KiB 413.
func (s *suite) badReturn(ctx context.Context) (string, error) {
	bodies := []struct {
		body string
		code int
	}{
		{`{`, 400}, {`[]`, 400}, {`null`, 400}, {`"cancel"`, 400}, {`{"cancel": "yes"}`, 400},
		{`{"cancelWaitMillis": "5"}`, 400}, {`{"cancel": false, "cancelWaitMillis": -1}`, 400},
		{`{"cancel": false} {"cancel": true}`, 400}, {`{"cancel": false}garbage`, 400}, {``, 400},
		{oversized(`{"cancel": false`), 413},
	}
	for _, b := range bodies {
		a, err := s.call(ctx, http.MethodPost, protocol.ReturnPath, b.body, nil, 0)
		if err != nil {
			return "", err
		}
		if err := wantError("return "+short(b.body), a, b.code); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("%d bad return bodies answered 400 (413 over 64 KiB)", len(bodies)), nil
}

// badLeadership: a leadership body that is not one JSON object of the
// protocol's shape, or names another Lease than the path, is answered 400
// (413 over 64 KiB) and not applied.
func (s *suite) badLeadership(ctx context.Context) (string, error) {
	lease := s.lease("bad")
	hi := time.Now().Add(protocol.MaxSequenceAhead / 2).UnixNano()
	bodies := []struct {
		body string
		code int
	}{
		{`{`, 400}, {`[]`, 400}, {`null`, 400}, {`{"leader": "yes"}`, 400}, {`{"sequence": "12"}`, 400},
		{`{"leader": true, "until": "tomorrow"}`, 400},
		{grantBody("another-"+lease, hi, s.term, time.Now().Add(s.term)), 400},
		{grantBody(lease, hi, s.term, time.Now().Add(s.term)) + "]", 400},
		{``, 400},
		{oversized(fmt.Sprintf(`{"lease": %q, "leader": true, "sequence": %d`, lease, hi)), 413},
	}
	for _, b := range bodies {
		a, err := s.call(ctx, http.MethodPut, protocol.LeasePathPrefix+lease, b.body, nil, 0)
		if err != nil {
			return "", err
		}
		if err := wantError("leadership "+short(b.body), a, b.code); err != nil {
			return "", err
		}
	}
	// Had a refused body been applied, its sequence (later) would make
	// this grant stale.
	if err := s.grant(ctx, lease, s.next()); err != nil {
		return "", fmt.Errorf("after bad leadership bodies: %w (a refused body was applied)", err)
	}
	if err := s.revoke(ctx, lease, s.next()); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d bad leadership bodies answered 400 (413 over 64 KiB), none applied", len(bodies)), nil
}

// unknownCall: a path the protocol does not define, or a method it does not
// use on a path, is answered 4xx and does nothing.
func (s *suite) unknownCall(ctx context.Context) (string, error) {
	lease := s.lease("method")
	calls := []struct{ method, path, body string }{
		{http.MethodGet, protocol.StopClaimingPath, ""},
		{http.MethodPut, protocol.StopClaimingPath, "{}"},
		{http.MethodPost, protocol.DrainPath + "?waitMillis=0", "{}"},
		{http.MethodGet, protocol.ReturnPath, ""},
		{http.MethodGet, protocol.LeasePathPrefix + lease, ""},
		{http.MethodPost, protocol.LeasePathPrefix + lease, revokeBody(lease, s.next())},
		{http.MethodDelete, protocol.LeasePathPrefix + lease, ""},
		{http.MethodPost, protocol.AppPrefix + "no-such-call", "{}"},
		{http.MethodGet, protocol.AppPrefix, ""},
	}
	for _, c := range calls {
		a, err := s.call(ctx, c.method, c.path, c.body, nil, 0)
		if err != nil {
			return "", err
		}
		if a.code/100 != 4 {
			return "", fmt.Errorf("%s %s = %s, want 4xx (Go's ServeMux: 404 for an unknown path, 405 for another method)", c.method, c.path, a)
		}
	}
	st, err := s.status(ctx)
	if err != nil {
		return "", err
	}
	if st.Stopping {
		return "", fmt.Errorf("after %s %s answered 4xx the app says stopping: it stopped claiming", http.MethodGet, protocol.StopClaimingPath)
	}
	return fmt.Sprintf("%d calls of unknown paths or methods answered 4xx, none acted on", len(calls)), nil
}

// notGenuine: a sequence more than protocol.MaxSequenceAhead (1 s) ahead of
// the app's clock, a grant valid for longer
// than the lease duration, an until beyond it are answered 422 and not
// applied (no sequence recorded).
func (s *suite) notGenuine(ctx context.Context) (string, error) {
	lease := s.lease("genuine")
	ahead := time.Now().Add(protocol.MaxSequenceAhead + time.Minute).UnixNano()
	nearly := time.Now().Add(protocol.MaxSequenceAhead + 2*time.Second).UnixNano()
	bodies := []struct{ what, body string }{
		{"a grant with a sequence a minute and more ahead", grantBody(lease, ahead, s.term, time.Now().Add(s.term))},
		{"a revoke with a sequence a minute and more ahead", revokeBody(lease, ahead)},
		{fmt.Sprintf("a grant with a sequence 2 s more than %s ahead", protocol.MaxSequenceAhead), grantBody(lease, nearly, s.term, time.Now().Add(s.term))},
		{"a grant valid for longer than the lease duration", grantBody(lease, s.next(), s.ld+time.Minute, time.Now().Add(s.term))},
		{"a grant with an until beyond the lease duration", grantBody(lease, s.next(), s.term, time.Now().Add(s.ld+time.Minute))},
	}
	for _, b := range bodies {
		a, err := s.call(ctx, http.MethodPut, protocol.LeasePathPrefix+lease, b.body, nil, 0)
		if err != nil {
			return "", err
		}
		if err := wantError(b.what, a, http.StatusUnprocessableEntity); err != nil {
			return "", err
		}
	}
	if err := s.grant(ctx, lease, s.next()); err != nil {
		return "", fmt.Errorf("after messages refused 422: %w (a refused sequence was recorded)", err)
	}
	if err := s.revoke(ctx, lease, s.next()); err != nil {
		return "", err
	}
	return "messages the sidecar cannot send answered 422, none applied", nil
}

// sequence: a message whose sequence is not above the last applied for the
// Lease is answered stale (echoing leader) and not applied, grant or
// revoke; a later one is applied.
func (s *suite) sequence(ctx context.Context) (string, error) {
	lease := s.lease("seq")
	s1 := s.next()
	if err := s.grant(ctx, lease, s1); err != nil {
		return "", err
	}
	until := time.Now().Add(s.term)
	if err := s.wantStale(ctx, lease, grantBody(lease, s1, s.term, until), true, "a grant repeating the last sequence"); err != nil {
		return "", err
	}
	if err := s.wantStale(ctx, lease, grantBody(lease, s1-500, s.term, until), true, "a grant older than the last"); err != nil {
		return "", err
	}
	if err := s.wantStale(ctx, lease, revokeBody(lease, s1-100), false, "a revoke older than the last grant"); err != nil {
		return "", err
	}
	if err := s.grant(ctx, lease, s.next()); err != nil {
		return "", fmt.Errorf("a renewal after stale messages: %w", err)
	}
	mid := s.next()
	s3 := s.next()
	if err := s.revoke(ctx, lease, s3); err != nil {
		return "", err
	}
	if err := s.wantStale(ctx, lease, grantBody(lease, mid, s.term, time.Now().Add(s.term)), true, "a grant older than the revoke, delivered after it"); err != nil {
		return "", err
	}
	if err := s.grant(ctx, lease, s.next()); err != nil {
		return "", fmt.Errorf("a new grant after the revoke: %w", err)
	}
	if err := s.revoke(ctx, lease, s.next()); err != nil {
		return "", err
	}
	return "older and repeated sequences answered stale, grant and revoke; later ones applied", nil
}

// firstMessage: the first message for a Lease is applied whatever its
// number.
func (s *suite) firstMessage(ctx context.Context) (string, error) {
	lease := s.lease("first")
	if err := s.grant(ctx, lease, 1); err != nil {
		return "", fmt.Errorf("the first message, with sequence 1: %w", err)
	}
	if err := s.revoke(ctx, lease, s.next()); err != nil {
		return "", err
	}
	return "a first grant with sequence 1 applied", nil
}

// revokeUnknown: a revoke of a Lease the app never led is acked at once.
func (s *suite) revokeUnknown(ctx context.Context) (string, error) {
	if err := s.revoke(ctx, s.lease("unknown"), s.next()); err != nil {
		return "", err
	}
	return "acked", nil
}

// staleRevoke: a revoke older than the last grant neither ends the term nor
// stops leader work.
func (s *suite) staleRevoke(ctx context.Context) (string, error) {
	lease := s.lease("stalerevoke")
	s1 := s.next()
	if err := s.grant(ctx, lease, s1); err != nil {
		return "", err
	}
	defer func() { _ = s.t.Leader.Release(ctx, lease) }()
	if err := s.leads(ctx, lease, "after a grant"); err != nil {
		return "", err
	}
	if err := s.wantStale(ctx, lease, revokeBody(lease, s1-1000), false, "a revoke older than the grant"); err != nil {
		return "", err
	}
	stopping, err := s.t.Leader.Stopping(ctx, lease)
	if err != nil {
		return "", fmt.Errorf("LeaderFixture.Stopping(%s): %w", lease, err)
	}
	if stopping {
		return "", fmt.Errorf("a stale revoke told leader work to stop")
	}
	if err := s.leads(ctx, lease, "after a stale revoke"); err != nil {
		return "", err
	}
	_ = s.t.Leader.Release(ctx, lease)
	if err := s.revoke(ctx, lease, s.next()); err != nil {
		return "", err
	}
	return "a stale revoke answered stale; leader work went on", nil
}

// revokeAck: a revoke tells leader work to stop and is answered only once
// it has stopped; no leader work begins after the ack.
func (s *suite) revokeAck(ctx context.Context) (string, error) {
	lease := s.lease("revoke")
	if err := s.grant(ctx, lease, s.next()); err != nil {
		return "", err
	}
	released := false
	defer func() {
		if !released {
			_ = s.t.Leader.Release(ctx, lease)
		}
	}()
	if err := s.leads(ctx, lease, "after a grant"); err != nil {
		return "", err
	}
	type result struct {
		ack protocol.LeadershipAck
		a   answer
		err error
	}
	answered := make(chan result, 1)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	seq := s.next()
	go func() {
		ack, a, err := s.lead(rctx, lease, revokeBody(lease, seq))
		answered <- result{ack, a, err}
	}()
	premature := func() error {
		select {
		case r := <-answered:
			if r.err != nil {
				return fmt.Errorf("revoke while leader work runs: %w", r.err)
			}
			return fmt.Errorf("revoke answered %s while leader work was still running: the ack must wait until leader work has stopped", r.a)
		default:
			return nil
		}
	}
	stopping, err := s.waitStopping(ctx, lease, callBound, premature)
	if err != nil {
		return "", err
	}
	if !stopping {
		return "", fmt.Errorf("a revoke did not tell leader work to stop within %s", callBound)
	}
	select {
	case <-time.After(early):
	case r := <-answered:
		if r.err != nil {
			return "", fmt.Errorf("revoke while leader work runs: %w", r.err)
		}
		return "", fmt.Errorf("revoke answered %s while leader work was still running: the ack must wait until leader work has stopped", r.a)
	}
	if err := s.t.Leader.Release(ctx, lease); err != nil {
		return "", fmt.Errorf("LeaderFixture.Release(%s): %w", lease, err)
	}
	released = true
	var r result
	select {
	case r = <-answered:
	case <-time.After(callBound):
		return "", fmt.Errorf("revoke not answered within %s of leader work stopping", callBound)
	}
	if r.err != nil {
		return "", r.err
	}
	if r.ack.Leader || r.ack.Stale {
		return "", fmt.Errorf("revoke answered %s once leader work stopped, want {\"leader\": false} without stale", r.a)
	}
	if err := s.leadsNot(ctx, lease, "after its revoke was acked"); err != nil {
		return "", err
	}
	return "the revoke told leader work to stop and was acked only once it had", nil
}

// termValidFor: a term ends validForMillis after the receipt of its last
// grant, on the app's clock, with no further message.
func (s *suite) termValidFor(ctx context.Context) (string, error) {
	return s.termEnds(ctx, "validfor", func() (time.Duration, time.Time) { return shortTerm, time.Now().Add(s.term) }, "validForMillis")
}

// termUntil: a term ends at its last grant's until, whatever its
// validForMillis.
func (s *suite) termUntil(ctx context.Context) (string, error) {
	return s.termEnds(ctx, "until", func() (time.Duration, time.Time) { return s.term, time.Now().Add(shortTerm) }, "until")
}

// termEnds grants a term, begins leader work in it, then renews it with
// the bounds last gives (a renewal moves the term's end to its bounds,
// nearer too), and wants leader work told to stop once they pass, with no
// further message. Leader work begins under the long term first, so that a
// slow fixture cannot miss the short one.
func (s *suite) termEnds(ctx context.Context, what string, last func() (time.Duration, time.Time), field string) (string, error) {
	lease := s.lease(what)
	if err := s.grant(ctx, lease, s.next()); err != nil {
		return "", err
	}
	defer func() { _ = s.t.Leader.Release(ctx, lease) }()
	if err := s.leads(ctx, lease, "after a grant"); err != nil {
		return "", err
	}
	validFor, until := last()
	if err := s.grantFor(ctx, lease, s.next(), validFor, until); err != nil {
		return "", fmt.Errorf("a renewal ending the term after %s by %s: %w", shortTerm, field, err)
	}
	renewed := time.Now()
	stopping, err := s.waitStopping(ctx, lease, shortTerm+callBound, nil)
	if err != nil {
		return "", err
	}
	if !stopping {
		return "", fmt.Errorf("leader work not told to stop %s after a renewal whose %s ended the term after %s, with no message since", time.Since(renewed).Round(time.Millisecond), field, shortTerm)
	}
	if err := s.leadsNot(ctx, lease, "after its term ran out"); err != nil {
		return "", err
	}
	_ = s.t.Leader.Release(ctx, lease)
	if err := s.revoke(ctx, lease, s.next()); err != nil {
		return "", err
	}
	return fmt.Sprintf("a term renewed to end in %s (by %s) ended on the app's clock with no message since", shortTerm, field), nil
}

// newInstance: a restarted app (a new process) names another instance
// in its drain status than the one before, so that after a kill of the
// worker container the sidecar re-arms for the new process, never for the
// old one still up until the kubelet's SIGTERM. Skipped for an app that
// sends no instance (the sidecar then takes any process not stopping for
// new), and without a Fixture.
func (s *suite) newInstance(ctx context.Context) (string, error) {
	if s.t.Fixture == nil {
		return "", errSkip{"needs a Fixture (--fixture-cmd): only a restart shows a new process"}
	}
	before, err := s.status(ctx)
	if err != nil {
		return "", err
	}
	if before.Instance == "" {
		return "", errSkip{"the app sends no instance: the sidecar takes any process that is not stopping for a new one"}
	}
	if err := s.t.Fixture.Restart(ctx); err != nil {
		return "", fmt.Errorf("Fixture.Restart: %w", err)
	}
	after, err := s.status(ctx)
	if err != nil {
		return "", err
	}
	if after.Instance == before.Instance {
		return "", fmt.Errorf("the restarted app names the same instance %q as the process before: the sidecar would take the old process, still up until SIGTERM, for the new one", after.Instance)
	}
	if after.Stopping {
		return "", errors.New("the restarted app says stopping")
	}
	return fmt.Sprintf("instance %q, then %q after the restart", before.Instance, after.Instance), nil
}

// beforeStart is how long before the suite begins a restart it signs the
// calls of auth/signed-before-start-refused: the restarted receiver took
// its start after that began, so the calls are signed at least this long
// before it, clear of any rounding (a receiver truncates its start to the
// millisecond, as a timestamp is) and of a receiver that reads its start a
// little early.
const beforeStart = time.Second

// authBeforeStart: a call signed before the receiver started (a call of
// the process before, replayed after a restart), with a nonce the new
// process never saw and a timestamp within the 30 s skew, is refused 401
// with an error that begins "signed before this receiver started", and
// acted on by none: every call the protocol signs, on a fresh process
// (Fixture.Restart) holding one claim, which a refused return would hand
// back and a refused stop-claiming would stop. Then calls signed now are
// answered 200. The suite knows when the receiver started only from a
// restart (the fixture's restart replaces the process, and a receiver
// takes its start before it listens), so the case is skipped without a
// Fixture; and when the restart and the hold took so long that the calls
// would reach the app more than half the 30 s skew after their timestamp
// (a receiver checks the skew first, and would refuse them for that).
func (s *suite) authBeforeStart(ctx context.Context) (string, error) {
	f := s.t.Fixture
	if f == nil {
		return "", errSkip{"needs a Fixture (--fixture-cmd): only a restart tells the suite when the app's receiver started, and a call signed before an app started more than 30 s ago is refused for its timestamp alone"}
	}
	began := time.Now()
	if err := f.Restart(ctx); err != nil {
		return "", fmt.Errorf("Fixture.Restart: %w", err)
	}
	if err := f.Hold(ctx, 1); err != nil {
		return "", fmt.Errorf("Fixture.Hold(1): %w", err)
	}
	defer func() { _ = f.Finish(ctx) }()
	at := began.Add(-beforeStart)
	if age := time.Since(at); age > protocol.MaxClockSkew/2 {
		return "", errSkip{fmt.Sprintf("Fixture.Restart and Hold took %s: calls signed before the restart would reach the app more than %s after their timestamp, too near the %s skew the app checks first", time.Since(began).Round(time.Millisecond), protocol.MaxClockSkew/2, protocol.MaxClockSkew)}
	}
	n, err := s.refusedCalls(ctx, s.lease("beforestart"), protocol.ErrBeforeStart.Error(), []refusal{
		{fmt.Sprintf("signed %s before the restart began", beforeStart), signedWith(s.t.Token, at)},
	})
	if err != nil {
		return "", err
	}
	st, err := s.status(ctx)
	if err != nil {
		return "", err
	}
	if st.InFlight != 1 {
		return "", fmt.Errorf("after return calls refused 401, with 1 claim held by the fixture: drain status %+v, want inFlight 1: a refused call was acted on", st)
	}
	return fmt.Sprintf("%d calls signed %s before a restart answered 401 %q and acted on by none (not stopping, the claim still held); a drain status, a grant and a revoke signed now answered 200", n, beforeStart, protocol.ErrBeforeStart.Error()), nil
}

// drainGroup: stop-claiming and the drain long poll. With a Fixture, on a
// fresh process holding `held` claims; without, on the app as given (then
// the cases that need claims are skipped: needsClaims). Once a case has
// not stopped the app's claiming (s.stopped), the rest are skipped.
func (s *suite) drainGroup(ctx context.Context, cases []entry) {
	names := ids(cases)
	f := s.t.Fixture
	s.drainHeld, s.stopped, s.first = 0, false, protocol.DrainStatus{}
	if f != nil {
		if err := f.Restart(ctx); err != nil {
			s.failAll(names, "Fixture.Restart: "+err.Error())
			return
		}
		s.heldFrom = time.Now()
		if err := f.Hold(ctx, held); err != nil {
			s.failAll(names, fmt.Sprintf("Fixture.Hold(%d): %v", held, err))
			return
		}
		s.heldBy = time.Now()
		defer func() { _ = f.Finish(ctx) }()
		s.drainHeld = held
		if st, err := s.status(ctx); err != nil || st.InFlight != s.drainHeld {
			s.failAll(names, fmt.Sprintf("before stop-claiming, with %d claims held by the fixture: status %+v, %v; want inFlight %d (the app must be idle but for the fixture)", held, st, err, held))
			return
		}
	}
	for i, c := range cases {
		if i > 0 && !s.stopped {
			s.skipAll(names[i:], "stop-claiming did not stop claiming")
			return
		}
		s.run(ctx, c.id, c.bound(s))
	}
}

// needsClaims skips the case run without a Fixture: in the drain group,
// the cases that need claims held.
func needsClaims(run func(*suite, context.Context) (string, error)) func(*suite, context.Context) (string, error) {
	return func(s *suite, ctx context.Context) (string, error) {
		if s.t.Fixture == nil {
			return "", errSkip{"needs a Fixture (--fixture-cmd): a long poll shows only with claims in flight"}
		}
		return run(s, ctx)
	}
}

// stopClaimingCase: stop-claiming answers stopping, with the claims held
// in flight; it sets s.stopped and s.first.
func (s *suite) stopClaimingCase(ctx context.Context) (string, error) {
	st, _, err := s.stopClaiming(ctx)
	if err != nil {
		return "", err
	}
	if !st.Stopping {
		return "", fmt.Errorf("stop-claiming answered %+v, want stopping true", st)
	}
	s.stopped = true
	if err := consistent(st); err != nil {
		return "", err
	}
	if s.t.Fixture != nil && st.InFlight != s.drainHeld {
		return "", fmt.Errorf("stop-claiming answered inFlight %d with %d claims held, want %d", st.InFlight, held, held)
	}
	s.first = st
	return fmt.Sprintf("stopping, %d in flight", st.InFlight), nil
}

// stopIdempotent: a second stop-claiming answers as the first.
func (s *suite) stopIdempotent(ctx context.Context) (string, error) {
	st, _, err := s.stopClaiming(ctx)
	if err != nil {
		return "", err
	}
	first := s.first
	if !st.Stopping || st.Instance != first.Instance || st.InFlight > first.InFlight || (s.t.Fixture != nil && st.InFlight != s.drainHeld) {
		return "", fmt.Errorf("a second stop-claiming answered %+v after %+v, want stopping, the same instance and in-flight count", st, first)
	}
	return "a second stop-claiming answered the same", nil
}

// drainAtOnce: a drain with waitMillis absent, empty or 0 answers at once.
func (s *suite) drainAtOnce(ctx context.Context) (string, error) {
	for _, q := range []string{"", "?waitMillis=", "?waitMillis=0"} {
		st, a, err := s.drain(ctx, q, 0)
		if err != nil {
			return "", err
		}
		if st.Drained || st.InFlight != s.drainHeld || !st.Stopping {
			return "", fmt.Errorf("drain%s answered %+v with %d claims held after stop-claiming, want stopping, %d in flight, not drained", q, st, held, held)
		}
		if a.took > atOnce {
			return "", fmt.Errorf("drain%s answered after %s, want at once", q, a.took.Round(time.Millisecond))
		}
	}
	return "absent, empty and 0 answered at once, not drained", nil
}

// drainWaits: with claims held, a drain long poll waits waitMillis.
func (s *suite) drainWaits(ctx context.Context) (string, error) {
	q := fmt.Sprintf("?waitMillis=%d", drainWait.Milliseconds())
	st, a, err := s.drain(ctx, q, drainWait)
	if err != nil {
		return "", err
	}
	if st.Drained || st.InFlight != s.drainHeld {
		return "", fmt.Errorf("drain%s answered %+v with %d claims held, want not drained", q, st, held)
	}
	if a.took < drainWait {
		return "", fmt.Errorf("drain%s answered after %s, not drained: want the answer once drained or after %s", q, a.took.Round(time.Millisecond), drainWait)
	}
	return fmt.Sprintf("waited %s for waitMillis %d", a.took.Round(time.Millisecond), drainWait.Milliseconds()), nil
}

// leadDuringDrain: grants and renewals after stop-claiming are applied,
// and leader work begins under them.
func (s *suite) leadDuringDrain(ctx context.Context) (string, error) {
	lease := s.lease("draining")
	if err := s.grant(ctx, lease, s.next()); err != nil {
		return "", fmt.Errorf("after stop-claiming: %w", err)
	}
	if err := s.grant(ctx, lease, s.next()); err != nil {
		return "", fmt.Errorf("a renewal after stop-claiming: %w", err)
	}
	how := "grants and renewals applied after stop-claiming"
	if s.t.Leader != nil {
		if err := s.leads(ctx, lease, "after a grant during the drain"); err != nil {
			return "", err
		}
		_ = s.t.Leader.Release(ctx, lease)
		how += "; leader work begins"
	}
	if err := s.revoke(ctx, lease, s.next()); err != nil {
		return "", err
	}
	return how, nil
}

// drainReturnsDrained: a long poll answers drained once the claims are
// finished, with no runningMillis.
func (s *suite) drainReturnsDrained(ctx context.Context) (string, error) {
	const long = 20 * time.Second
	type result struct {
		st  protocol.DrainStatus
		a   answer
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, a, err := s.drain(ctx, fmt.Sprintf("?waitMillis=%d", long.Milliseconds()), long)
		done <- result{st, a, err}
	}()
	// Give the long poll time to reach the app; should it come after
	// Finish it answers drained at once, which passes too.
	select {
	case r := <-done:
		return "", fmt.Errorf("drain answered %s before the claims were finished, with %d held", r.a, held)
	case <-time.After(early):
	}
	if err := s.t.Fixture.Finish(ctx); err != nil {
		return "", fmt.Errorf("Fixture.Finish: %w", err)
	}
	r := <-done
	if r.err != nil {
		return "", r.err
	}
	if !r.st.Drained || r.st.InFlight != 0 {
		return "", fmt.Errorf("drain answered %+v once the claims were finished, want drained", r.st)
	}
	if r.st.RunningMillis != 0 {
		return "", fmt.Errorf("drain answered runningMillis %d once the claims were finished, want 0 or none: no claim is in progress", r.st.RunningMillis)
	}
	return fmt.Sprintf("a long poll of %s answered drained once the claims were finished", long), nil
}

// drainLarge: once drained, a waitMillis beyond the bound (and beyond
// int64) answers 200, drained. Without a Fixture, the app as given must
// be drained within 5 s of stop-claiming first.
func (s *suite) drainLarge(ctx context.Context) (string, error) {
	if s.t.Fixture == nil {
		st, _, err := s.drain(ctx, "?waitMillis=5000", 5*time.Second)
		if err != nil {
			return "", err
		}
		if !st.Drained {
			return "", fmt.Errorf("an idle app is not drained 5 s after stop-claiming: %+v (the app must be idle, or stop its waits at stop-claiming)", st)
		}
	}
	for _, v := range []string{"30000", "30001", "9223372036854775807", "99999999999999999999"} {
		st, a, err := s.drain(ctx, "?waitMillis="+v, 0)
		if err != nil {
			return "", fmt.Errorf("drained, waitMillis %s: %w", v, err)
		}
		if !st.Drained {
			return "", fmt.Errorf("drain ?waitMillis=%s answered %s, want drained", v, a)
		}
	}
	return "waitMillis beyond the bound (and beyond int64) answered 200 when drained", nil
}

// returnGroup: on a fresh process holding `held` claims, after
// stop-claiming.
func (s *suite) returnGroup(ctx context.Context, cases []entry) {
	names := ids(cases)
	f := s.t.Fixture
	if f == nil {
		s.skipAll(names, "needs a Fixture (--fixture-cmd): counts show only with claims in flight")
		return
	}
	if err := s.holding(ctx, held); err != nil {
		s.failAll(names, err.Error())
		return
	}
	defer func() { _ = f.Finish(ctx) }()
	for _, c := range cases {
		s.run(ctx, c.id, c.bound(s))
	}
}

// returnCounts: the return fallback hands back every claim held and
// counts it.
func (s *suite) returnCounts(ctx context.Context) (string, error) {
	var res protocol.ReturnResult
	if _, err := s.ok(ctx, http.MethodPost, protocol.ReturnPath, `{"cancel": false, "cancelWaitMillis": 500}`, 0, &res); err != nil {
		return "", err
	}
	if res.Returned != held || res.Error != "" {
		return "", fmt.Errorf("return answered %+v with %d claims held, want returned %d and no error", res, held, held)
	}
	return fmt.Sprintf("returned %d of %d held", res.Returned, held), nil
}

// returnRepeat: a second return is answered too.
func (s *suite) returnRepeat(ctx context.Context) (string, error) {
	var res protocol.ReturnResult
	if _, err := s.ok(ctx, http.MethodPost, protocol.ReturnPath, `{"cancel": false}`, 0, &res); err != nil {
		return "", fmt.Errorf("a second return: %w", err)
	}
	if res.Returned < 0 || res.Returned > held {
		return "", fmt.Errorf("a second return answered %+v, want returned 0 to %d", res, held)
	}
	return fmt.Sprintf("a second return answered, returned %d", res.Returned), nil
}

// cancelHeld is how many claims the cancel and cancel-ended groups hold.
const cancelHeld = 2

// cancelGroup: on a fresh process holding cancelHeld claims whose work
// ignores the cancel, after stop-claiming.
func (s *suite) cancelGroup(ctx context.Context, cases []entry) {
	names := ids(cases)
	f := s.t.Fixture
	if f == nil {
		s.skipAll(names, "needs a Fixture (--fixture-cmd): a cancel shows only with claims in flight")
		return
	}
	if err := s.holding(ctx, cancelHeld); err != nil {
		s.failAll(names, err.Error())
		return
	}
	defer func() { _ = f.Finish(ctx) }()
	for _, c := range cases {
		s.run(ctx, c.id, c.bound(s))
	}
}

// cancelReturn: the cancel fallback cancels in-flight work, waits
// cancelWaitMillis for it (the fixture's work ignores it), then hands back
// what is still held.
func (s *suite) cancelReturn(ctx context.Context) (string, error) {
	const n = cancelHeld
	var res protocol.ReturnResult
	body := fmt.Sprintf(`{"cancel": true, "cancelWaitMillis": %d}`, cancelWait.Milliseconds())
	a, err := s.ok(ctx, http.MethodPost, protocol.ReturnPath, body, cancelWait, &res)
	if err != nil {
		return "", err
	}
	if res.Returned != n || res.Error != "" {
		return "", fmt.Errorf("return with cancel answered %+v with %d claims held past the cancel, want returned %d and no error", res, n, n)
	}
	if a.took < cancelWait {
		return "", fmt.Errorf("return with cancel answered after %s with work still running: want it to wait up to cancelWaitMillis %d for the work first", a.took.Round(time.Millisecond), cancelWait.Milliseconds())
	}
	return fmt.Sprintf("waited %s for canceled work, then returned %d", a.took.Round(time.Millisecond), res.Returned), nil
}

// cancelEndedGroup: on a fresh process holding cancelHeld claims whose
// work ends at the cancel (CancelFixture), after stop-claiming.
func (s *suite) cancelEndedGroup(ctx context.Context, cases []entry) {
	names := ids(cases)
	cf, ok := s.t.Fixture.(CancelFixture)
	if !ok {
		s.skipAll(names, "needs a CancelFixture (--fixture-cmd answering hold-cancelable): claims whose work ends at the cancel")
		return
	}
	if err := s.holdingWith(ctx, cancelHeld, "HoldCancelable", cf.HoldCancelable); err != nil {
		if errors.Is(err, errors.ErrUnsupported) {
			s.skipAll(names, "the fixture cannot hold claims whose work ends at the cancel")
			return
		}
		s.failAll(names, err.Error())
		return
	}
	defer func() { _ = cf.Finish(ctx) }()
	for _, c := range cases {
		s.run(ctx, c.id, c.bound(s))
	}
}

// cancelHandsBack: with cancel, work that ends because of the cancel
// without acknowledging its message is handed back too, and the app hands
// back as soon as the canceled work has ended, not after all of
// cancelWaitMillis.
func (s *suite) cancelHandsBack(ctx context.Context) (string, error) {
	const n = cancelHeld
	const wait = 3 * time.Second
	var res protocol.ReturnResult
	body := fmt.Sprintf(`{"cancel": true, "cancelWaitMillis": %d}`, wait.Milliseconds())
	a, err := s.ok(ctx, http.MethodPost, protocol.ReturnPath, body, wait, &res)
	if err != nil {
		return "", err
	}
	if a.took >= wait {
		return "", fmt.Errorf("return with cancel answered after %s, all of cancelWaitMillis: the in-flight work was not canceled, or the app did not see it end", a.took.Round(time.Millisecond))
	}
	if res.Returned != n || res.Error != "" {
		return "", fmt.Errorf("return with cancel answered %+v for %d claims whose work ended at the cancel without acknowledging: want returned %d, no error (their messages are still claimed)", res, n, n)
	}
	return fmt.Sprintf("canceled work ended, unacknowledged; returned %d after %s", res.Returned, a.took.Round(time.Millisecond)), nil
}

// runningMillis: with claims started between s.heldFrom and s.heldBy and
// in progress since, runningMillis (optional) is how long the oldest has
// been in progress: between the time since heldBy and the time since
// heldFrom, and aging with the app's clock. (The fixture holds the claims
// at once: an app that times the newest claim instead is not told apart.)
func (s *suite) runningMillis(ctx context.Context) (string, error) {
	heldFrom, heldBy := s.heldFrom, s.heldBy
	asked := time.Now()
	before, err := s.status(ctx)
	if err != nil {
		return "", err
	}
	after, a, err := s.drain(ctx, fmt.Sprintf("?waitMillis=%d", ageWait.Milliseconds()), ageWait)
	if err != nil {
		return "", err
	}
	if before.RunningMillis == 0 && after.RunningMillis == 0 {
		return "", errSkip{"the app sends no runningMillis (optional): the sidecar ranks its pod for scale-in by its claims alone"}
	}
	least := (asked.Sub(heldBy) - clockSlack).Milliseconds()
	most := (time.Since(heldFrom) + clockSlack).Milliseconds()
	// The app computed its two answers this far apart at least: the long
	// poll's own wait (it holds the answer that long while claims are in
	// progress), or less when it answered sooner. Not the whole round trip,
	// which goes on after the app has answered (a slow scheduler made it
	// 13 ms longer than the aging an app had seen: a false failure).
	aged := (min(a.took, ageWait) - clockSlack).Milliseconds()
	switch {
	case before.RunningMillis < least || after.RunningMillis > most:
		return "", fmt.Errorf("runningMillis %d, then %d, for claims started %d to %d ms before the first call: want how long the oldest claim in progress has been in progress, in milliseconds",
			before.RunningMillis, after.RunningMillis, asked.Sub(heldBy).Milliseconds(), asked.Sub(heldFrom).Milliseconds())
	case after.RunningMillis-before.RunningMillis < aged:
		return "", fmt.Errorf("runningMillis %d, then %d after a long poll answered in %s: want it to age with the claims, by %d ms or more",
			before.RunningMillis, after.RunningMillis, a.took.Round(time.Millisecond), aged)
	}
	return fmt.Sprintf("runningMillis %d, then %d after a long poll of %s", before.RunningMillis, after.RunningMillis, a.took.Round(time.Millisecond)), nil
}

// returnUnstoppedGroup: on a fresh process holding 1 claim, which
// stop-claiming never reached.
func (s *suite) returnUnstoppedGroup(ctx context.Context, cases []entry) {
	names := ids(cases)
	f := s.t.Fixture
	if f == nil {
		s.skipAll(names, "needs a Fixture (--fixture-cmd): the sidecar returns only with claims in flight")
		return
	}
	if err := s.restartHolding(ctx, 1, "Hold", f.Hold); err != nil {
		s.failAll(names, err.Error())
		return
	}
	defer func() { _ = f.Finish(ctx) }()
	for _, c := range cases {
		s.run(ctx, c.id, c.bound(s))
	}
}

// returnStops: a return on a process stop-claiming never reached stops its
// claiming too: nothing is claimed after the hand-back.
func (s *suite) returnStops(ctx context.Context) (string, error) {
	st, err := s.status(ctx)
	if err != nil {
		return "", err
	}
	if st.Stopping || st.InFlight != 1 {
		return "", fmt.Errorf("before the return, with 1 claim held and no stop-claiming: status %+v, want not stopping, 1 in flight", st)
	}
	var res protocol.ReturnResult
	if _, err := s.ok(ctx, http.MethodPost, protocol.ReturnPath, `{"cancel": false}`, 0, &res); err != nil {
		return "", err
	}
	if res.Returned != 1 || res.Error != "" {
		return "", fmt.Errorf("return answered %+v with 1 claim held, want returned 1 and no error", res)
	}
	if st, err = s.status(ctx); err != nil {
		return "", err
	}
	if !st.Stopping {
		return "", fmt.Errorf("after a return with no stop-claiming before it: status %+v, want stopping: the app must claim nothing after the hand-back", st)
	}
	return "a return with no stop-claiming before it stopped claiming, returned 1", nil
}

// unstartedHeld is how many claims the unstarted group holds unstarted,
// beside one started.
const unstartedHeld = 2

// unstartedGroup: on a fresh process holding 1 claim started and
// unstartedHeld unstarted (UnstartedFixture), before stop-claiming.
func (s *suite) unstartedGroup(ctx context.Context, cases []entry) {
	names := ids(cases)
	uf, ok := s.t.Fixture.(UnstartedFixture)
	if !ok {
		s.skipAll(names, "needs an UnstartedFixture (--fixture-cmd answering hold-unstarted): claims held and not started")
		return
	}
	if err := s.restartHolding(ctx, 1, "Hold", uf.Hold); err != nil {
		s.failAll(names, err.Error())
		return
	}
	defer func() { _ = uf.Finish(ctx) }()
	if err := uf.HoldUnstarted(ctx, unstartedHeld); err != nil {
		if errors.Is(err, errors.ErrUnsupported) {
			s.skipAll(names, "the fixture cannot hold claims unstarted")
			return
		}
		s.failAll(names, fmt.Sprintf("Fixture.HoldUnstarted(%d): %v", unstartedHeld, err))
		return
	}
	for _, c := range cases {
		s.run(ctx, c.id, c.bound(s))
	}
}

// handsBackUnstarted: stop-claiming hands back the claims held unstarted
// at once, not at the drain deadline; started work is left to drain.
func (s *suite) handsBackUnstarted(ctx context.Context) (string, error) {
	const unstarted = unstartedHeld
	st, err := s.status(ctx)
	if err != nil {
		return "", err
	}
	if st.InFlight != 1+unstarted || st.Unstarted != unstarted {
		return "", fmt.Errorf("before stop-claiming, with 1 claim started and %d unstarted held by the fixture: status %+v, want inFlight %d, unstarted %d", unstarted, st, 1+unstarted, unstarted)
	}
	start := time.Now()
	if _, _, err := s.stopClaiming(ctx); err != nil {
		return "", err
	}
	// The app hands them back through its queue, after it answered:
	// watch its count until they have left it.
	for {
		st, _, err := s.drain(ctx, fmt.Sprintf("?waitMillis=%d", poll.Milliseconds()), poll)
		if err != nil {
			return "", err
		}
		if st.InFlight < 1 || st.Drained {
			return "", fmt.Errorf("after stop-claiming: status %+v, want the started claim still held: only unstarted claims are handed back, started work drains", st)
		}
		if st.InFlight == 1 && st.Unstarted == 0 {
			return fmt.Sprintf("%d unstarted claims handed back %s after stop-claiming; the started one left to drain", unstarted, time.Since(start).Round(time.Millisecond)), nil
		}
		if time.Since(start) > handBackBound {
			return "", fmt.Errorf("%s after stop-claiming the app still holds %+v: want the %d unstarted claims handed back at once (inFlight 1, unstarted 0), not kept to the drain deadline", handBackBound, st, unstarted)
		}
	}
}

// holding restarts the app, makes it hold n claims and stops its claiming.
func (s *suite) holding(ctx context.Context, n int) error {
	return s.holdingWith(ctx, n, "Hold", s.t.Fixture.Hold)
}

// restartHolding restarts the app and makes it hold n claims with hold,
// the Fixture method named what.
func (s *suite) restartHolding(ctx context.Context, n int, what string, hold func(context.Context, int) error) error {
	if err := s.t.Fixture.Restart(ctx); err != nil {
		return fmt.Errorf("Fixture.Restart: %w", err)
	}
	if err := hold(ctx, n); err != nil {
		return fmt.Errorf("Fixture.%s(%d): %w", what, n, err)
	}
	return nil
}

// holdingWith is holding with hold, the Fixture method named what.
func (s *suite) holdingWith(ctx context.Context, n int, what string, hold func(context.Context, int) error) error {
	if err := s.restartHolding(ctx, n, what, hold); err != nil {
		return err
	}
	st, _, err := s.stopClaiming(ctx)
	if err != nil {
		return err
	}
	if !st.Stopping || st.InFlight != n {
		return fmt.Errorf("stop-claiming with %d claims held answered %+v, want stopping and %d in flight", n, st, n)
	}
	return nil
}
