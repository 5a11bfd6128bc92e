package lease

import (
	"errors"
	"os"
	"strings"
	"syscall"
)

// process identifies a running process well enough to tell that it has
// ended: the kernel's boot id, the pid namespace and the pid. A pid means
// one process only within one pid namespace of one boot.
type process struct {
	Boot  string
	PIDNS string
	PID   int
}

// thisProcess is the calling process (Boot and PIDNS empty where /proc
// does not tell them).
func thisProcess() process {
	p := process{PID: os.Getpid()}
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		p.Boot = strings.TrimSpace(string(b))
	}
	if ns, err := os.Readlink("/proc/self/ns/pid"); err == nil {
		p.PIDNS = ns
	}
	return p
}

// gone reports whether p has provably ended, as seen from self: it ran in
// self's boot and pid namespace, under another pid, and no process has
// that pid now. Anything else (another machine or container, a value
// without its process, the pid taken by some other process since) is not
// proof.
func (p process) gone(self process) bool {
	if p.Boot == "" || p.PIDNS == "" || p.PID <= 0 || p.Boot != self.Boot || p.PIDNS != self.PIDNS || p.PID == self.PID {
		return false
	}
	return errors.Is(syscall.Kill(p.PID, 0), syscall.ESRCH)
}
