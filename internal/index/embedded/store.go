package embedded

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/storage/wal"
)

// Store is the embedded index: an [index.Backend] kept in memory and in an
// append-only log under one directory. See the package documentation for
// the files and the order of writes.
type Store struct {
	log *wal.Log
	dir string

	mu  sync.RWMutex
	dim int
	// Points are never modified once stored (an upsert stores a new one),
	// so a compaction can write a copied slice of them without holding mu.
	all     []*index.Point            // every point once, vectors normalised
	slot    map[uuid.UUID]int         // a point's index in all
	byKey   map[string][]*index.Point // each key's points, in no order
	markers map[string]index.Marker
}

// Open opens the embedded index in dir, creating the directory if needed,
// and replays its snapshot and logs. It fails with [ErrLocked] if another
// Store has dir open, and with a [*CorruptError] if a file is damaged
// other than by a torn final record, which is truncated away.
func Open(dir string, opts Options) (*Store, error) {
	s := &Store{
		dir:     dir,
		slot:    make(map[uuid.UUID]int),
		byKey:   make(map[string][]*index.Point),
		markers: make(map[string]index.Marker),
	}
	log, err := wal.Open(dir, indexFormat, &durable{s: s}, opts)
	if err != nil {
		return nil, fmt.Errorf("embedded index: %w", err)
	}
	s.log = log
	return s, nil
}

// replay applies a log record read back at Open.
func (s *Store) replay(rec record) error {
	switch rec.op {
	case opDimension:
		if s.dim != 0 && s.dim != rec.dim {
			return fmt.Errorf("dimension %d recorded after %d", rec.dim, s.dim)
		}
		s.dim = rec.dim
	case opUpsert:
		if err := s.checkDims(rec.points); err != nil {
			return err
		}
		s.applyReadBack(rec.points)
	case opDeleteStale, opDeleteOlder, opRetract:
		s.applyDelete(rec.op, rec.keeps)
	case opMarkers:
		s.applyMarkers(rec.markers)
	default:
		return fmt.Errorf("unexpected op %d in a log", rec.op)
	}
	return nil
}

// applyReadBack applies points read back from a log or a snapshot, whose
// dimensions were checked, in the store's layout.
func (s *Store) applyReadBack(points []*index.Point) {
	packed, _ := pack(points, false) // copying vectors cannot fail
	s.applyUpsert(packed)
}

// checkDims checks the dimension of points read back at Open.
func (s *Store) checkDims(points []*index.Point) error {
	for _, p := range points {
		if len(p.Vector) != s.dim {
			return fmt.Errorf("point %s has %d dimensions, the store %d", p.ID, len(p.Vector), s.dim)
		}
	}
	return nil
}

// The apply functions change the in-memory state; they run with mu held
// (or during Open), after the record is in the log.

func (s *Store) applyUpsert(points []*index.Point) {
	var stale []string // keys whose lists hold a point replaced by ID
	for _, p := range points {
		if i, ok := s.slot[p.ID]; ok {
			if k := s.all[i].Key; len(stale) == 0 || stale[len(stale)-1] != k {
				stale = append(stale, k)
			}
			s.all[i] = p
		} else {
			s.slot[p.ID] = len(s.all)
			s.all = append(s.all, p)
		}
		s.byKey[p.Key] = append(s.byKey[p.Key], p)
	}
	// A point stays in its key's list if its ID still names it. (A key
	// listed twice costs a pass that removes nothing.)
	for _, k := range stale {
		s.filterKey(k, func(p *index.Point) bool {
			i, ok := s.slot[p.ID]
			return ok && s.all[i] == p
		})
	}
}

// filterKey keeps the points of key that keep reports true for, in one
// pass whatever the number removed.
func (s *Store) filterKey(key string, keep func(*index.Point) bool) {
	ps := s.byKey[key]
	kept := ps[:0]
	for _, p := range ps {
		if keep(p) {
			kept = append(kept, p)
		}
	}
	clear(ps[len(kept):])
	if len(kept) == 0 {
		delete(s.byKey, key)
		return
	}
	// Assigning stores the key string given: a remaining point's, not a
	// removed one's, whose packed text would otherwise stay alive.
	s.byKey[kept[0].Key] = kept
}

// removeFromAll removes p from all and slot; its key's list is the
// caller's.
func (s *Store) removeFromAll(p *index.Point) {
	i := s.slot[p.ID]
	last := len(s.all) - 1
	if i != last {
		moved := s.all[last]
		s.all[i] = moved
		s.slot[moved.ID] = i
	}
	s.all[last] = nil
	s.all = s.all[:last]
	delete(s.slot, p.ID)
}

