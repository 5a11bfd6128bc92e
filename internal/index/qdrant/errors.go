package qdrant

import (
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrCollectionNotFound is matched by an [*Error] whose request found no
// collection (or alias) of the configured name, such as any call before
// [Backend.Ensure] created it.
var ErrCollectionNotFound = errors.New("qdrant: collection not found")

// ErrCollectionFull is matched by an [*Error] whose write Qdrant refused
// because the collection reached one of its strict-mode capacity limits
// (max_points_count, max_collection_vector_size_bytes or
// max_collection_payload_size_bytes). Such an error is not
// [Error.Permanent]: it is a state of the collection, not of the event.
var ErrCollectionFull = errors.New("qdrant: collection at its strict-mode capacity limit")

// ErrWriteDenied is matched by every [*WriteDeniedError].
var ErrWriteDenied = errors.New("qdrant: the API key may not write")

// ErrDimensionMismatch is matched by every [*DimensionError].
var ErrDimensionMismatch = errors.New("qdrant: vector dimension mismatch")

// Error is a failed request to Qdrant. It keeps the gRPC status error as
// its cause, so status.Code and errors.As see through it.
type Error struct {
	Op         string // what the backend was doing, e.g. "upsert"
	Collection string
	Err        error
}

func (e *Error) Error() string {
	if setting := e.capacityLimit(); setting != "" {
		return fmt.Sprintf("qdrant: %s on collection %q: %v (the collection reached strict_mode_config.%s: writes are retried until it is raised or points are deleted)",
			e.Op, e.Collection, e.Err, setting)
	}
	return fmt.Sprintf("qdrant: %s on collection %q: %v", e.Op, e.Collection, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrCollectionNotFound) true for a NotFound status:
// the only thing the backend's requests can fail to find is the collection.
// errors.Is(err, ErrCollectionFull) is true for a capacity limit reached.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrCollectionNotFound:
		return status.Code(e.Err) == codes.NotFound
	case ErrCollectionFull:
		return e.capacityLimit() != ""
	}
	return false
}

// capacityLimits are the messages of Qdrant's refusals for a collection
// that reached a strict-mode size limit, by the setting: the bad requests
// of check_collection_size_limit (lib/collection/src/operations/
// verification/update.rs), "Max points count limit of N reached!" and the
// like, sent as InvalidArgument. A refusal of the request itself, such as
// "Filter condition limit reached (n > m)", is none of these.
var capacityLimits = []struct{ message, setting string }{
	{"Max points count limit of ", "max_points_count"},
	{"Max vector storage size limit of ", "max_collection_vector_size_bytes"},
	{"Max payload storage size limit of ", "max_collection_payload_size_bytes"},
}

// capacityLimit is the strict-mode setting the collection reached, if the
// failure is such a refusal, or "".
func (e *Error) capacityLimit() string {
	st, ok := status.FromError(e.Err)
	if !ok || st.Code() != codes.InvalidArgument || !strings.HasSuffix(st.Message(), " reached!") {
		return ""
	}
	for _, l := range capacityLimits {
		if strings.Contains(st.Message(), l.message) {
			return l.setting
		}
	}
	return ""
}

// Code is the gRPC status code of the failure (codes.Unknown when the
// failure was not a status, codes.DeadlineExceeded or codes.Canceled for a
// context that ended).
func (e *Error) Code() codes.Code {
	if st, ok := status.FromError(e.Err); ok {
		return st.Code()
	}
	return status.FromContextError(e.Err).Code()
}

// SafeToRetry reports whether the request may simply be sent again: every
// write of the backend is idempotent, so a transient failure is retryable.
// Besides the transport's transient codes, that is Qdrant's Internal (a
// ServiceError: I/O, out of disk or memory, a cancelled operation) and
// FailedPrecondition (writes locked, or a shard not in a state to serve
// yet): states of the server, not of the request, that clear
// (lib/storage/src/content_manager/errors.rs and conversions.rs). A key
// the server refuses (Unauthenticated: a wrong key; PermissionDenied: a
// key without the right, such as Qdrant's read-only key) is not: sending
// the request again at once changes nothing until the operator fixes the
// key.
//
// It is advice for a caller that resends requests itself; the projector
// runtime does not call it, and decides by [Error.Permanent] alone.
func (e *Error) SafeToRetry() bool {
	switch e.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted,
		codes.Internal, codes.FailedPrecondition:
		return true
	}
	return false
}

