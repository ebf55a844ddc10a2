package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/handoff-dev/handoff/protocol"
)

// The cases of the wire's edges (docs/protocol.md, "Edges of the wire"):
// what the sidecar never sends, answered the one way every SDK answers it.

// nullsAbsent: a null value reads as the field's zero value, as an absent
// one: a grant with null optional fields is applied, a null leader is a
// revoke, a null lease is no Lease named in the body.
func (s *suite) nullsAbsent(ctx context.Context) (string, error) {
	lease := s.lease("null")
	until := time.Now().Add(s.term).UTC().Format(time.RFC3339Nano)
	grant := fmt.Sprintf(`{"lease": null, "leader": true, "sequence": %d, "holderIdentity": null, "fencingToken": null, "until": %q, "validForMillis": %d}`,
		s.next(), until, s.term.Milliseconds())
	ack, a, err := s.lead(ctx, lease, grant)
	if err != nil {
		return "", fmt.Errorf("a grant with null lease, holderIdentity and fencingToken: %w (null reads as absent)", err)
	}
	if !ack.Leader || ack.Stale {
		return "", fmt.Errorf("a grant with null lease, holderIdentity and fencingToken = %s, want {\"leader\": true}", a)
	}
	nullUntil := fmt.Sprintf(`{"lease": %q, "leader": true, "sequence": %d, "fencingToken": 1, "until": null, "validForMillis": %d}`, lease, s.next(), s.term.Milliseconds())
	if ack, a, err = s.lead(ctx, lease, nullUntil); err != nil {
		return "", fmt.Errorf("a grant with until null: %w (null reads as absent)", err)
	} else if !ack.Leader || ack.Stale {
		return "", fmt.Errorf("a grant with until null = %s, want {\"leader\": true}", a)
	}
	revoke := fmt.Sprintf(`{"lease": %q, "leader": null, "sequence": %d, "fencingToken": 0}`, lease, s.next())
	if ack, a, err = s.lead(ctx, lease, revoke); err != nil {
		return "", fmt.Errorf("a message with leader null: %w (null reads as false: a revoke)", err)
	} else if ack.Leader || ack.Stale {
		return "", fmt.Errorf("a message with leader null = %s, want {\"leader\": false}: null reads as false, a revoke", a)
	}
	return "null read as absent: grants with null fields applied, leader null a revoke", nil
}

// wholeIntegers: an integer field holds a whole number in decimal notation
// within 64 bits; 1.0, 1e3 and a number beyond int64 are answered 400
// (not 422) and not applied.
func (s *suite) wholeIntegers(ctx context.Context) (string, error) {
	lease := s.lease("int")
	hi := time.Now().Add(protocol.MaxSequenceAhead / 2).UnixNano()
	ms := s.term.Milliseconds()
	bodies := []struct{ what, body string }{
		{"a sequence written 1767225600000000000.0", fmt.Sprintf(`{"lease": %q, "leader": true, "sequence": %d.0, "fencingToken": 1, "validForMillis": %d}`, lease, hi, ms)},
		{"a sequence in exponent notation", fmt.Sprintf(`{"lease": %q, "leader": true, "sequence": %de0, "fencingToken": 1, "validForMillis": %d}`, lease, hi, ms)},
		{"validForMillis 1e3", fmt.Sprintf(`{"lease": %q, "leader": true, "sequence": %d, "fencingToken": 1, "validForMillis": 1e3}`, lease, hi)},
		{"fencingToken 1.0", fmt.Sprintf(`{"lease": %q, "leader": true, "sequence": %d, "fencingToken": 1.0, "validForMillis": %d}`, lease, hi, ms)},
		{"a sequence above 2^63-1", fmt.Sprintf(`{"lease": %q, "leader": true, "sequence": 9223372036854775808, "fencingToken": 1, "validForMillis": %d}`, lease, ms)},
		{"a fencingToken below -2^63", fmt.Sprintf(`{"lease": %q, "leader": true, "sequence": %d, "fencingToken": -9223372036854775809, "validForMillis": %d}`, lease, hi, ms)},
	}
	for _, b := range bodies {
		a, err := s.call(ctx, http.MethodPut, protocol.LeasePathPrefix+lease, b.body, nil, 0)
		if err != nil {
			return "", err
		}
		if err := wantError(b.what, a, http.StatusBadRequest); err != nil {
			return "", err
		}
	}
	ret := []string{`{"cancel": false, "cancelWaitMillis": 1.0}`, `{"cancel": false, "cancelWaitMillis": 1e3}`, `{"cancel": false, "cancelWaitMillis": 9223372036854775808}`}
	for _, b := range ret {
		a, err := s.call(ctx, http.MethodPost, protocol.ReturnPath, b, nil, 0)
		if err != nil {
			return "", err
		}
		if err := wantError("return "+b, a, http.StatusBadRequest); err != nil {
			return "", err
		}
	}
	// Had a refused body been applied, its sequence (later) would make
	// this grant stale.
	if err := s.grant(ctx, lease, s.next()); err != nil {
		return "", fmt.Errorf("after integers that are not whole decimal int64s: %w (a refused body was applied)", err)
	}
	if err := s.revoke(ctx, lease, s.next()); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d bodies with 1.0, 1e3 or beyond 64 bits in an integer field answered 400, none applied", len(bodies)+len(ret)), nil
}

