package verify

import "context"

// BucketDigester is a side that computes the digests of some buckets
// alone, reading only their documents: what a walk over the buckets a few
// at a time asks (see [Watcher]).
type BucketDigester interface {
	DigestsOf(ctx context.Context, kind Kind, n int, buckets []int) (map[int]BucketDigest, error)
}

// DigestsOf are the digests of buckets (of n) on side: asked for alone
// when side is a [BucketDigester], else picked out of all of them.
func DigestsOf(ctx context.Context, side Side, kind Kind, n int, buckets []int) (map[int]BucketDigest, error) {
	if d, ok := side.(BucketDigester); ok {
		return d.DigestsOf(ctx, kind, n, buckets)
	}
	all, err := side.Digests(ctx, kind, n)
	if err != nil {
		return nil, err
	}
	out := make(map[int]BucketDigest, len(buckets))
	for _, b := range buckets {
		out[b] = all[b]
	}
	return out, nil
}

// DigestsOf implements [BucketDigester].
func (m *Memory) DigestsOf(ctx context.Context, kind Kind, n int, buckets []int) (map[int]BucketDigest, error) {
	byBucket, _ := m.Buckets(ctx, kind, n, buckets)
	out := make(map[int]BucketDigest, len(buckets))
	for _, b := range buckets {
		out[b] = bucketDigest(kind, byBucket[b])
	}
	return out, nil
}

// bucketsKey is the context key of the buckets a read is for.
type bucketsKey struct{}

// bucketSet is the buckets of n a read is for.
type bucketSet struct {
	n    int
	want map[int]bool
}

// withBuckets makes ctx carry buckets of n: [ReadIndex] and [ReadGraph]
// given it read only the documents of those buckets. The projectors call
// them from [Handler] with the request's context, which is how a request
// for a few buckets reaches the store's read without a change to each
// projector.
func withBuckets(ctx context.Context, n int, buckets []int) context.Context {
	s := bucketSet{n: n, want: make(map[int]bool, len(buckets))}
	for _, b := range buckets {
		s.want[b] = true
	}
	return context.WithValue(ctx, bucketsKey{}, s)
}

// wanted reports whether the document of key is wanted by a read with ctx.
func wanted(ctx context.Context, key string) bool {
	s, ok := ctx.Value(bucketsKey{}).(bucketSet)
	return !ok || s.want[Bucket(key, s.n)]
}
