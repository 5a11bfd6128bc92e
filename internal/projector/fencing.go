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

// And is the fence of both f and o: a write passes both fences, and is
// bound to both terms.
func (f Fencing) And(o Fencing) Fencing {
	return Fencing{
		Fence: func(ctx context.Context) error {
			for _, fence := range []func(context.Context) error{f.Fence, o.Fence} {
				if fence != nil {
					if err := fence(ctx); err != nil {
						return err
					}
				}
			}
			return nil
		},
		Bound: func(ctx context.Context) (context.Context, context.CancelFunc) {
			var cancels []context.CancelFunc
			for _, bound := range []func(context.Context) (context.Context, context.CancelFunc){f.Bound, o.Bound} {
				if bound != nil {
					var cancel context.CancelFunc
					ctx, cancel = bound(ctx)
					cancels = append(cancels, cancel)
				}
			}
			return ctx, func() {
				for _, cancel := range cancels {
					cancel()
				}
			}
		},
	}
}

// Exclusive, given to the work beside the runtime of a projector that
// runs in partitions (ServiceConfig.Alongside), has every partition handed
// to this instance and waits until it holds them all: no other instance
// then writes the store, and the runtimes of this one write through the
// store it was given (which a rebuild holds back). It returns the fence of
// those partitions' terms, as they are at that moment (a partition lost
// and taken again may have been written by another instance meanwhile, so
// the fence refuses it), and the function that ends the claim.
type Exclusive func(ctx context.Context) (Fencing, func(), error)

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
