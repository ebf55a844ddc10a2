package status

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/handoff-dev/handoff/protocol"
)

// view is a fixed view: a held role Lease, a free shard, a shard set, a
// pod running and one shutting down with its handover's steps.
func view() Report {
	at := func(s int) time.Time { return now.Add(time.Duration(s) * time.Second) }
	return Report{Time: now, Namespace: "shop", Selector: "handoff.dev/injected=true",
		Leases: []LeaseView{
			{Name: "orders-0", Kind: protocol.LeaseKindPartition, State: leaseFree, FencingToken: 3},
			{Name: "orders-leader", Kind: protocol.LeaseKindRole, State: leaseHeld, HolderIdentity: "orders-a_uid", HolderPod: "orders-a",
				TermLeftSeconds: 12.3, FencingToken: 4, RenewTime: ptr.To(at(-3)), LeaseDurationSeconds: 15},
		},
		ShardSets: []ShardSetView{{Shards: "orders-{0..1}", Leases: []string{"orders-0", "orders-1"}, Peers: 2, FairShare: 1,
			Owners: []ShardOwner{{Pod: "orders-b", Shards: []string{"orders-1"}}}, Unowned: []string{"orders-0"}}},
		Pods: []PodView{
			{Name: "orders-a", Version: "v0.2.0", Phase: phaseRunning, PhaseFrom: phaseFromSidecar, Ready: true, Leases: []string{"orders-leader"},
				DeletionCost: ptr.To[int32](10010)},
			{Name: "orders-b", Version: "unknown", Phase: phaseShuttingDown, PhaseFrom: phaseInferred, Leases: []string{"orders-1"},
				LastHandover: &HandoverView{Outcome: handoverInProgress, Steps: []StepView{
					{Reason: "DrainStarted", Time: at(-10), Message: "draining 2 claims"},
					{Reason: "DrainProgress", Time: at(-5), Message: "1 left", Count: 3}}}},
		},
		Warnings: []string{"only the first 5000 Events were read"},
	}
}

// writeStatus, for each format, from a view alone.
func TestWriteStatus(t *testing.T) {
	for _, tc := range []struct {
		format, want string
	}{
		{"", `Namespace shop, pods handoff.dev/injected=true, at 2026-12-07T03:00:00Z
Warning: only the first 5000 Events were read

LEASE          KIND       STATE  HOLDER    TERM LEFT  FENCING TOKEN
orders-0       partition  Free   -         -          3
orders-leader  role       Held   orders-a  12.3s      4

Shards orders-{0..1}: 2 shards, 2 peers up, fair share 1
POD             SHARDS    COUNT
orders-b        orders-1  1
(held by none)  orders-0  1

POD       VERSION  PHASE         READY  LEASES         LAST HANDOVER
orders-a  v0.2.0   Running       true   orders-leader  -
orders-b  unknown  ShuttingDown  false  orders-1       InProgress, 5s ago

orders-b, last handover (InProgress):
  02:59:50  DrainStarted           draining 2 claims
  02:59:55  DrainProgress          1 left (x3)
`},
		{"wide", `Namespace shop, pods handoff.dev/injected=true, at 2026-12-07T03:00:00Z
Warning: only the first 5000 Events were read

LEASE          KIND       STATE  HOLDER    TERM LEFT  FENCING TOKEN  HOLDER IDENTITY  RENEWED               LEASE DURATION
orders-0       partition  Free   -         -          3              -                -                     0s
orders-leader  role       Held   orders-a  12.3s      4              orders-a_uid     2026-12-07T02:59:57Z  15s

Shards orders-{0..1}: 2 shards, 2 peers up, fair share 1
POD             SHARDS    COUNT
orders-b        orders-1  1
(held by none)  orders-0  1

POD       VERSION  PHASE         READY  LEASES         LAST HANDOVER       DELETION COST
orders-a  v0.2.0   Running       true   orders-leader  -                   10010
orders-b  unknown  ShuttingDown  false  orders-1       InProgress, 5s ago  -

orders-b, last handover (InProgress):
  02:59:50  DrainStarted           draining 2 claims
  02:59:55  DrainProgress          1 left (x3)
`},
	} {
		var out strings.Builder
		if err := writeStatus(&out, view(), tc.format); err != nil {
			t.Fatal(err)
		}
		if out.String() != tc.want {
			t.Errorf("-o %q:\n%s\nwant\n%s", tc.format, out.String(), tc.want)
		}
	}
	// json: one object a line (for --watch), the view's shape; yaml: the
	// same fields, after a document separator.
	var out strings.Builder
	if err := writeStatus(&out, view(), "json"); err != nil {
		t.Fatal(err)
	}
	if strings.Count(out.String(), "\n") != 1 {
		t.Errorf("-o json wrote %q, want one line", out.String())
	}
	var back Report
	if err := json.Unmarshal([]byte(out.String()), &back); err != nil || back.Pods[1].LastHandover.Steps[1].Count != 3 || *back.Pods[0].DeletionCost != 10010 {
		t.Errorf("-o json does not read back: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := writeStatus(&out, view(), "yaml"); err != nil {
		t.Fatal(err)
	}
	var y map[string]any
	if !strings.HasPrefix(out.String(), "---\n") || yaml.Unmarshal([]byte(out.String()[4:]), &y) != nil || y["namespace"] != "shop" {
		t.Errorf("-o yaml:\n%s\nwant a document with namespace: shop", out.String())
	}
}

// With no Leases and no pods, the text says so.
func TestWriteStatusEmpty(t *testing.T) {
	var out strings.Builder
	if err := writeStatus(&out, Report{Time: now, Namespace: "shop", Selector: "s"}, ""); err != nil {
		t.Fatal(err)
	}
	want := "Namespace shop, pods s, at 2026-12-07T03:00:00Z\n\nNo Leases: no injected pod names one.\n\nNo injected pods.\n"
	if out.String() != want {
		t.Errorf("empty view:\n%q\nwant\n%q", out.String(), want)
	}
}
