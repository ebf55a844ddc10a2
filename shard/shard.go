// Package shard shares a shard set (N partition Leases) out among the M pods
// that are up: pure assignment, no API. Every pod computes the same
// assignment from the same inputs (the shard names, and each pod that is up
// with its revision, creation time and the shards it says it holds), so they
// agree on who should hold each shard without talking to each other.
//
// The assignment is sticky: a shard stays with the pod that holds it, and
// only the shards no pod that is up holds (their holder left, or is being
// deleted) move, to the least loaded pods. While more than one revision is
// up (a rolling update), those go to the pods of the newest revision first,
// the ones the update keeps, and no pod gives up a shard for balance, so
// that each replaced pod's shards move once, to a pod that stays. With one
// revision up, the pods above their fair share shed the excess to the pods
// below it (a scale-out), with the fewest moves. docs/shards.md describes
// the rules and how the sidecar uses them.
package shard

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Share is the fair share of n shards over m pods, ceil(n/m): the most one
// pod is assigned, but for what a pod already holds while more than one
// revision is up. It is 0 when m is 0 or less.
func Share(n, m int) int {
	if m <= 0 || n <= 0 {
		return 0
	}
	return (n + m - 1) / m
}

// Score is the rendezvous score of shard for pod: FNV-1a over both names
// (with a separator, so "a"+"bc" differs from "ab"+"c"), then the 64-bit
// finalizer of MurmurHash3 to spread the bits of near-equal names. The
// assignment breaks its ties by it: which shards a pod keeps when it sheds
// some, which free shard goes to which of the pods that have room.
func Score(shard, pod string) uint64 {
	h := fnv.New64a()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(shard)))
	_, _ = h.Write(n[:])
	_, _ = h.Write([]byte(shard))
	_, _ = h.Write([]byte(pod))
	return fmix64(h.Sum64())
}

func fmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

// Peer is one pod that is up, as the assignment sees it.
type Peer struct {
	// Name is the pod's name.
	Name string
	// Revision is the pod's revision (its pod-template-hash or
	// controller-revision-hash label), "" without one. The revision of the
	// newest peer (Created, then the greater Revision) is the newest
	// revision: the pods a rolling update keeps.
	Revision string
	// Created is the pod's creation time.
	Created time.Time
	// Held are the shards the pod says it holds (what it published); names
	// not in the shard set are ignored.
	Held []string
}

// NewestRevision is the revision of the newest of peers (latest Created;
// ties by the greater Revision, so that every pod breaks them alike), ""
// without peers.
func NewestRevision(peers []Peer) string {
	var newest *Peer
	for i := range peers {
		p := &peers[i]
		if newest == nil || p.Created.After(newest.Created) ||
			(p.Created.Equal(newest.Created) && p.Revision > newest.Revision) {
			newest = p
		}
	}
	if newest == nil {
		return ""
	}
	return newest.Revision
}

// Assign maps every shard to the peer it is assigned to; with no peers it
// returns an empty map. Shards are names (Lease names), duplicates count
// once; peers are the pods that are up, a name given twice counting once
// (the first); the order of either does not matter.
//
// The rules, with n shards over m peers (docs/shards.md):
//   - A shard one peer holds (Peer.Held) stays with it. A shard two peers
//     say they hold (one has not yet published that it let it go) counts
//     as held by neither.
//   - With one revision up, each peer has a target, floor(n/m) or
//     ceil(n/m), the ceil going to the peers that hold ceil(n/m) or more
//     first, then by name: a peer above its target keeps the target's
//     worth of its shards of highest Score and sheds the rest; the shards
//     no peer keeps go to the peers below their target.
//   - With more than one revision up, no peer sheds. The shards no peer
//     holds go to the least loaded peers of the newest revision (ties by
//     name), up to ceil(n/m) each, then to the least loaded other peers up
//     to ceil(n/m), which leaves room for all of them.
//   - Which free shard goes to which of the peers given room is
//     bounded-load rendezvous: (shard, peer) pairs in descending Score.
//
// No peer is assigned more than ceil(n/m) beyond what it holds, and a
// shard's holder gaining or losing it as assigned does not change where
// the others are assigned.
func Assign(shards []string, peers []Peer) map[string]string {
	shards = distinct(shards)
	ps := distinctPeers(peers)
	out := make(map[string]string, len(shards))
	m, n := len(ps), len(shards)
	if m == 0 || n == 0 {
		return out
	}
	inSet := make(map[string]bool, n)
	for _, s := range shards {
		inSet[s] = true
	}
	// Who holds each shard: a peer index, or -1 when two claim it.
	holder := make(map[string]int, n)
	for i, p := range ps {
		for _, s := range distinct(p.Held) {
			if !inSet[s] {
				continue
			}
			if j, ok := holder[s]; ok && j != i {
				holder[s] = -1
			} else {
				holder[s] = i
			}
		}
	}
	kept := make([][]string, m)
	var free []string
	for _, s := range shards {
		if i, ok := holder[s]; ok && i >= 0 {
			kept[i] = append(kept[i], s)
		} else {
			free = append(free, s)
		}
	}
	room := make([]int, m) // how many free shards each peer is given
	newest := NewestRevision(ps)
	rollout := slices.ContainsFunc(ps, func(p Peer) bool { return p.Revision != newest })
	if !rollout {
		target := targets(kept, n)
		for i, p := range ps {
			if len(kept[i]) > target[i] {
				slices.SortFunc(kept[i], func(a, b string) int {
					if c := cmp.Compare(Score(b, p.Name), Score(a, p.Name)); c != 0 {
						return c
					}
					return cmp.Compare(a, b)
				})
				free = append(free, kept[i][target[i]:]...)
				kept[i] = kept[i][:target[i]]
			}
			room[i] = target[i] - len(kept[i])
		}
	} else {
		var mine, others []int
		for i, p := range ps {
			if p.Revision == newest {
				mine = append(mine, i)
			} else {
				others = append(others, i)
			}
		}
		share := Share(n, m)
		left := fill(room, kept, mine, share, len(free))
		fill(room, kept, others, share, left)
	}
	for i, p := range ps {
		for _, s := range kept[i] {
			out[s] = p.Name
		}
	}
	rendezvous(out, free, ps, room)
	return out
}

