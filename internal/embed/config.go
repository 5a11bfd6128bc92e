package embed

import "errors"

// Config chooses and configures the embedder: the [Hash] embedder when URL
// is empty, otherwise the [HTTP] embedder of that endpoint.
type Config struct {
	// URL is the base URL of an OpenAI-compatible embeddings endpoint (see
	// [HTTPConfig]); empty for the hash embedder.
	URL string
	// Model is the remote model; required with URL.
	Model string
	// APIKey, when set, is sent as a bearer token.
	APIKey string
	// Dimension is, with URL, the length of the model's vectors (required);
	// without, the hash dimension (default [DefaultHashDimension]).
	Dimension int
	// BatchSize and Concurrency are, with URL, the texts per request and
	// the requests in flight at most (see [HTTPConfig]); 0: the defaults.
	BatchSize, Concurrency int
}

// Validate reports a configuration [New] would refuse.
func (c Config) Validate() error {
	if c.URL == "" {
		if c.Model != "" || c.APIKey != "" {
			return errors.New("embed: a model or API key is configured without the URL of an embeddings endpoint")
		}
		if c.BatchSize != 0 || c.Concurrency != 0 {
			return errors.New("embed: a batch size or concurrency is configured without the URL of an embeddings endpoint (the hash embedder sends no requests)")
		}
		if c.Dimension == 0 {
			return nil
		}
		return checkHashDimension(c.Dimension)
	}
	return c.httpConfig().Validate()
}

func (c Config) httpConfig() HTTPConfig {
	return HTTPConfig{URL: c.URL, Model: c.Model, APIKey: c.APIKey, Dimension: c.Dimension, BatchSize: c.BatchSize, Concurrency: c.Concurrency}
}

// New returns the embedder cfg describes; the HTTP embedder takes the
// defaults of [HTTPConfig] for batching, timeouts and retries.
func New(cfg Config) (Embedder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.URL == "" {
		h, err := NewHash(cfg.Dimension)
		if err != nil {
			return nil, err
		}
		return h, nil
	}
	e, err := NewHTTP(cfg.httpConfig())
	if err != nil {
		return nil, err
	}
	return e, nil
}
