package qdrant

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Config of a [Backend]. Zero fields take the defaults documented on them.
type Config struct {
	// Addr is Qdrant's gRPC endpoint, "host:port" (Qdrant's gRPC port is
	// 6334, its REST port 6333). The URL forms "http://host:port" and
	// "https://host:port" are accepted too; https implies UseTLS.
	Addr   string
	APIKey string // sent as the api-key metadata when set
	UseTLS bool
	// TLS configures the TLS connection (root CAs, client certificates,
	// minimum version); nil uses the system's roots and TLS 1.3. Setting
	// it implies UseTLS.
	TLS *tls.Config
	// Collection is the collection, or the alias of one, that holds the
	// chunks and the markers. Default "converge_chunks".
	Collection string
	// BatchSize is the number of points per upsert request, 1..1024.
	// Default 128 (Qdrant's bulk-load advice is 64-256).
	BatchSize int
	// Parallel is the number of requests an Upsert, a DeleteStale or a
	// Counts keeps in flight, 1..64. Default 2.
	Parallel int
	// Timeout bounds each request to Qdrant. Default 30s.
	Timeout time.Duration
	// Shards, Replication and WriteConsistency are the settings of a
	// collection the backend creates, for a Qdrant cluster (its
	// shard_number, replication_factor and write_consistency_factor);
	// 0: Qdrant's defaults (one shard, one copy). A collection that
	// exists keeps its own.
	Shards, Replication, WriteConsistency int
}

// Limits of the Config fields.
const (
	MaxBatchSize = 1024
	MaxParallel  = 64
)

const (
	defaultCollection = "converge_chunks"
	defaultBatchSize  = 128
	defaultParallel   = 2
	defaultTimeout    = 30 * time.Second
)

func (c *Config) setDefaults() {
	if c.Collection == "" {
		c.Collection = defaultCollection
	}
	if c.BatchSize == 0 {
		c.BatchSize = defaultBatchSize
	}
	if c.Parallel == 0 {
		c.Parallel = defaultParallel
	}
	if c.Timeout == 0 {
		c.Timeout = defaultTimeout
	}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	c.setDefaults()
	if _, _, _, err := parseAddr(c.Addr); err != nil {
		return err
	}
	if err := validName(c.Collection); err != nil {
		return fmt.Errorf("qdrant: collection: %w", err)
	}
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		return fmt.Errorf("qdrant: batch size %d is outside 1..%d", c.BatchSize, MaxBatchSize)
	}
	if c.Parallel < 1 || c.Parallel > MaxParallel {
		return fmt.Errorf("qdrant: parallel %d is outside 1..%d", c.Parallel, MaxParallel)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("qdrant: negative timeout %v", c.Timeout)
	}
	return nil
}

// parseAddr splits Addr into host and port; tls is true for an https URL.
func parseAddr(addr string) (host string, port int, tls bool, err error) {
	if addr == "" {
		return "", 0, false, errors.New("qdrant: an address (host:port) is required")
	}
	hostPort := addr
	if scheme, rest, ok := strings.Cut(addr, "://"); ok {
		if scheme != "http" && scheme != "https" {
			return "", 0, false, fmt.Errorf("qdrant: address %q: scheme must be http or https", addr)
		}
		hostPort, tls = strings.TrimSuffix(rest, "/"), scheme == "https"
	}
	host, portText, err := net.SplitHostPort(hostPort)
	if err != nil {
		return "", 0, false, fmt.Errorf("qdrant: address %q: %w", addr, err)
	}
	port, err = strconv.Atoi(portText)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, false, fmt.Errorf("qdrant: address %q: invalid port", addr)
	}
	if host == "" {
		return "", 0, false, fmt.Errorf("qdrant: address %q: a host is required", addr)
	}
	return host, port, tls, nil
}

// validName applies Qdrant's rules for collection and alias names.
func validName(name string) error {
	if name == "" || len(name) > 255 {
		return fmt.Errorf("name %q must be 1 to 255 bytes", name)
	}
	if strings.ContainsAny(name, "<>:\"/\\|?*\x00") {
		return fmt.Errorf("name %q must not contain any of <>:\"/\\|?* or NUL", name)
	}
	return nil
}
