package conformance

import "context"

// CaseInfo describes one case of the suite, as Catalog lists it.
type CaseInfo struct {
	// ID names the case in a Report (Case.Name): "GROUP/what", like
	// "auth/replay-refused". IDs are unique and do not change.
	ID string `json:"id"`
	// Group is the set-up the case runs in (the groups run in a fixed
	// order; see the package documentation): "idle", "leader",
	// "restart", "drain", "return", "cancel", "cancel-ended",
	// "return-unstopped" or "unstarted".
	Group string `json:"group"`
	// Rule is the rule the case checks, one line quoted from
	// docs/protocol.md ("…" where words are left out).
	Rule string `json:"rule"`
	// Anchor is where docs/protocol.md states the rule: the path from the
	// repository's root and a heading's fragment, like
	// "docs/protocol.md#signed-calls".
	Anchor string `json:"anchor"`
}

// protocolDoc is the document every case's Rule is quoted from.
const protocolDoc = "docs/protocol.md"

// Catalog returns every case, in the order Run runs them.
func Catalog() []CaseInfo {
	out := make([]CaseInfo, 0, len(table))
	for _, e := range ordered() {
		out = append(out, CaseInfo{ID: e.id, Group: e.group, Rule: e.rule, Anchor: protocolDoc + "#" + e.anchor})
	}
	return out
}

// Cases returns the IDs of every case, in the order Run runs them.
func Cases() []string {
	out := make([]string, 0, len(table))
	for _, e := range ordered() {
		out = append(out, e.id)
	}
	return out
}

// entry is one case of the table.
type entry struct {
	id    string
	group string // a group's name: the set-up the case runs in
	// rule is quoted from protocolDoc, in the section of anchor (a
	// heading's fragment, without the '#'), with backquotes and ** left
	// out; "…" joins parts of the section quoted in order.
	rule   string
	anchor string
	// run runs the case on the app its group set up: it returns the reason
	// the case passed, or an error saying why it failed (errSkip: skipped).
	run func(s *suite, ctx context.Context) (string, error)
}

