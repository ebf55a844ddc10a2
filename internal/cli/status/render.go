package status

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"
)

// writeStatus prints r as format: "" (text), "wide", "json" (one line,
// so that --watch prints one object a line) or "yaml".
func writeStatus(w io.Writer, r Report, format string) error {
	switch format {
	case "json":
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "---\n%s", b)
		return err
	}
	wide := format == "wide"
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Namespace %s, pods %s, at %s\n", r.Namespace, r.Selector, r.Time.Format(time.RFC3339))
	for _, warning := range r.Warnings {
		fmt.Fprintf(tw, "Warning: %s\n", warning)
	}
	fmt.Fprintln(tw)
	if len(r.Leases) == 0 {
		fmt.Fprintln(tw, "No Leases: no injected pod names one.")
	} else {
		head := "LEASE\tKIND\tSTATE\tHOLDER\tTERM LEFT\tFENCING TOKEN"
		if wide {
			head += "\tHOLDER IDENTITY\tRENEWED\tLEASE DURATION"
		}
		fmt.Fprintln(tw, head)
		for _, l := range r.Leases {
			holder, left := dash(l.HolderPod), "-"
			if l.HolderPod == "" && l.HolderIdentity != "" {
				holder = "(not an injected pod)"
			}
			if l.State == leaseHeld {
				left = fmt.Sprintf("%.1fs", l.TermLeftSeconds)
			}
			line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%d", l.Name, l.Kind, l.State, holder, left, l.FencingToken)
			if wide {
				renewed := "-"
				if l.RenewTime != nil {
					renewed = l.RenewTime.Format(time.RFC3339Nano)
				}
				line += fmt.Sprintf("\t%s\t%s\t%ds", dash(l.HolderIdentity), renewed, l.LeaseDurationSeconds)
			}
			fmt.Fprintln(tw, line)
		}
	}
	for _, s := range r.ShardSets {
		fmt.Fprintf(tw, "\nShards %s: %d shards, %d peers up, fair share %d\n", s.Shards, len(s.Leases), s.Peers, s.FairShare)
		fmt.Fprintln(tw, "POD\tSHARDS\tCOUNT")
		for _, o := range s.Owners {
			fmt.Fprintf(tw, "%s\t%s\t%d\n", o.Pod, strings.Join(o.Shards, ","), len(o.Shards))
		}
		if len(s.Unowned) > 0 {
			fmt.Fprintf(tw, "(held by none)\t%s\t%d\n", strings.Join(s.Unowned, ","), len(s.Unowned))
		}
	}
	fmt.Fprintln(tw)
	if len(r.Pods) == 0 {
		fmt.Fprintln(tw, "No injected pods.")
		return tw.Flush()
	}
	head := "POD\tVERSION\tPHASE\tREADY\tLEASES\tLAST HANDOVER"
	if wide {
		head += "\tDELETION COST"
	}
	fmt.Fprintln(tw, head)
	for _, p := range r.Pods {
		last := "-"
		if h := p.LastHandover; h != nil {
			end := h.Steps[len(h.Steps)-1]
			last = fmt.Sprintf("%s, %s ago", h.Outcome, r.Time.Sub(end.Time).Round(time.Second))
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%t\t%s\t%s", p.Name, p.Version, p.Phase, p.Ready, dash(strings.Join(p.Leases, ",")), last)
		if wide {
			cost := "-"
			if p.DeletionCost != nil {
				cost = strconv.Itoa(int(*p.DeletionCost))
			}
			line += "\t" + cost
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// The steps of each pod's last handover: always for a drain under way,
	// for every pod with -o wide.
	for _, p := range r.Pods {
		if h := p.LastHandover; h != nil && (wide || p.Phase == phaseShuttingDown) {
			fmt.Fprintf(w, "\n%s, last handover (%s):\n", p.Name, h.Outcome)
			for _, s := range h.Steps {
				count := ""
				if s.Count > 1 {
					count = fmt.Sprintf(" (x%d)", s.Count)
				}
				fmt.Fprintf(w, "  %s  %-22s %s%s\n", s.Time.Format("15:04:05"), s.Reason, s.Message, count)
			}
		}
	}
	return nil
}

func dash(s string) string { return cmp.Or(s, "-") }