// removes reports whether the delete op of keep k removes point p:
// opDeleteOlder the key's points older than k.Version, opRetract those of
// k.Version, opDeleteStale (logs written before opDeleteOlder) those of
// any other version; with Version 0, the two deletes remove every point.
func removes(op byte, k index.Keep, p *index.Point) bool {
	switch op {
	case opRetract:
		return p.Version == k.Version
	case opDeleteStale:
		return k.Version == 0 || p.Version != k.Version
	default:
		return k.Version == 0 || p.Version < k.Version
	}
}

// hasStale reports whether the delete op of k would remove any point.
func (s *Store) hasStale(op byte, k index.Keep) bool {
	for _, p := range s.byKey[k.Key] {
		if removes(op, k, p) {
			return true
		}
	}
	return false
}

func (s *Store) applyDelete(op byte, keeps []index.Keep) {
	for _, k := range keeps {
		s.filterKey(k.Key, func(p *index.Point) bool {
			if removes(op, k, p) {
				s.removeFromAll(p)
				return false
			}
			return true
		})
	}
}

func (s *Store) applyMarkers(markers []index.Marker) {
	for _, m := range markers {
		if old, ok := s.markers[m.Key]; ok && old.Version >= m.Version {
			continue
		}
		pm := packMarker(m) // the map's key too, so the caller's strings are not kept
		s.markers[pm.Key] = pm
	}
}

// Ensure records the dimension on first use; see [index.Backend].
func (s *Store) Ensure(ctx context.Context, dim int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dim <= 0 || dim > MaxDimension {
		return fmt.Errorf("embedded index: dimension %d is outside 1..%d", dim, MaxDimension)
	}
	return s.log.Write(&s.mu, func() ([]byte, func(), error) {
		switch s.dim {
		case dim:
			return nil, nil, nil
		case 0:
		default:
			return nil, nil, fmt.Errorf("%w: the store holds %d-dimensional vectors, not %d", ErrDimensionMismatch, s.dim, dim)
		}
		rec, err := encodeDimension(dim)
		return rec, func() { s.dim = dim }, err
	}, true)
}

// Markers returns the stored markers of keys; see [index.Backend].
func (s *Store) Markers(ctx context.Context, keys []string) (map[string]index.Marker, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.log.Closed() {
		return nil, ErrClosed
	}
	out := make(map[string]index.Marker, len(keys))
	for _, k := range keys {
		if m, ok := s.markers[k]; ok {
			out[k] = m
		}
	}
	return out, nil
}

// SetMarkers stores markers whose version is greater than the stored one;
// see [index.Backend]. Only the markers that change anything are logged.
// It returns once the log is durable up to its record, or, when nothing
// changes, up to the last record appended: the points the Upsert and
// DeleteStale calls before it wrote.
func (s *Store) SetMarkers(ctx context.Context, markers []index.Marker) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.log.Write(&s.mu, func() ([]byte, func(), error) {
		var effective []index.Marker
		pending := make(map[string]int64, len(markers))
		for _, m := range markers {
			cur, ok := pending[m.Key]
			if !ok {
				var stored index.Marker
				stored, ok = s.markers[m.Key]
				cur = stored.Version
			}
			if ok && cur >= m.Version {
				continue
			}
			pending[m.Key] = m.Version
			effective = append(effective, m)
		}
		if len(effective) == 0 {
			return nil, nil, nil
		}
		rec, err := encodeMarkers(effective)
		return rec, func() { s.applyMarkers(effective) }, err
	}, true)
}

// Upsert stores points, replacing those with the same ID; see
// [index.Backend]. Vectors are stored normalised, as cosine similarity
// needs only their direction, and are read back normalised. The record is
// made durable by the next SetMarkers (the index writes markers last and
// acknowledges an event only after them), or by Close: one sync per
// applied batch instead of three.
func (s *Store) Upsert(ctx context.Context, points []index.Point) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(points) == 0 {
		return nil
	}
	// The dimension only ever goes from 0 to its value, so checking it
	// outside the lock is enough; encoding runs outside it too.
	s.mu.RLock()
	dim := s.dim
	s.mu.RUnlock()
	if dim == 0 {
		return ErrNoDimension
	}
	ptrs := make([]*index.Point, len(points))
	for i := range points {
		if p := &points[i]; len(p.Vector) != dim {
			return fmt.Errorf("%w: point %s has %d dimensions, the store holds %d", ErrDimensionMismatch, p.ID, len(p.Vector), dim)
		}
		ptrs[i] = &points[i]
	}
	stored, err := pack(ptrs, true)
	if err != nil {
		return err
	}
	rec, err := encodeUpsert(stored)
	if err != nil {
		return err
	}
	return s.log.Write(&s.mu, func() ([]byte, func(), error) {
		return rec, func() { s.applyUpsert(stored) }, nil
	}, false)
}

