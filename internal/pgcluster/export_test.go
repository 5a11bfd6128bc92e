package pgcluster

// watchdogPID returns the PID of the cluster's watchdog process, or 0 when
// none runs.
func (c *Cluster) watchdogPID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wd.pid()
}