// targets gives each peer floor(n/m) or ceil(n/m) shards, summing to n:
// the ceil to n mod m peers, those that hold ceil(n/m) or more first, then
// by name (ps is sorted by name). Any such choice moves the fewest shards
// (a peer below ceil(n/m) gains as much either way), and this one stays
// the same while the shards move: a peer given the ceil never drops below
// it, and one not given it never rises to it.
func targets(kept [][]string, n int) []int {
	m := len(kept)
	ceil := Share(n, m)
	order := make([]int, m)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Compare(boolInt(len(kept[b]) >= ceil), boolInt(len(kept[a]) >= ceil))
	})
	t := make([]int, m)
	for rank, i := range order {
		t[i] = n / m
		if rank < n%m {
			t[i]++
		}
	}
	return t
}

// fill gives up to k free shards to the peers of group (indices, in name
// order), one at a time to the least loaded (what it keeps and was given;
// ties by name) that is under limit, and returns how many are left.
func fill(room []int, kept [][]string, group []int, limit, k int) int {
	for ; k > 0; k-- {
		best := -1
		for _, i := range group {
			load := len(kept[i]) + room[i]
			if load < limit && (best < 0 || load < len(kept[best])+room[best]) {
				best = i
			}
		}
		if best < 0 {
			return k
		}
		room[best]++
	}
	return 0
}

// rendezvous assigns free shards to the peers with room, (shard, peer)
// pairs in descending Score (ties by names), each peer taking at most its
// room: bounded-load rendezvous hashing.
func rendezvous(out map[string]string, free []string, ps []Peer, room []int) {
	type pair struct {
		score       uint64
		shard, peer int
	}
	var pairs []pair
	for i, s := range free {
		for j := range ps {
			if room[j] > 0 {
				pairs = append(pairs, pair{Score(s, ps[j].Name), i, j})
			}
		}
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		if c := cmp.Compare(free[a.shard], free[b.shard]); c != 0 {
			return c
		}
		return cmp.Compare(ps[a.peer].Name, ps[b.peer].Name)
	})
	done := make([]bool, len(free))
	for _, pr := range pairs {
		if done[pr.shard] || room[pr.peer] == 0 {
			continue
		}
		out[free[pr.shard]] = ps[pr.peer].Name
		done[pr.shard] = true
		room[pr.peer]--
	}
}

// Plan is what one pod does with the shard set now.
type Plan struct {
	// Share is the fair share, ceil(N/M) for the M peers; 0 when this pod
	// is not one of them. The pod competes for no more shards than that.
	Share int
	// Assigned are the shards assigned to this pod, in the shard set's
	// order: at most Share, or what it holds while more than one revision
	// is up.
	Assigned []string
	// Shed are the shards this pod holds that are not assigned to it and
	// that it has published that it holds (or all it holds, when it is not
	// up): it revokes and releases them, so their assigned pods can take
	// them. A shard it has taken and not yet published is not shed: the
	// assignment that did not count it changes once it is published.
	Shed []string
	// Try are the shards assigned to this pod that it does not hold: it
	// competes for them, taking each the moment its Lease is free.
	Try []string
}

