//go:build unix

package pgcluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
)

// runAs is the OS identity the server runs as; nil means "as ourselves".
type runAs struct {
	name     string
	uid, gid int
}

// serverIdentity returns the postgres OS user when running as root, because
// initdb and postgres refuse to run with root privileges.
func serverIdentity() (*runAs, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		var unknown user.UnknownUserError
		if errors.As(err, &unknown) {
			return nil, ErrNoPostgresUser
		}
		return nil, fmt.Errorf("pgcluster: look up OS user postgres: %w", err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("pgcluster: OS user postgres has non-numeric uid/gid %q/%q", u.Uid, u.Gid)
	}
	return &runAs{name: u.Username, uid: uid, gid: gid}, nil
}

func (r *runAs) apply(cmd *exec.Cmd) {
	if r == nil {
		return
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uint32(r.uid), Gid: uint32(r.gid)},
	}
}

func (r *runAs) chown(paths ...string) error {
	if r == nil {
		return nil
	}
	for _, p := range paths {
		if err := os.Chown(p, r.uid, r.gid); err != nil {
			return fmt.Errorf("pgcluster: chown %s to %s: %w", p, r.name, err)
		}
	}
	return nil
}

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	// An exited postmaster is reparented to init and stays a zombie until
	// init reaps it, which some container inits do late; it is not running.
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
		// Format: pid (comm) state ...; comm may contain spaces or ')'.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
			if st := b[i+2]; st == 'Z' || st == 'X' {
				return false
			}
		}
	}
	return true
}

// quitProcess sends SIGQUIT, which makes the postmaster do an immediate
// shutdown (the same as pg_ctl stop -m immediate).
func quitProcess(pid int) error {
	return syscall.Kill(pid, syscall.SIGQUIT)
}
