package projector

import (
	"context"
)

// Fencing is a lease term's fence for writes made beside the runtime
// (rebuilds): the same Fence and Bound as the runtime's [Config]. The zero
// Fencing lets every write through.
type Fencing struct {
	Fence func(ctx context.Context) error
	Bound func(ctx context.Context) (context.Context, context.CancelFunc)
}

// Do runs write after the fence lets it, with a context bound to the
// term: a refusal is a [*FencedError] and write is not called; a write
// that failed once the term's end had cut it off returns a
// [*FencedError] too. A write that returned nil is done, whenever the
// term ended: reporting it fenced would have its caller take a change
// that landed (an alias switched) for one that did not.
func (f Fencing) Do(ctx context.Context, write func(ctx context.Context) error) error {
	if f.Fence != nil {
		if err := f.Fence(ctx); err != nil {
			return &FencedError{Err: err}
		}
	}
	if f.Bound == nil {
		return write(ctx)
	}
	bound, cancel := f.Bound(ctx)
	defer cancel()
	err := write(bound)
	if err != nil && ctx.Err() == nil && bound.Err() != nil {
		return &FencedError{Err: context.Cause(bound)}
	}
	return err
}

type writableKey struct{}

// WithWritable marks ctx, a store call's, with writable: whether the
// lease term the call runs in still lets this instance write. A store that
// goes on with work after its call returned (the notifier's sends) asks it
// before each write it starts then.
func WithWritable(ctx context.Context, writable func() bool) context.Context {
	return context.WithValue(ctx, writableKey{}, writable)
}

// Writable is what WithWritable put in ctx: always true when nothing was.
func Writable(ctx context.Context) func() bool {
	if w, ok := ctx.Value(writableKey{}).(func() bool); ok {
		return w
	}
	return func() bool { return true }
}
