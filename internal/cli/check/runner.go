package check

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"

	"github.com/handoff-dev/handoff/version"
)

// checkHintBase is where each check's hint lives: docs/checks.md, one
// heading per check ID, in the docs of this build's release (main for a
// development build: version.DocsBase).
var checkHintBase = version.DocsBase(version.Get()) + "docs/checks.md#"

// minKubernetes is the oldest supported Kubernetes (the README's, Chart.yaml's
// kubeVersion, the Makefile's KUBE_OLDEST).
const minKubernetes = "1.35.0"

// Check statuses, as checkResult.Status.
const (
	checkOK      = "ok"
	checkWarning = "warning"
	checkFailed  = "failed"
	checkSkipped = "skipped"
)

// healthCheck is one check, as data: the runner (runChecks) runs them in
// order and prints them for text and JSON alike.
type healthCheck struct {
	Category, ID, Description string
	// Warning: a failure is reported as a warning, and does not fail the run.
	Warning bool
	// Pre and Live say which mode runs the check.
	Pre, Live bool
	// Needs are the IDs of checks that must have passed (or warned) for this
	// one to run; else it is skipped.
	Needs []string
	// Run returns a detail for the output, and an error when the check
	// does not pass; errSkip (wrapped) skips it with the error's text.
	Run func(ctx context.Context, e *checkEnv) (detail string, err error)
}

// errSkip marks a check that does not apply.
var errSkip = errors.New("skipped")

// checkEnv is what the checks read, and what earlier checks found.
type checkEnv struct {
	client kubernetes.Interface
	// namespace is the workloads' namespace ("" for all with -A); the dry
	// run goes to dryRunNamespace.
	namespace, dryRunNamespace string
	now                        time.Time
	// Found by the checks that ran before.
	server  *utilversion.Version
	configs []admissionregistrationv1.MutatingWebhookConfiguration
	pods    []corev1.Pod // the injected pods, not finished
}

// checkResult is one check's result.
type checkResult struct {
	ID          string `json:"id"`
	Description string `json:"description"`
	Status      string `json:"status"`
	Detail      string `json:"detail,omitempty"`
	Hint        string `json:"hint,omitempty"`
}

// checkCategory is the results of one category, in order.
type checkCategory struct {
	Name   string        `json:"name"`
	Checks []checkResult `json:"checks"`
}

// checkReport is what check prints with -o json.
type checkReport struct {
	Success    bool            `json:"success"`
	Categories []checkCategory `json:"categories"`
}

// checkTimeout bounds each check.
const checkTimeout = 10 * time.Second

// runChecks runs the checks of a mode (pre or live) in order; each one
// within checkTimeout.
func runChecks(ctx context.Context, e *checkEnv, checks []healthCheck, pre bool) checkReport {
	r := checkReport{Success: true}
	passed := map[string]bool{}
	for _, c := range checks {
		if (pre && !c.Pre) || (!pre && !c.Live) {
			continue
		}
		res := checkResult{ID: c.ID, Description: c.Description}
		if i := slices.IndexFunc(c.Needs, func(id string) bool { return !passed[id] }); i >= 0 {
			res.Status, res.Detail = checkSkipped, "needs "+c.Needs[i]
		} else {
			cctx, cancel := context.WithTimeout(ctx, checkTimeout)
			detail, err := c.Run(cctx, e)
			cancel()
			res.Detail = detail
			switch {
			case errors.Is(err, errSkip):
				res.Status, res.Detail = checkSkipped, err.Error()
			case err != nil:
				res.Status, res.Detail, res.Hint = checkFailed, err.Error(), checkHintBase+c.ID
				if c.Warning {
					res.Status = checkWarning
					passed[c.ID] = true
				} else {
					r.Success = false
				}
			default:
				res.Status = checkOK
				passed[c.ID] = true
			}
		}
		if n := len(r.Categories); n == 0 || r.Categories[n-1].Name != c.Category {
			r.Categories = append(r.Categories, checkCategory{Name: c.Category})
		}
		cat := &r.Categories[len(r.Categories)-1]
		cat.Checks = append(cat.Checks, res)
	}
	return r
}

// writeChecks prints r as text (linkerd check's form) or JSON.
func writeChecks(w io.Writer, r checkReport, format string) error {
	if format == "json" {
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	marks := map[string]string{checkOK: "√", checkWarning: "‼", checkFailed: "×", checkSkipped: "-"}
	for i, cat := range r.Categories {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s\n%s\n", cat.Name, strings.Repeat("-", len(cat.Name)))
		for _, c := range cat.Checks {
			line := marks[c.Status] + " " + c.Description
			if c.Status == checkOK && c.Detail != "" {
				line += " (" + c.Detail + ")"
			}
			fmt.Fprintln(w, line)
			if c.Status != checkOK && c.Detail != "" {
				for l := range strings.SplitSeq(c.Detail, "\n") {
					fmt.Fprintf(w, "    %s\n", l)
				}
			}
			if c.Hint != "" {
				fmt.Fprintf(w, "    see %s for hints\n", c.Hint)
			}
		}
	}
	result := "√"
	if !r.Success {
		result = "×"
	}
	_, err := fmt.Fprintf(w, "\nStatus check results are %s\n", result)
	return err
}
