package neo4j

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/url"
	"time"
)

// Config of a [Backend]. Zero fields take the defaults documented on them.
type Config struct {
	// URL of the server: bolt://host:7687 for one server, neo4j://host:7687
	// for a routing connection (a cluster, or one server behind it). The
	// schemes bolt+s and neo4j+s connect with TLS and verify the server's
	// certificate; bolt+ssc and neo4j+ssc use TLS without verifying it.
	// The port defaults to 7687.
	URL string
	// User and Password authenticate with basic auth; an empty User
	// connects without authentication.
	User     string
	Password string
	// Database is the database written and read. Default "neo4j".
	Database string
	// BatchSize is the number of documents per write transaction, and of
	// documents per read transaction of ScanDocuments, 1..MaxBatchSize.
	// Default 100.
	BatchSize int
	// WipeBatchSize is the number of relationships, then of nodes, that a
	// rebuild in place deletes per transaction (see [Backend.Wipe]),
	// 1..MaxWipeBatchSize. Default 10,000: a wipe of 100,000 documents
	// took 42 s in batches of 1,000 and 28 s in batches of 10,000.
	WipeBatchSize int
	// TLS configures the TLS connection of the +s and +ssc schemes (root
	// CAs, client certificates, minimum version); nil uses the system's
	// roots. Setting it with an unencrypted scheme is an error.
	TLS *tls.Config
	// MaxRetryTime bounds how long a transaction is retried after
	// transient failures (deadlocks, leader changes, lost connections).
	// Default 30s.
	MaxRetryTime time.Duration
	// TxTimeout bounds each write transaction on the server: a writer
	// that stops mid-transaction (a paused process, a cut connection)
	// holds its locks no longer than this, so an instance taking over is
	// not blocked behind it. Default 5s; a timed-out batch is retried.
	TxTimeout time.Duration
	// SchemaWait bounds how long [Backend.Ensure] waits for each
	// constraint to settle (its index to come online) before it fails.
	// Default 2 minutes.
	SchemaWait time.Duration
	// Logger receives what Ensure repairs (an index a stopped process
	// left without its constraint, a failed index); nil discards it.
	Logger *slog.Logger
}

// MaxBatchSize is the largest Config.BatchSize.
const MaxBatchSize = 10000

// MaxWipeBatchSize is the largest Config.WipeBatchSize.
const MaxWipeBatchSize = 100000

// Default values of [Config] that the graph projector's flags
// (-neo4j-database, -neo4j-batch, -neo4j-tx-timeout) take too.
const (
	DefaultDatabase  = "neo4j"
	DefaultBatchSize = 100
	DefaultTxTimeout = 5 * time.Second
)

// Default values of the other fields of [Config].
const (
	defaultWipeBatch    = 10000
	defaultMaxRetryTime = 30 * time.Second
	defaultSchemaWait   = 2 * time.Minute
)

// schemes maps the URL schemes accepted to whether they use TLS.
var schemes = map[string]bool{
	"bolt": false, "bolt+s": true, "bolt+ssc": true,
	"neo4j": false, "neo4j+s": true, "neo4j+ssc": true,
}

func (c *Config) setDefaults() {
	if c.Database == "" {
		c.Database = DefaultDatabase
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.WipeBatchSize == 0 {
		c.WipeBatchSize = defaultWipeBatch
	}
	if c.MaxRetryTime == 0 {
		c.MaxRetryTime = defaultMaxRetryTime
	}
	if c.TxTimeout == 0 {
		c.TxTimeout = DefaultTxTimeout
	}
	if c.SchemaWait == 0 {
		c.SchemaWait = defaultSchemaWait
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	c.setDefaults()
	if c.URL == "" {
		return fmt.Errorf("neo4j: a URL (bolt://host:7687 or neo4j://host:7687) is required")
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return fmt.Errorf("neo4j: URL: %w", err)
	}
	tlsScheme, ok := schemes[u.Scheme]
	if !ok {
		return fmt.Errorf("neo4j: URL %q: scheme must be bolt, neo4j, bolt+s, neo4j+s, bolt+ssc or neo4j+ssc", u.Redacted())
	}
	if u.Hostname() == "" {
		return fmt.Errorf("neo4j: URL %q: a host is required", u.Redacted())
	}
	if u.User != nil {
		return fmt.Errorf("neo4j: URL %q: give the credentials as User and Password, not in the URL", u.Redacted())
	}
	if c.TLS != nil && !tlsScheme {
		return fmt.Errorf("neo4j: URL %q: TLS options given for an unencrypted scheme; use %s+s", u.Redacted(), u.Scheme)
	}
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		return fmt.Errorf("neo4j: batch size %d is outside 1..%d", c.BatchSize, MaxBatchSize)
	}
	if c.WipeBatchSize < 1 || c.WipeBatchSize > MaxWipeBatchSize {
		return fmt.Errorf("neo4j: wipe batch size %d is outside 1..%d", c.WipeBatchSize, MaxWipeBatchSize)
	}
	if c.MaxRetryTime < 0 {
		return fmt.Errorf("neo4j: negative max retry time %v", c.MaxRetryTime)
	}
	if c.SchemaWait < 0 {
		return fmt.Errorf("neo4j: negative schema wait %v", c.SchemaWait)
	}
	return nil
}
