// Package shard shares a shard set (N partition Leases) out among the M pods
// that are up: pure assignment, no API. Every pod computes the same
// assignment from the same shard names and the same list of peers, so they
// agree on who should hold each shard without talking to each other.
//
// The assignment is bounded-load rendezvous hashing: each (shard, pod) pair
// has a score; pairs are taken in descending score, and a pair assigns its
// shard to its pod when the shard is still unassigned and the pod holds
// fewer than its fair share, ceil(N/M). Every shard is assigned, no pod gets
// more than its share, and a change of M moves few shards (a pod joining
// takes mostly shards it scores highest on; a pod leaving gives its shards
// to their next best pods). docs/shards.md describes how the sidecar uses it.
package shard

import (
	"cmp"
	"encoding/binary"
	"hash/fnv"
	"slices"
)

// Share is the fair share of n shards over m pods, ceil(n/m): the most one
// pod is assigned. It is 0 when m is 0 or less.
func Share(n, m int) int {
	if m <= 0 || n <= 0 {
		return 0
	}
	return (n + m - 1) / m
}

// Score is the rendezvous score of shard for pod: FNV-1a over both names
// (with a separator, so "a"+"bc" differs from "ab"+"c"), then the 64-bit
// finalizer of MurmurHash3 to spread the bits of near-equal names.
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

// Assign maps every shard to the peer it is assigned to. Shards and peers
// are names (Lease names, pod names); duplicates count once, and their order
// does not matter. No peer is assigned more than Share(len(shards),
// len(peers)). With no peers it returns an empty map.
func Assign(shards, peers []string) map[string]string {
	shards, peers = distinct(shards), distinct(peers)
	out := make(map[string]string, len(shards))
	if len(peers) == 0 {
		return out
	}
	type pair struct {
		score       uint64
		shard, peer int
	}
	pairs := make([]pair, 0, len(shards)*len(peers))
	for i, s := range shards {
		for j, p := range peers {
			pairs = append(pairs, pair{Score(s, p), i, j})
		}
	}
	// Descending score; ties (as good as impossible) by name, so every pod
	// breaks them alike.
	slices.SortFunc(pairs, func(a, b pair) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		if c := cmp.Compare(shards[a.shard], shards[b.shard]); c != 0 {
			return c
		}
		return cmp.Compare(peers[a.peer], peers[b.peer])
	})
	share := Share(len(shards), len(peers))
	load := make([]int, len(peers))
	for _, pr := range pairs {
		s := shards[pr.shard]
		if _, done := out[s]; done || load[pr.peer] >= share {
			continue
		}
		out[s] = peers[pr.peer]
		load[pr.peer]++
		if len(out) == len(shards) {
			break
		}
	}
	return out
}

// Plan is what one pod does with the shard set now.
type Plan struct {
	// Share is the fair share, ceil(N/M) for the M peers; 0 when this pod
	// is not one of them.
	Share int
	// Assigned are the shards assigned to this pod, in the shard set's
	// order; at most Share.
	Assigned []string
	// Shed are the shards this pod holds that are not assigned to it: it
	// revokes and releases them, so their assigned pods can take them.
	Shed []string
	// Try are the shards assigned to this pod that it does not hold: it
	// competes for them, taking each the moment its Lease is free.
	Try []string
}

// PlanFor is self's Plan, given the shard set, the peers that are up (self
// among them, or self takes nothing and sheds everything it holds) and the
// shards self holds now. The slices are in the order of shards.
func PlanFor(self string, shards, peers, held []string) Plan {
	assigned := Assign(shards, peers)
	p := Plan{}
	if slices.Contains(peers, self) {
		p.Share = Share(len(distinct(shards)), len(distinct(peers)))
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
		case holds:
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