// normalize returns a unit-length copy of v, or a copy of v if it is zero
// (which then scores 0 against every query).
func normalize(v []float32) ([]float32, error) {
	out := make([]float32, len(v))
	if err := normalizeInto(out, v); err != nil {
		return nil, err
	}
	return out, nil
}

// normalizeInto writes v at unit length into dst (len(v) long), or zeros
// if v is zero.
func normalizeInto(dst, v []float32) error {
	var sum float64
	for _, f := range v {
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return errors.New("vector has a NaN or infinite component")
		}
		sum += float64(f) * float64(f)
	}
	if sum == 0 {
		clear(dst)
		return nil
	}
	inv := 1 / math.Sqrt(sum)
	for i, f := range v {
		dst[i] = float32(float64(f) * inv)
	}
	return nil
}

// DeleteStale removes each key's points of older versions; see
// [index.Backend]. Only the keeps that remove anything are logged; like
// Upsert's, the record is made durable by the next SetMarkers or Close.
func (s *Store) DeleteStale(ctx context.Context, keep []index.Keep) error {
	return s.delete(ctx, opDeleteOlder, keep)
}

// Retract removes each key's points of exactly the version; see
// [index.Backend]. Logged and made durable as DeleteStale's.
func (s *Store) Retract(ctx context.Context, keep []index.Keep) error {
	return s.delete(ctx, opRetract, keep)
}

func (s *Store) delete(ctx context.Context, op byte, keep []index.Keep) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.log.Write(&s.mu, func() ([]byte, func(), error) {
		// Removing points never makes a keep that removes nothing remove
		// something, so judging each against the state before the call is
		// exact.
		var effective []index.Keep
		for _, k := range keep {
			if s.hasStale(op, k) {
				effective = append(effective, k)
			}
		}
		if len(effective) == 0 {
			return nil, nil, nil
		}
		rec, err := encodeKeeps(op, effective)
		return rec, func() { s.applyDelete(op, effective) }, err
	}, false)
}

// Counts returns each key's number of points; see [index.Backend].
func (s *Store) Counts(ctx context.Context, keys []string) (map[string]int, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.log.Closed() {
		return nil, ErrClosed
	}
	out := make(map[string]int, len(keys))
	for _, k := range keys {
		out[k] = len(s.byKey[k])
	}
	return out, nil
}

// Points returns a key's points by version then ordinal; see
// [index.Backend]. Vectors, when asked for, are the stored normalised ones.
func (s *Store) Points(ctx context.Context, key string, withVectors bool) ([]index.Point, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	if s.log.Closed() {
		s.mu.RUnlock()
		return nil, ErrClosed
	}
	ps := slices.Clone(s.byKey[key])
	s.mu.RUnlock()
	slices.SortFunc(ps, func(a, b *index.Point) int {
		return cmp.Or(cmp.Compare(a.Version, b.Version), cmp.Compare(a.Ordinal, b.Ordinal), compareIDs(a.ID, b.ID))
	})
	out := make([]index.Point, len(ps))
	for i, p := range ps {
		out[i] = copyPoint(p, withVectors)
	}
	return out, nil
}

func copyPoint(p *index.Point, withVector bool) index.Point {
	cp := *p
	cp.Tags = slices.Clone(p.Tags)
	cp.Vector = nil
	if withVector {
		cp.Vector = slices.Clone(p.Vector)
	}
	return cp
}

// ScanMarkers calls fn for every marker; see [index.Backend]. fn runs
// without the store's lock held, on a copy taken at the start.
func (s *Store) ScanMarkers(ctx context.Context, fn func(index.Marker) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.RLock()
	if s.log.Closed() {
		s.mu.RUnlock()
		return ErrClosed
	}
	markers := make([]index.Marker, 0, len(s.markers))
	for _, m := range s.markers {
		markers = append(markers, m)
	}
	s.mu.RUnlock()
	for i, m := range markers {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if err := fn(m); err != nil {
			return err
		}
	}
	return nil
}

// Close stops background work, syncs the log and releases the directory.
// It reports a failed sync or write whose outcome on disk is unknown.
// Calls after the first return nil.
func (s *Store) Close() error { return s.log.Close() }

var _ index.Backend = (*Store)(nil)
