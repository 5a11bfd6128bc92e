package embed

import (
	"errors"
	"fmt"
)

// Kinds of embedder, as an [Identity] names them.
const (
	KindHash = "hash" // the local [Hash] embedder
	KindHTTP = "http" // an OpenAI-compatible endpoint ([HTTP])
)

// Identity names the embedder that made a set of vectors: its kind, its
// model and the vectors' dimension. The index records it with each
// generation, so that vectors of two models are never mixed in one. The
// endpoint's URL is not part of it: the same model served elsewhere makes
// the same vectors.
type Identity struct {
	Kind      string `json:"kind"`
	Model     string `json:"model"`
	Dimension int    `json:"dimension"`
}

// IdentityOf is e's identity. An embedder of another type than [Hash] and
// [HTTP] is of the kind its Kind method names, if it has one, else of its
// Go type.
func IdentityOf(e Embedder) Identity {
	var kind string
	switch k := e.(type) {
	case *Hash:
		kind = KindHash
	case *HTTP:
		kind = KindHTTP
	case interface{ Kind() string }:
		kind = k.Kind()
	default:
		kind = fmt.Sprintf("%T", e)
	}
	return Identity{Kind: kind, Model: e.Name(), Dimension: e.Dimension()}
}

// String is the identity as messages show it, e.g. `http model
// "text-embedding-3-small", 1536 dimensions`.
func (id Identity) String() string {
	return fmt.Sprintf("%s model %q, %d dimensions", id.Kind, id.Model, id.Dimension)
}

// Validate reports an identity no embedder has (as one read back from a
// store might be).
func (id Identity) Validate() error {
	if id.Kind == "" || id.Model == "" || id.Dimension <= 0 {
		return fmt.Errorf("embed: embedder identity %s is incomplete", id)
	}
	return nil
}

// ForIdentity returns an embedder that makes the vectors id names, for
// reading a generation made by another embedder than cfg's (searches keep
// being answered until a rebuild replaces it): the hash embedder of that
// dimension, or the model of that name and dimension at cfg's endpoint.
// It is an error when cfg cannot make them (an HTTP identity without an
// endpoint configured, or an unknown kind).
func ForIdentity(cfg Config, id Identity) (Embedder, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	switch id.Kind {
	case KindHash:
		h, err := NewHash(id.Dimension)
		if err != nil {
			return nil, err
		}
		if h.Name() != id.Model {
			return nil, fmt.Errorf("embed: the hash embedder is %q, not %q", h.Name(), id.Model)
		}
		return h, nil
	case KindHTTP:
		if cfg.URL == "" {
			return nil, errors.New("embed: no embeddings endpoint is configured to serve model " + fmt.Sprintf("%q", id.Model))
		}
		c := cfg.httpConfig()
		c.Model, c.Dimension = id.Model, id.Dimension
		return NewHTTP(c)
	}
	return nil, fmt.Errorf("embed: no embedder of kind %q", id.Kind)
}