// negativeFencingToken: a grant's fencingToken is read as sent, a negative
// one too: the grant is applied.
func (s *suite) negativeFencingToken(ctx context.Context) (string, error) {
	lease := s.lease("fence")
	b, _ := json.Marshal(protocol.Leadership{Lease: lease, Leader: true, Sequence: s.next(), FencingToken: -1,
		Until: time.Now().Add(s.term), ValidForMillis: s.term.Milliseconds()})
	ack, a, err := s.lead(ctx, lease, string(b))
	if err != nil {
		return "", fmt.Errorf("a grant with fencingToken -1: %w", err)
	}
	if !ack.Leader || ack.Stale {
		return "", fmt.Errorf("a grant with fencingToken -1 = %s, want {\"leader\": true}: the token is applied as sent", a)
	}
	if err := s.revoke(ctx, lease, s.next()); err != nil {
		return "", err
	}
	return "a grant with fencingToken -1 applied", nil
}

// refusalOrder: of the refusals a message earns, the first in the order
// 400, 422, stale is answered: a Lease mismatch beats not genuine and
// stale, not genuine beats stale.
func (s *suite) refusalOrder(ctx context.Context) (string, error) {
	lease := s.lease("order")
	applied := s.next()
	if err := s.grant(ctx, lease, applied); err != nil {
		return "", err
	}
	older := applied - 1000
	ahead := time.Now().Add(protocol.MaxSequenceAhead + time.Minute).UnixNano()
	cases := []struct {
		what, body string
		code       int
	}{
		{"a stale grant valid for longer than the lease duration (stale and not genuine)", grantBody(lease, older, s.ld+time.Minute, time.Now().Add(s.term)), http.StatusUnprocessableEntity},
		{"a stale grant with an until beyond the lease duration (stale and not genuine)", grantBody(lease, older, s.term, time.Now().Add(s.ld+time.Minute)), http.StatusUnprocessableEntity},
		{"a stale grant naming another Lease (a Lease mismatch and stale)", grantBody("another-"+lease, older, s.term, time.Now().Add(s.term)), http.StatusBadRequest},
		{"a stale revoke naming another Lease (a Lease mismatch and stale)", revokeBody("another-"+lease, older), http.StatusBadRequest},
		{"a grant a minute ahead naming another Lease (a Lease mismatch and not genuine)", grantBody("another-"+lease, ahead, s.term, time.Now().Add(s.term)), http.StatusBadRequest},
	}
	for _, c := range cases {
		a, err := s.call(ctx, http.MethodPut, protocol.LeasePathPrefix+lease, c.body, nil, 0)
		if err != nil {
			return "", err
		}
		if err := wantError(c.what, a, c.code); err != nil {
			return "", err
		}
	}
	if err := s.revoke(ctx, lease, s.next()); err != nil {
		return "", fmt.Errorf("after the refusals: %w (a refused message was applied)", err)
	}
	return "a Lease mismatch answered 400 before not genuine and stale, not genuine 422 before stale", nil
}

