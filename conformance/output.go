package conformance

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"strings"
)

// jsonReport is the shape WriteJSON writes.
type jsonReport struct {
	Cases   []jsonCase `json:"cases"`
	Passed  int        `json:"passed"`
	Failed  int        `json:"failed"`
	Skipped int        `json:"skipped"`
}

type jsonCase struct {
	Case
	// Seconds is Case.Duration in seconds.
	Seconds float64 `json:"seconds"`
}

// WriteJSON writes r as one JSON object and a newline:
//
//	{"cases": [{"name": "auth/unsigned-refused", "result": "pass", "reason": "...", "seconds": 0.012}, ...],
//	 "passed": 27, "failed": 0, "skipped": 2}
//
// the cases in the order run; result is pass, fail or skip.
func (r Report) WriteJSON(w io.Writer) error {
	out := jsonReport{Cases: []jsonCase{}, Passed: r.Count(Pass), Failed: r.Count(Fail), Skipped: r.Count(Skip)}
	for _, c := range r.Cases {
		out.Cases = append(out.Cases, jsonCase{Case: c, Seconds: c.Duration.Seconds()})
	}
	return json.NewEncoder(w).Encode(out)
}

// The JUnit XML shape WriteJUnit writes: the one Jenkins, GitLab and
// GitHub's test reporters read.
type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Class   string        `xml:"classname,attr"`
	Name    string        `xml:"name,attr"`
	Time    string        `xml:"time,attr"`
	Failure *junitMessage `xml:"failure,omitempty"`
	Skipped *junitMessage `xml:"skipped,omitempty"`
	Output  string        `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// WriteJUnit writes r as JUnit XML: one testsuite named suite, a testcase
// per case (classname handoff.conformance.GROUP for the case's group, the
// part of its name before the slash), a failure or skipped element with the
// reason, times in seconds.
func (r Report) WriteJUnit(w io.Writer, suite string) error {
	s := junitSuite{Name: suite, Tests: len(r.Cases), Failures: r.Count(Fail), Skipped: r.Count(Skip)}
	total := 0.0
	for _, c := range r.Cases {
		group, _, _ := strings.Cut(c.Name, "/")
		jc := junitCase{Class: "handoff.conformance." + group, Name: c.Name, Time: fmt.Sprintf("%.3f", c.Duration.Seconds())}
		switch c.Result {
		case Fail:
			jc.Failure = &junitMessage{Message: c.Reason, Text: c.Reason}
		case Skip:
			jc.Skipped = &junitMessage{Message: c.Reason}
		default:
			jc.Output = c.Reason
		}
		total += c.Duration.Seconds()
		s.Cases = append(s.Cases, jc)
	}
	s.Time = fmt.Sprintf("%.3f", total)
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	e := xml.NewEncoder(w)
	e.Indent("", "  ")
	if err := e.Encode(junitSuites{Suites: []junitSuite{s}}); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// WriteCatalog writes Catalog as text, one line per case in the order Run
// runs them, "ID  GROUP  RULE (ANCHOR)", the columns aligned:
//
//	auth/replay-refused  idle  So a call read off the wire is refused when sent again (the nonce) (docs/protocol.md#signed-calls)
func WriteCatalog(w io.Writer) error {
	cases := Catalog()
	id, group := 0, 0
	for _, c := range cases {
		id, group = max(id, len(c.ID)), max(group, len(c.Group))
	}
	var b strings.Builder
	for _, c := range cases {
		fmt.Fprintf(&b, "%-*s  %-*s  %s (%s)\n", id, c.ID, group, c.Group, c.Rule, c.Anchor)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteCatalogJSON writes Catalog as one JSON object and a newline:
//
//	{"cases": [{"id": "transport/socket", "group": "idle", "rule": "...", "anchor": "docs/protocol.md#transport"}, ...]}
//
// the cases in the order Run runs them.
func WriteCatalogJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(struct {
		Cases []CaseInfo `json:"cases"`
	}{Catalog()})
}
