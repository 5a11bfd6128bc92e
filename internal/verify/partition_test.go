package verify

import (
	"testing"

	"github.com/converge-sync/converge/pkg/contract"
)

// A verify restricted to a partition keeps that partition's differences
// alone and agrees when it has none; labelled only, it keeps them all,
// each with its partition; a difference without a key is kept.
func TestPartitionsApply(t *testing.T) {
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	var diffs []Difference
	byPart := map[int]int{}
	for _, k := range keys {
		diffs = append(diffs, Difference{Key: k, Problem: StaleVersion})
		byPart[contract.Partition(k, 4)]++
	}
	res := Result{Stores: []Report{{Store: "graph", Differences: diffs}, {Store: "index", Agrees: true, Differences: []Difference{}}}}

	all := Partitions{N: 4}.Apply(res)
	if all.Agrees || len(all.Stores[0].Differences) != len(keys) {
		t.Fatalf("labelled only: agrees %v, %d differences", all.Agrees, len(all.Stores[0].Differences))
	}
	for _, d := range all.Stores[0].Differences {
		if d.Partition == nil || *d.Partition != contract.Partition(d.Key, 4) {
			t.Errorf("%s labelled %v, its partition is %d", d.Key, d.Partition, contract.Partition(d.Key, 4))
		}
	}
	for p := range 4 {
		one := Partitions{N: 4, Only: &p}.Apply(res)
		got := one.Stores[0]
		if len(got.Differences) != byPart[p] || got.Agrees != (byPart[p] == 0) || one.Agrees != got.Agrees {
			t.Errorf("partition %d: %d differences, agrees %v; want %d", p, len(got.Differences), got.Agrees, byPart[p])
		}
		for _, d := range got.Differences {
			if *d.Partition != p {
				t.Errorf("partition %d kept %s of partition %d", p, d.Key, *d.Partition)
			}
		}
		if got.Partition == nil || *got.Partition != p || got.Partitions != 4 || !one.Stores[1].Agrees {
			t.Errorf("partition %d: report says partition %v of %d, index agrees %v", p, got.Partition, got.Partitions, one.Stores[1].Agrees)
		}
	}
	if res.Stores[0].Differences[0].Partition != nil {
		t.Error("Apply changed the result it was given")
	}

	keyless := Result{Stores: []Report{{Store: "graph", Differences: []Difference{{Problem: DigestMismatch}}}}}
	p := 2
	if got := (Partitions{N: 4, Only: &p}).Apply(keyless); got.Agrees || len(got.Stores[0].Differences) != 1 {
		t.Errorf("a difference without a key was left out of partition 2: %+v", got)
	}

	for _, bad := range []Partitions{{N: 1}, {N: contract.MaxPartitions + 1}, {N: 4, Only: new(int(4))}, {N: 4, Only: new(int(-1))}, {Only: new(int(0))}} {
		if bad.Validate() == nil {
			t.Errorf("%+v was accepted", bad)
		}
	}
	if (Partitions{}).Validate() != nil || (Partitions{N: 4, Only: &p}).Validate() != nil {
		t.Error("valid partitions refused")
	}
}