// table is every case of the suite, grouped, in the order they run.
// Adding a case is adding its entry here, in its group, and its run
// function.
var table = []entry{
	// idle: the app as given, or with a Fixture a fresh process; each case
	// finds it not stopping and leaves it so (runIdle).
	{"transport/socket", "idle", "The server makes the socket itself … It sets the socket's mode to 0666", "transport", (*suite).transportSocket},
	{"auth/unsigned-refused", "idle", "refuses the call with 401 … doing nothing, when a header is missing or malformed, the scheme is another", "signed-calls", (*suite).authUnsigned},
	{"auth/bad-signature-refused", "idle", "refuses the call with 401 … doing nothing, when … the signature is not the token's over this call", "signed-calls", (*suite).authBadSignature},
	{"auth/stale-timestamp-refused", "idle", "then refuses (401) a timestamp more than 30 s from its own clock, either way", "signed-calls", (*suite).authStale},
	{"auth/replay-refused", "idle", "So a call read off the wire is refused when sent again (the nonce)", "signed-calls", (*suite).authReplay},
	{"auth/scheme-in-any-case", "idle", "the scheme is another (read in any case; a Bearer token is not accepted)", "signed-calls", (*suite).authSchemeCase},
	{"bad-request/drain-waitMillis", "idle", "a negative one, one that is not a whole number (1.5, 1e3, soon), or waitMillis given twice is answered 400", "step-3-drain-long-poll", (*suite).badWaitMillis},
	{"bad-request/return-body", "idle", "Request bodies are one JSON value of at most 64 KiB … a larger body is answered 413 naming the limit", "signed-calls", (*suite).badReturn},
	{"bad-request/leadership-body", "idle", "A body lease that differs from the path gets 400.", "leadership-grants-about-every-retry-period", (*suite).badLeadership},
	{"bad-request/unknown-path-or-method", "idle", "Paths and methods the protocol does not define are never called by the sidecar. The app answers them with a 4xx and does nothing", "conventions", (*suite).unknownCall},
	{"leadership/not-genuine-refused-422", "idle", "Messages that cannot be genuine are refused with 422 and not applied (no sequence recorded, the term unchanged)", "leadership-grants-about-every-retry-period", (*suite).notGenuine},
	{"leadership/ordered-by-sequence", "idle", "The app does not apply a message whose sequence is not greater than the last it applied for that Lease, and answers it at once", "leadership-grants-about-every-retry-period", (*suite).sequence},
	{"leadership/first-message-applied", "idle", "The first message for a Lease is applied whatever its number.", "leadership-grants-about-every-retry-period", (*suite).firstMessage},
	{"leadership/revoke-of-unknown-lease-acked", "idle", "a Lease the app does not know is acked at once", "step-5-revoke-ack", (*suite).revokeUnknown},
	{"json/null-reads-as-absent", "idle", "A null value MUST be read as the field absent: its zero value", "edges-of-the-wire", (*suite).nullsAbsent},
	{"json/integers-whole-decimal-int64", "idle", "A number with a fraction or an exponent (1.0, 1e3), even of a whole value, a number beyond 64 bits … MUST be answered 400 naming the field, and nothing of the message applied", "edges-of-the-wire", (*suite).wholeIntegers},
	{"leadership/negative-fencingToken-applied", "idle", "A grant's fencingToken MUST be applied as sent, a negative one too", "edges-of-the-wire", (*suite).negativeFencingToken},
	{"leadership/which-refusal-wins", "idle", "So a message both stale and not genuine is answered 422, and a Lease mismatch 400 whatever its sequence.", "edges-of-the-wire", (*suite).refusalOrder},
	{"auth/signature-hex-any-case", "idle", "Its hex digits MUST be read in either case … anything else between them (two spaces, a tab) MUST be refused 401.", "edges-of-the-wire", (*suite).signatureHexCase},
	{"bad-request/waitMillis-form-encoded", "idle", "The query MUST be read as application/x-www-form-urlencoded … so +0, %2B0 and %200%20 are all 0.", "edges-of-the-wire", (*suite).waitMillisQuery},
	{"leadership/lease-segment-percent-decoded", "idle", "The {lease} segment MUST be percent-decoded before it names the Lease", "edges-of-the-wire", (*suite).leaseDecoded},
	{"http/after-413-close-or-read", "idle", "An app that answers a call (a 413, a 401, a 404) without reading its whole body MUST close the connection after that answer, saying Connection: close; else it MUST read the rest of the body first.", "http-what-the-sidecar-sends-and-accepts", (*suite).afterTooLarge},

	// leader: as idle, with a LeaderFixture (runLeader).
	{"leadership/stale-revoke-leaves-leader-work", "leader", "The app does not apply a message whose sequence is not greater than the last it applied for that Lease", "leadership-grants-about-every-retry-period", (*suite).staleRevoke},
	{"leadership/revoke-acked-after-leader-work-stopped", "leader", "The app ends the term at once and answers 200 only after all its leader work for that Lease has stopped", "step-5-revoke-ack", (*suite).revokeAck},
	{"leadership/term-ends-at-validForMillis", "leader", "The app leads until the earlier of until and receipt + validForMillis, measured on its own clock", "leadership-grants-about-every-retry-period", (*suite).termValidFor},
	{"leadership/term-ends-at-until", "leader", "The app leads until the earlier of until and receipt + validForMillis, measured on its own clock", "leadership-grants-about-every-retry-period", (*suite).termUntil},
	{"leadership/grant-without-until", "leader", "A grant without until (absent or null) MUST be read as bounded by validForMillis alone", "edges-of-the-wire", (*suite).grantWithoutUntil},
	{"fixture/stopping-without-leader-work-says-no", "leader", "no when no leader work began for the Lease", "the-fixture-contract", (*suite).stoppingWithoutWork},

	// restart: a restart by the Fixture, in each case.
	{"restart/new-instance", "restart", "instance (optional) names the app process, new for each process", "what-the-app-serves-sidecar--app", (*suite).newInstance},
	{"auth/signed-before-start-refused", "restart", "A receiver MUST take the time … when it starts, before it opens its socket or port, and MUST refuse with 401 every call whose timestamp is earlier, with an error that begins signed before this receiver started", "signed-calls", (*suite).authBeforeStart},

	// drain: stop-claiming, on the app as given, or on a fresh process
	// holding `held` claims (drainGroup); the cases after stop-claiming
	// are skipped when it did not stop claiming.
	{"stop-claiming/answers-stopping", "drain", "the sidecar first calls stop-claiming. From then on the app must claim nothing new", "step-2-stop-claiming", (*suite).stopClaimingCase},
	{"stop-claiming/idempotent", "drain", "the sidecar first calls stop-claiming … It is idempotent.", "step-2-stop-claiming", (*suite).stopIdempotent},
	{"drain/waitMillis-0-answers-at-once", "drain", "absent, empty or 0 answers at once", "step-3-drain-long-poll", needsClaims((*suite).drainAtOnce)},
	{"drain/long-poll-waits-waitMillis", "drain", "drain status once drained or after N ms", "what-the-app-serves-sidecar--app", needsClaims((*suite).drainWaits)},
	{"drain/runningMillis-ages-oldest-claim", "drain", "runningMillis (optional) how long the oldest claim in progress has been in progress, in milliseconds", "what-the-app-serves-sidecar--app", needsClaims((*suite).runningMillis)},
	{"leadership/continues-during-drain", "drain", "The app keeps applying them after stop-claiming, and its leader work goes on until the revoke or the term's end.", "leadership-grants-about-every-retry-period", (*suite).leadDuringDrain},
	{"drain/long-poll-returns-when-drained", "drain", "drain status once drained or after N ms", "what-the-app-serves-sidecar--app", needsClaims((*suite).drainReturnsDrained)},
	{"drain/waitMillis-above-bound", "drain", "any value above 30000, however large, waits at most 30000 … Once the app is drained, any value answers at once.", "step-3-drain-long-poll", (*suite).drainLarge},

	// return: a fresh process holding `held` claims, after stop-claiming.
	{"return/counts", "return", "The app hands back every unfinished claim now", "step-4-return-at-the-drain-deadline", (*suite).returnCounts},
	{"return/safe-to-repeat", "return", "Every return MUST be answered, however many came before: each hands back again what the app still has claimed, and its returned counts what that call handed back", "edges-of-the-wire", (*suite).returnRepeat},
	{"return/in-flight-until-work-ends", "return", "either way, once the work of every claim has ended, inFlight MUST be 0 and drained true", "edges-of-the-wire", (*suite).inFlightAfterReturn},

	// cancel: a fresh process holding cancelHeld claims whose work
	// ignores the cancel, after stop-claiming.
	{"return/cancel-then-return", "cancel", "The app first cancels in-flight work … and waits up to cancelWaitMillis for it to finish, then hands back what is left", "step-4-return-at-the-drain-deadline", (*suite).cancelReturn},

	// cancel-ended: a fresh process holding cancelHeld claims whose work
	// ends at the cancel (CancelFixture), after stop-claiming.
	{"return/cancel-hands-back-canceled-work", "cancel-ended", "The app MUST hand back again after each claim that ends from the moment the return call's own hand-back starts, not from the moment the call arrives: a claim whose work ends during the cancel wait is the return call's to hand back and to count.", "step-4-return-at-the-drain-deadline", (*suite).cancelHandsBack},

	// return-unstopped: a fresh process holding 1 claim, no stop-claiming.
	{"return/stops-claiming", "return-unstopped", "With either fallback the app also stops claiming, if it had not (stop-claiming may never have reached it)", "step-4-return-at-the-drain-deadline", (*suite).returnStops},

	// unstarted: a fresh process holding 1 claim started and
	// unstartedHeld unstarted (UnstartedFixture).
	{"stop-claiming/hands-back-unstarted-at-once", "unstarted", "Claims held but not started (unstarted) are handed back at once, not at the drain deadline", "step-2-stop-claiming", (*suite).handsBackUnstarted},
}