// WriteDeniedError is [Backend.Ensure] finding that its API key may not
// write to the collection: Qdrant refused a write with PermissionDenied,
// as it refuses every write made with its read-only key or with a JWT
// that grants only read access. Err is the refusal.
type WriteDeniedError struct {
	Collection string
	Err        error
}

func (e *WriteDeniedError) Error() string {
	return fmt.Sprintf("qdrant: the API key may not write to collection %q: a read-only key, or one without access to this collection? (%v)", e.Collection, e.Err)
}

func (e *WriteDeniedError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrWriteDenied) true.
func (e *WriteDeniedError) Is(target error) bool { return target == ErrWriteDenied }

// DimensionError is [Backend.Ensure] finding a collection whose vectors
// have another dimension than the embedder's.
type DimensionError struct {
	Collection string
	Have       int // the collection's vector size
	Want       int // the size Ensure was asked for
}

func (e *DimensionError) Error() string {
	return fmt.Sprintf("qdrant: collection %q holds vectors of dimension %d, not %d: rebuild the index into a new collection for this embedder",
		e.Collection, e.Have, e.Want)
}

// Is makes errors.Is(err, ErrDimensionMismatch) true.
func (e *DimensionError) Is(target error) bool { return target == ErrDimensionMismatch }

// PointDimensionError is [Backend.Upsert] refusing a point whose vector
// has another dimension than the collection's. Qdrant checks the size only
// as it applies each point, so it would write part of the batch before
// refusing it; the backend checks every point first and sends nothing.
type PointDimensionError struct {
	Collection string
	Point      uuid.UUID
	Have       int // the point's vector size
	Want       int // the collection's
}

func (e *PointDimensionError) Error() string {
	return fmt.Sprintf("qdrant: point %s has a vector of dimension %d; collection %q holds dimension %d (nothing of the batch was written)",
		e.Point, e.Have, e.Collection, e.Want)
}

// Is makes errors.Is(err, ErrDimensionMismatch) true.
func (e *PointDimensionError) Is(target error) bool { return target == ErrDimensionMismatch }

// Permanent is true: the same point can never be written.
func (e *PointDimensionError) Permanent() bool { return true }

// Permanent reports whether Qdrant rejected the request itself (a wrong
// vector size, a malformed payload, a strict-mode limit on the request):
// sending it again cannot succeed. The projector runtime dead-letters such an event after
// its redeliveries, while every other failure (Qdrant down, a timeout, an
// Internal or FailedPrecondition state of the server, a missing collection
// that a restart recreates) is retried until it clears. The codes are
// Qdrant's StorageError mapping in
// lib/storage/src/content_manager/conversions.rs.
//
// A refusal of the key is retried too, though it clears only when the
// operator fixes the key: Unauthenticated, and PermissionDenied (Qdrant's
// Forbidden, lib/storage/src/rbac/mod.rs), which a read-only key or a JWT
// without write access to the collection gets for every write alike.
// They are properties of the credentials, not of the event: were they
// permanent, every event would be dead-lettered. [Backend.Ensure] refuses
// such a key at start.
//
// So is a collection that reached a strict-mode capacity limit
// ([ErrCollectionFull]): Qdrant refuses it as InvalidArgument, but it
// refuses every upsert alike until the limit is raised or points are
// deleted. The runtime's retries keep it in its logs and retry metric.
func (e *Error) Permanent() bool {
	switch e.Code() {
	case codes.InvalidArgument:
		return e.capacityLimit() == ""
	case codes.OutOfRange:
		return true
	}
	return false
}
