package pgcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// StartStandby starts a streaming standby of primary: a base backup of it
// (pg_basebackup -R, so it follows primary's WAL) in cfg.Dir (empty: a
// temporary directory that Stop removes), started with cfg's settings. It
// returns once the standby accepts (read-only) connections.
func StartStandby(ctx context.Context, primary *Cluster, cfg Config) (*Cluster, error) {
	root := cfg.Dir
	temp := false
	if root == "" {
		d, err := os.MkdirTemp("", "converge-pg-standby-")
		if err != nil {
			return nil, fmt.Errorf("pgcluster: create temp dir: %w", err)
		}
		root, temp = d, true
	}
	if err := primary.as.chown(root); err != nil {
		return nil, err
	}
	data := filepath.Join(root, "data")
	out, err := primary.run(ctx, "pg_basebackup", "-D", data, "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port),
		"-U", "postgres", "-R", "-X", "stream", "-c", "fast", "--no-sync")
	if err != nil {
		if temp {
			_ = os.RemoveAll(root)
		}
		return nil, &StartError{Op: "pg_basebackup", Err: fmt.Errorf("%w: %s", err, lastLines(out, 20))}
	}
	cfg.Dir = root
	c, err := Start(ctx, cfg)
	if err != nil {
		if temp {
			_ = os.RemoveAll(root)
		}
		return nil, err
	}
	if temp {
		c.mu.Lock()
		c.temp = true
		c.mu.Unlock()
	}
	return c, nil
}

// Promote makes a standby the primary (pg_ctl promote, waiting until it
// accepts writes).
func (c *Cluster) Promote(ctx context.Context) error {
	out, err := c.run(ctx, "pg_ctl", "promote", "-D", c.dataDir, "-w", "-t", pgCtlWaitSeconds)
	if err != nil {
		return fmt.Errorf("pgcluster: promote: %w: %s", err, lastLines(out, 20))
	}
	return nil
}
