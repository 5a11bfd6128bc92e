// Package embed turns chunk texts into vectors for the index.
package embed

import "context"

// Embedder turns texts into vectors of a fixed dimension. Implementations
// are safe for concurrent use.
type Embedder interface {
	// Name identifies the model (e.g. "converge.hash.v1/256" or the
	// remote model's name); stores record it so that vectors of different
	// models are never mixed.
	Name() string
	// Dimension is the length of every vector returned.
	Dimension() int
	// Embed returns one vector per text, in order.
	Embed(ctx context.Context, texts []string) ([][]float32, error)
}
