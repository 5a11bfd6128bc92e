//go:build unix

package pgcluster

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
)

// watchdogScript runs in a detached /bin/sh. Arguments: $1 the postmaster
// PID to stop (0: none), $2 the data directory, then the directories to
// remove.
//
// fd 3 is the read end of a pipe whose only writer is the owner process, so
// read returns (EOF) the moment the owner exits, however it dies: no polling
// delay and no PID-reuse race as with `kill -0 $owner`. While the owner
// lives the shell sits in that read without children, so ending it needs
// nothing but a signal.
//
// The postmaster is only signalled while postmaster.pid still names it, so
// a PID recycled after the server stopped is never hit. SIGQUIT is what
// `pg_ctl stop -m immediate` sends; sending it directly needs no change of
// user: the watchdog runs as the owner, which is root or the server's user.
const watchdogScript = `read -r x <&3
exec 3<&-
pm=$1 pidfile=$2/postmaster.pid
shift 2
alive() {
	kill -0 "$pm" 2>/dev/null || return 1
	st=
	read -r x x st x <"/proc/$pm/stat" 2>/dev/null
	[ "$st" != Z ] && [ "$st" != X ]
}
if [ "$pm" -gt 0 ] && read -r first <"$pidfile" 2>/dev/null && [ "$first" = "$pm" ]; then
	kill -QUIT "$pm" 2>/dev/null
	i=0
	while alive && [ "$i" -lt 300 ]; do
		sleep 0.1 2>/dev/null || sleep 1
		i=$((i + 1))
	done
	if alive; then kill -KILL "$pm" 2>/dev/null; sleep 1; fi
fi
if [ $# -gt 0 ]; then rm -rf -- "$@"; fi
`

// watchdog is a running watchdog process and the owner's end of its pipe.
type watchdog struct {
	cmd      *exec.Cmd
	lifeline *os.File
	pm       int
	dirs     []string
}

// lifelines keeps every live pipe end reachable: were a Cluster dropped
// without Stop, the garbage collector would otherwise close its lifeline
// and the watchdog would shut a server down under a still-running owner.
var lifelines sync.Map // *os.File -> struct{}

func startWatchdog(pm int, dataDir string, dirs []string) (*watchdog, error) {
	r, w, err := os.Pipe() // close-on-exec: no other child inherits w
	if err != nil {
		return nil, fmt.Errorf("pgcluster: watchdog pipe: %w", err)
	}
	args := append([]string{"-c", watchdogScript, "pgcluster-watchdog", strconv.Itoa(pm), dataDir}, dirs...)
	cmd := exec.Command("/bin/sh", args...)
	// Stdio stays nil (/dev/null) so the watchdog holds none of the owner's
	// pipes (go test waits for those), and its own session keeps it out of
	// signals sent to the owner's process group or terminal.
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin:" + os.Getenv("PATH"), "LC_ALL=C"}
	err = cmd.Start()
	_ = r.Close()
	if err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("pgcluster: start watchdog: %w", err)
	}
	lifelines.Store(w, struct{}{})
	return &watchdog{cmd: cmd, lifeline: w, pm: pm, dirs: dirs}, nil
}

// end stops the watchdog without letting it act: it is killed before its
// pipe is closed, since closing the pipe is what tells it the owner died.
func (wd *watchdog) end() {
	if wd == nil {
		return
	}
	// Setsid made the watchdog a process group leader; the group includes
	// any sleep it may have started. It is our unreaped child until Wait, so
	// its PID cannot have been reused.
	_ = syscall.Kill(-wd.cmd.Process.Pid, syscall.SIGKILL)
	_ = wd.cmd.Wait()
	_ = wd.lifeline.Close()
	lifelines.Delete(wd.lifeline)
}

func (wd *watchdog) pid() int {
	if wd == nil {
		return 0
	}
	return wd.cmd.Process.Pid
}
