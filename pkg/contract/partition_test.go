package contract_test

import (
	"fmt"
	"testing"

	"github.com/converge-sync/converge/pkg/contract"
)

// A document's partition is a pure function of its key, in range, the
// same as its token's, 0 without partitions; partition names and subjects
// are as the design says.
func TestPartition(t *testing.T) {
	seen := map[int]int{}
	for k := range 1000 {
		key := fmt.Sprintf("docs/%d", k)
		p := contract.Partition(key, 8)
		if p < 0 || p >= 8 || p != contract.Partition(key, 8) || p != contract.TokenPartition(contract.SubjectToken(key), 8) {
			t.Fatalf("partition of %s: %d", key, p)
		}
		seen[p]++
		if contract.Partition(key, 1) != 0 || contract.Partition(key, 0) != 0 {
			t.Fatalf("%s has a partition without partitions", key)
		}
	}
	for p := range 8 {
		if seen[p] < 80 {
			t.Errorf("partition %d holds %d of 1,000 keys: %v", p, seen[p], seen)
		}
	}
	if got := contract.PartitionName("index", 3); got != "index-p03" {
		t.Errorf("PartitionName: %s", got)
	}
	if got := contract.PartitionSubjectPrefix(12); got != "converge.part.12." {
		t.Errorf("PartitionSubjectPrefix: %s", got)
	}
	if got := contract.EventsPartitionStream(3); got != "CONVERGE_EVENTS_P03" {
		t.Errorf("EventsPartitionStream: %s", got)
	}
	if got := contract.EventsPartitionSubjectPrefix(12); got != "converge.effects.12." {
		t.Errorf("EventsPartitionSubjectPrefix: %s", got)
	}
	if src, dst := contract.PartitionTransform(4); src != "converge.docs.*" || dst != "converge.part.{{partition(4,1)}}.{{wildcard(1)}}" {
		t.Errorf("PartitionTransform: %s -> %s", src, dst)
	}
}

func TestSourceSequence(t *testing.T) {
	for _, c := range []struct {
		header string
		seq    uint64
		ok     bool
	}{
		{"CONVERGE_DOCS 42 converge.docs.* converge.part.{{partition(4,1)}}.{{wildcard(1)}} converge.docs.ab x", 42, true},
		{"CONVERGE_DOCS 7", 7, true},
		{"CONVERGE_DOCS", 0, false},
		{"", 0, false},
		{"CONVERGE_DOCS seven", 0, false},
	} {
		seq, err := contract.SourceSequence(c.header)
		if seq != c.seq || (err == nil) != c.ok {
			t.Errorf("SourceSequence(%q) = %d, %v", c.header, seq, err)
		}
	}
}
