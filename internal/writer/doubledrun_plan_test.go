package writer_test

// The doubled-run's plans: how a corpus is cut into loader units, in
// version order per key or shuffled with copies that race each other.

import (
	"math/rand/v2"
	"slices"

	"github.com/converge-sync/converge/internal/testenv/corpus"
)

// drInterleave merges queues at random, keeping each queue's order.
func drInterleave(rng *rand.Rand, queues [][]*corpus.Op) []*corpus.Op {
	var out []*corpus.Op
	queues = slices.Clone(queues)
	for len(queues) > 0 {
		i := rng.IntN(len(queues))
		out = append(out, queues[i][0])
		if queues[i] = queues[i][1:]; len(queues[i]) == 0 {
			queues = slices.Delete(queues, i, i+1)
		}
	}
	return out
}

// drPlanInOrder partitions the keys: about 70% go into NDJSON batches (each
// key wholly in one batch, its versions in order, interleaved with other
// keys), the rest are sent as PUT/DELETE, one key after another's versions
// in order. Every key is in exactly one unit, so concurrent workers cannot
// reorder a key's versions.
func drPlanInOrder(c *corpus.Corpus, rng *rand.Rand) []drUnit {
	keys := slices.Clone(c.Keys)
	rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	nBatch := len(keys) * 7 / 10
	var units []drUnit
	for i := 0; i < nBatch; {
		target := 30 + rng.IntN(drMaxBatchLines-30+1)
		var group [][]*corpus.Op
		lines := 0
		for i < nBatch && lines+len(c.ByKey[keys[i]]) <= target {
			group = append(group, c.ByKey[keys[i]])
			lines += len(c.ByKey[keys[i]])
			i++
		}
		units = append(units, drUnit{batch: drInterleave(rng, group), copies: 1})
	}
	for _, k := range keys[nBatch:] {
		units = append(units, drUnit{seq: c.ByKey[k], copies: 1})
	}
	rng.Shuffle(len(units), func(i, j int) { units[i], units[j] = units[j], units[i] })
	return units
}

func drChunkOps(rng *rand.Rand, ops []*corpus.Op, minN, maxN, copies int) []drUnit {
	var units []drUnit
	for len(ops) > 0 {
		n := min(len(ops), minN+rng.IntN(maxN-minN+1))
		units = append(units, drUnit{batch: ops[:n:n], copies: copies})
		ops = ops[n:]
	}
	return units
}

// drPlanShuffled sends every op copies times in random order, older versions
// possibly after newer ones. With copies > 1: some ops' copies are sent
// concurrently as PUT/DELETE, some in identical NDJSON batches sent
// concurrently, the rest each copy on its own, as PUT/DELETE or a line of
// some batch (possibly the same batch as another copy).
func drPlanShuffled(c *corpus.Corpus, rng *rand.Rand, copies int) []drUnit {
	ops := slices.Clone(c.Ops)
	rng.Shuffle(len(ops), func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })
	var units []drUnit
	var batchPool, racePool []*corpus.Op
	for _, o := range ops {
		r := rng.IntN(10)
		switch {
		case copies > 1 && r < 3:
			units = append(units, drUnit{seq: []*corpus.Op{o}, copies: copies})
		case copies > 1 && r < 5:
			racePool = append(racePool, o)
		default:
			for range copies {
				if rng.IntN(10) < 6 {
					batchPool = append(batchPool, o)
				} else {
					units = append(units, drUnit{seq: []*corpus.Op{o}, copies: 1})
				}
			}
		}
	}
	rng.Shuffle(len(batchPool), func(i, j int) { batchPool[i], batchPool[j] = batchPool[j], batchPool[i] })
	units = append(units, drChunkOps(rng, batchPool, 20, drMaxBatchLines, 1)...)
	units = append(units, drChunkOps(rng, racePool, 10, 50, copies)...)
	rng.Shuffle(len(units), func(i, j int) { units[i], units[j] = units[j], units[i] })
	return units
}
