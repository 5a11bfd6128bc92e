package verify

import (
	"fmt"

	"github.com/converge-sync/converge/pkg/contract"
)

// Partitions has a verify speak of the partitions of a projector that
// runs in them (contract.Partition of each document's key, of N): each
// difference is labelled with its document's partition and, with Only
// set, only the differences of that partition are kept, and a store
// agrees when that partition does. The digest buckets are not aligned
// with the partitions: both sides are read whole either way, and what a
// differing bucket holds of other partitions is compared and left out.
type Partitions struct {
	N    int  // 2 to contract.MaxPartitions; 0: the whole store, unlabelled
	Only *int // the one partition to verify; nil: every one
}

// Validate reports partitions that cannot be.
func (p Partitions) Validate() error {
	if p.N == 0 {
		if p.Only != nil {
			return fmt.Errorf("verify: a partition is verified given the number of partitions (-partitions N)")
		}
		return nil
	}
	if p.N < 2 || p.N > contract.MaxPartitions {
		return fmt.Errorf("verify: %d partitions: from 2 to %d", p.N, contract.MaxPartitions)
	}
	if p.Only != nil && (*p.Only < 0 || *p.Only >= p.N) {
		return fmt.Errorf("verify: partition %d of %d: from 0 to %d", *p.Only, p.N, p.N-1)
	}
	return nil
}

// Apply labels r's differences with their partitions and keeps those of
// p.Only alone, when set. A difference without a key (a bucket whose
// digests differ while its documents compare equal) belongs to no
// partition and is kept: it is not known to be another's.
func (p Partitions) Apply(r Result) Result {
	if p.N == 0 {
		return r
	}
	r.Agrees = true
	stores := make([]Report, 0, len(r.Stores))
	for _, s := range r.Stores {
		s.Partitions, s.Partition = p.N, p.Only
		kept := make([]Difference, 0, len(s.Differences))
		for _, d := range s.Differences {
			if d.Key != "" {
				part := contract.Partition(d.Key, p.N)
				d.Partition = &part
				if p.Only != nil && part != *p.Only {
					continue
				}
			}
			kept = append(kept, d)
		}
		s.Differences = kept
		if p.Only != nil {
			s.Agrees = len(kept) == 0
		}
		r.Agrees = r.Agrees && s.Agrees
		stores = append(stores, s)
	}
	r.Stores = stores
	return r
}