// signatureHexCase: the signature's hex digits are read in either case; the
// header is the scheme, one space and the 64 digits.
func (s *suite) signatureHexCase(ctx context.Context) (string, error) {
	upper := s.thenAltered(func(r *http.Request) {
		scheme, sig, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		r.Header.Set("Authorization", scheme+" "+strings.ToUpper(sig))
	})
	path := protocol.DrainPath + "?waitMillis=0"
	a, err := s.call(ctx, http.MethodGet, path, "", upper, 0)
	if err != nil {
		return "", err
	}
	if a.code != http.StatusOK {
		return "", fmt.Errorf("a drain status signed with the signature's hex digits in upper case = %s, want 200: the digits are read in either case", a)
	}
	for _, bad := range []struct{ what, sep string }{{"two spaces", "  "}, {"a tab", "\t"}} {
		sg := s.thenAltered(func(r *http.Request) {
			scheme, sig, _ := strings.Cut(r.Header.Get("Authorization"), " ")
			r.Header.Set("Authorization", scheme+bad.sep+sig)
		})
		a, err := s.call(ctx, http.MethodGet, path, "", sg, 0)
		if err != nil {
			return "", err
		}
		if err := wantError("a drain status with "+bad.what+" between the scheme and the signature", a, http.StatusUnauthorized); err != nil {
			return "", err
		}
	}
	return "an upper-case signature accepted; two spaces or a tab after the scheme refused 401", nil
}

// waitMillisQuery: the query is form-encoded: + is a space, %2B a plus
// sign, white space around the number and a leading + are allowed.
func (s *suite) waitMillisQuery(ctx context.Context) (string, error) {
	queries := []string{"%2B0", "+0", "0+", "%200%20", "%30"}
	for _, q := range queries {
		a, err := s.call(ctx, http.MethodGet, protocol.DrainPath+"?waitMillis="+q, "", nil, 0)
		if err != nil {
			return "", err
		}
		if a.code != http.StatusOK {
			return "", fmt.Errorf("drain ?waitMillis=%s = %s, want 200: the query is form-encoded (+ a space, %%XX a byte), white space around the number and a leading + sign are allowed", q, a)
		}
		if a.took > atOnce {
			return "", fmt.Errorf("drain ?waitMillis=%s answered after %s, want at once: it is 0", q, a.took.Round(time.Millisecond))
		}
	}
	return fmt.Sprintf("%d waitMillis of 0 written with +, %%2B, spaces or escapes answered 200 at once", len(queries)), nil
}

// leaseDecoded: the {lease} segment is percent-decoded before it names the
// Lease.
func (s *suite) leaseDecoded(ctx context.Context) (string, error) {
	lease := s.lease("escaped")
	escaped := strings.Replace(lease, "-", "%2D", 1)
	seq := s.next()
	var ack protocol.LeadershipAck
	a, err := s.ok(ctx, http.MethodPut, protocol.LeasePathPrefix+escaped, grantBody(lease, seq, s.term, time.Now().Add(s.term)), 0, &ack)
	if err != nil {
		return "", fmt.Errorf("a grant of %s at the path segment %s: %w (the segment is percent-decoded: it names the body's Lease)", lease, escaped, err)
	}
	if !ack.Leader || ack.Stale {
		return "", fmt.Errorf("a grant of %s at the path segment %s = %s, want {\"leader\": true}", lease, escaped, a)
	}
	// The same Lease: a message below that sequence at the plain path is stale.
	if err := s.wantStale(ctx, lease, grantBody(lease, seq-1000, s.term, time.Now().Add(s.term)), true,
		"an older grant at the plain path after a grant at the escaped one"); err != nil {
		return "", fmt.Errorf("%w: the escaped segment %s must name the Lease %s", err, escaped, lease)
	}
	if err := s.revoke(ctx, lease, s.next()); err != nil {
		return "", err
	}
	return fmt.Sprintf("the segment %s read as the Lease %s", escaped, lease), nil
}

// afterTooLarge: after a 413, the app closes the connection or has read
// the body: a call sent next on that connection is answered as itself.
func (s *suite) afterTooLarge(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*callBound)
	defer cancel()
	conn, err := s.ep.Dial(ctx, "", "")
	if err != nil {
		return "", fmt.Errorf("dialing the app: %w", err)
	}
	defer func() { _ = conn.Close() }()
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	br := bufio.NewReader(conn)
	// send writes one signed call and reads its answer (closed whether
	// the connection is to close after it).
	send := func(method, path, body string) (a answer, closed bool, err error) {
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, err := http.NewRequest(method, s.base+path, rd)
		if err != nil {
			return a, false, err
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		protocol.Sign(req, s.t.Token, []byte(body), time.Now())
		if err := req.Write(conn); err != nil {
			return a, false, err
		}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			return a, false, err
		}
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		return answer{code: resp.StatusCode, header: resp.Header, body: b}, resp.Close, err
	}
	a, closed, err := send(http.MethodPost, protocol.ReturnPath, oversized(`{"cancel": false`))
	if err != nil {
		return "", fmt.Errorf("a return body over 64 KiB: %w", err)
	}
	if err := wantError("a return body over 64 KiB", a, http.StatusRequestEntityTooLarge); err != nil {
		return "", err
	}
	if closed {
		// Connection: close: the app closes it; nothing more is sent on it.
		return "413, then Connection: close", nil
	}
	a, _, err = send(http.MethodGet, protocol.DrainPath+"?waitMillis=0", "")
	switch {
	case err != nil && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)):
		return "413, then the connection closed", nil
	case err != nil:
		return "", fmt.Errorf("a drain status on the connection after the 413: %w (close the connection after a 413, or read the body first)", err)
	case a.code != http.StatusOK:
		return "", fmt.Errorf("a drain status on the connection kept open after a 413 = %s, want 200: the rest of the refused body was read as the next call; close the connection after a 413 (Connection: close) or read the body first", a)
	}
	return "413, then the next call on the connection answered 200 (the body was read)", nil
}

