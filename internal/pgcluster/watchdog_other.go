//go:build !unix

package pgcluster

// watchdog is not implemented off Unix: there is no /bin/sh to run it and
// processAlive cannot check the server. Clusters are then only stopped by
// Stop.
type watchdog struct {
	pm   int
	dirs []string
}

func startWatchdog(int, string, []string) (*watchdog, error) { return nil, nil }

func (wd *watchdog) end() {}

func (wd *watchdog) pid() int { return 0 }