// group is a set-up cases run in: run sets the app up, runs cases (the
// table's entries of the group, in order) and records each case's result,
// failed or skipped when the set-up fails or lacks a fixture.
type group struct {
	name string
	run  func(s *suite, ctx context.Context, cases []entry)
}

// groups are the groups in the order they run: stop-claiming is one-way
// for an app process, so the groups on a process that has not stopped
// come first.
var groups = []group{
	{"idle", func(s *suite, ctx context.Context, cases []entry) {
		for _, c := range cases {
			s.runIdle(ctx, c.id, c.bound(s))
		}
	}},
	{"leader", func(s *suite, ctx context.Context, cases []entry) {
		for _, c := range cases {
			s.runLeader(ctx, c.id, c.bound(s))
		}
	}},
	{"restart", func(s *suite, ctx context.Context, cases []entry) {
		for _, c := range cases {
			s.run(ctx, c.id, c.bound(s))
		}
	}},
	{"drain", (*suite).drainGroup},
	{"return", (*suite).returnGroup},
	{"cancel", (*suite).cancelGroup},
	{"cancel-ended", (*suite).cancelEndedGroup},
	{"return-unstopped", (*suite).returnUnstoppedGroup},
	{"unstarted", (*suite).unstartedGroup},
}

// bound is e.run on s.
func (e entry) bound(s *suite) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) { return e.run(s, ctx) }
}

// ordered is the table in the order Run runs it: by group, in the order of
// groups, then as listed.
func ordered() []entry {
	out := make([]entry, 0, len(table))
	for _, g := range groups {
		out = append(out, casesOf(g.name)...)
	}
	return out
}

// casesOf is the table's entries of the group named name, as listed.
func casesOf(name string) []entry {
	var out []entry
	for _, e := range table {
		if e.group == name {
			out = append(out, e)
		}
	}
	return out
}

// ids is the IDs of cases.
func ids(cases []entry) []string {
	out := make([]string, len(cases))
	for i, c := range cases {
		out[i] = c.id
	}
	return out
}