// stoppingWithoutWork: the fixture's stopping LEASE says no for a Lease
// whose leader work never began.
func (s *suite) stoppingWithoutWork(ctx context.Context) (string, error) {
	lease := s.lease("nowork")
	stopping, err := s.t.Leader.Stopping(ctx, lease)
	if err != nil {
		return "", fmt.Errorf("LeaderFixture.Stopping(%s) with no leader work begun: %w", lease, err)
	}
	if stopping {
		return "", fmt.Errorf("stopping %s = yes with no leader work begun for it, want no", lease)
	}
	return "stopping of a Lease never led: no", nil
}

// grantWithoutUntil: a grant without until leads for validForMillis from
// receipt.
func (s *suite) grantWithoutUntil(ctx context.Context) (string, error) {
	lease := s.lease("nountil")
	if err := s.grantFor(ctx, lease, s.next(), s.term, time.Time{}); err != nil {
		return "", fmt.Errorf("a grant without until: %w", err)
	}
	defer func() { _ = s.t.Leader.Release(ctx, lease) }()
	if err := s.leads(ctx, lease, fmt.Sprintf("after a grant without until, valid for %s", s.term)); err != nil {
		return "", fmt.Errorf("%w: without until, the term is validForMillis from receipt", err)
	}
	if err := s.grantFor(ctx, lease, s.next(), shortTerm, time.Time{}); err != nil {
		return "", fmt.Errorf("a renewal without until, valid for %s: %w", shortTerm, err)
	}
	renewed := time.Now()
	stopping, err := s.waitStopping(ctx, lease, shortTerm+callBound, nil)
	if err != nil {
		return "", err
	}
	if !stopping {
		return "", fmt.Errorf("leader work not told to stop %s after a renewal without until valid for %s", time.Since(renewed).Round(time.Millisecond), shortTerm)
	}
	if took := time.Since(renewed); took < shortTerm-clockSlack {
		return "", fmt.Errorf("leader work told to stop %s after a renewal without until valid for %s: before validForMillis ran out", took.Round(time.Millisecond), shortTerm)
	}
	_ = s.t.Leader.Release(ctx, lease)
	if err := s.revoke(ctx, lease, s.next()); err != nil {
		return "", err
	}
	return fmt.Sprintf("without until, led until validForMillis (%s) ran out", shortTerm), nil
}

// inFlightAfterReturn: after the returns, the drain status counts at most
// the claims held, and once their work has ended (Finish), none.
func (s *suite) inFlightAfterReturn(ctx context.Context) (string, error) {
	st, err := s.status(ctx)
	if err != nil {
		return "", err
	}
	if err := consistent(st); err != nil {
		return "", fmt.Errorf("after a plain return: %w", err)
	}
	// No bound on inFlight here beyond consistency: an app that fetches in
	// batches (worker/jetstream) may hold, for a moment, messages its
	// fetch brought after the return, which its agent hands back at once
	// (step 4); the rule is that inFlight reaches 0 once the work ended.
	during := st.InFlight
	if err := s.t.Fixture.Finish(ctx); err != nil {
		return "", fmt.Errorf("Fixture.Finish: %w", err)
	}
	st, _, err = s.drain(ctx, fmt.Sprintf("?waitMillis=%d", callBound.Milliseconds()/2), callBound/2)
	if err != nil {
		return "", err
	}
	if st.InFlight != 0 || !st.Drained {
		return "", fmt.Errorf("after a plain return, once the work of every claim had ended (finish), drain status %+v: want inFlight 0 and drained", st)
	}
	return fmt.Sprintf("inFlight %d after the return while the work ran, 0 and drained once it ended", during), nil
}
