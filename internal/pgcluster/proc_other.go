//go:build !unix

package pgcluster

import (
	"errors"
	"os/exec"
)

type runAs struct{}

func serverIdentity() (*runAs, error) { return nil, nil }

func (r *runAs) apply(*exec.Cmd) {}

func (r *runAs) chown(...string) error { return nil }

// processAlive cannot be answered portably here; pg_ctl is relied on instead.
func processAlive(int) bool { return false }

func quitProcess(int) error {
	return errors.New("pgcluster: signalling the server is not supported on this platform")
}