// PlanFor is self's Plan, given the shard set, the peers that are up (self
// among them, or self takes nothing and sheds everything it holds) with
// what each published that it holds, and the shards self holds now (which
// may be ahead of what it published). The slices are in the order of
// shards.
func PlanFor(self string, shards []string, peers []Peer, held []string) Plan {
	assigned := Assign(shards, peers)
	p := Plan{}
	ps := distinctPeers(peers)
	i := slices.IndexFunc(ps, func(p Peer) bool { return p.Name == self })
	if i >= 0 {
		p.Share = Share(len(distinct(shards)), len(ps))
	}
	for _, s := range distinct(shards) {
		mine := assigned[s] == self
		holds := slices.Contains(held, s)
		switch {
		case mine && holds:
			p.Assigned = append(p.Assigned, s)
		case mine:
			p.Assigned = append(p.Assigned, s)
			p.Try = append(p.Try, s)
		case holds && (i < 0 || slices.Contains(ps[i].Held, s)):
			p.Shed = append(p.Shed, s)
		}
	}
	return p
}

// Moves counts the shards whose assigned pod differs between two
// assignments (a shard missing from one counts as moved).
func Moves(before, after map[string]string) int {
	n := 0
	for s, p := range before {
		if after[s] != p {
			n++
		}
	}
	for s := range after {
		if _, ok := before[s]; !ok {
			n++
		}
	}
	return n
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// distinct is names without repeats, in first-seen order.
func distinct(names []string) []string {
	seen := make(map[string]bool, len(names))
	out := make([]string, 0, len(names))
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

// distinctPeers is peers without a repeated name (the first kept), sorted
// by name.
func distinctPeers(peers []Peer) []Peer {
	seen := make(map[string]bool, len(peers))
	out := make([]Peer, 0, len(peers))
	for _, p := range peers {
		if !seen[p.Name] {
			seen[p.Name] = true
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b Peer) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// MaxHeldLen bounds the length of EncodeHeld's text for a shard set of at
// most 1000 shards (the setting shards' bound): the longest is every other
// shard held, 1,944 bytes of indices.
const MaxHeldLen = 2048

// EncodeHeld is the text by which a pod publishes the shards it holds:
// "shards R of N (set H)", R the indices into shards of the held ones as
// ascending ranges ("0-3,7,9") or "none", N the size of the set and H its
// SetID, so that a reader with another shard set does not misread the
// indices. Names in held that are not in shards are left out.
func EncodeHeld(shards, held []string) string {
	shards = distinct(shards)
	has := make(map[string]bool, len(held))
	for _, s := range held {
		has[s] = true
	}
	var b strings.Builder
	b.WriteString("shards ")
	first := true
	for i := 0; i < len(shards); i++ {
		if !has[shards[i]] {
			continue
		}
		j := i
		for j+1 < len(shards) && has[shards[j+1]] {
			j++
		}
		if !first {
			b.WriteByte(',')
		}
		first = false
		b.WriteString(strconv.Itoa(i))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(j))
		}
		i = j
	}
	if first {
		b.WriteString("none")
	}
	fmt.Fprintf(&b, " of %d (set %s)", len(shards), SetID(shards))
	return b.String()
}

// DecodeHeld reads EncodeHeld's text back into shard names, in the order of
// shards. It returns an error when text is not of that form, names another
// shard set (its size or SetID differ), or an index out of it.
func DecodeHeld(shards []string, text string) ([]string, error) {
	shards = distinct(shards)
	rest, ok := strings.CutPrefix(text, "shards ")
	if !ok {
		return nil, fmt.Errorf("held shards %q: want \"shards R of N (set H)\"", text)
	}
	ranges, tail, ok := strings.Cut(rest, " of ")
	if !ok {
		return nil, fmt.Errorf("held shards %q: want \"shards R of N (set H)\"", text)
	}
	if want := fmt.Sprintf("%d (set %s)", len(shards), SetID(shards)); tail != want {
		return nil, fmt.Errorf("held shards %q: of another shard set than this one, %s", text, want)
	}
	if ranges == "none" {
		return nil, nil
	}
	held := make([]bool, len(shards))
	for r := range strings.SplitSeq(ranges, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		a, err := index(lo, len(shards))
		b := a
		if err == nil && isRange {
			b, err = index(hi, len(shards))
			if err == nil && b <= a {
				err = fmt.Errorf("range %q does not ascend", r)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("held shards %q: %w", text, err)
		}
		for i := a; i <= b; i++ {
			held[i] = true
		}
	}
	var out []string
	for i, s := range shards {
		if held[i] {
			out = append(out, s)
		}
	}
	return out, nil
}

// index parses an index into a set of n shards.
func index(s string, n int) (int, error) {
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("index %q: want a whole number from 0", s)
	}
	if i >= n {
		return 0, fmt.Errorf("index %d: the set has %d shards", i, n)
	}
	return i, nil
}

// SetID is a short fingerprint of a shard set, its names in order: 8 hex
// digits of their FNV-1a hash.
func SetID(shards []string) string {
	h := fnv.New32a()
	for _, s := range distinct(shards) {
		_, _ = h.Write([]byte(s))
		_, _ = h.Write([]byte{0})
	}
	return fmt.Sprintf("%08x", h.Sum32())
}
