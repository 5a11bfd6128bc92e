package deploy

import (
	"maps"
	"net"
	"net/netip"
	"net/url"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestServicesRunWhatTheBinariesDefine builds the binaries and checks every
// service run from the Dockerfile's image against them: its command names
// a binary (and, for converge, a subcommand), each -flag is one that
// command defines, and each CONVERGE_* variable it sets is one that
// command reads. Every binary is run by some service.
func TestServicesRunWhatTheBinariesDefine(t *testing.T) {
	c := loadCompose(t)
	bins := buildBinaries(t)
	run := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		s := c.Services[name]
		if !s.fromDockerfile() {
			continue
		}
		t.Run(name, func(t *testing.T) {
			if len(s.Entrypoint) > 0 {
				t.Errorf("sets an entrypoint %q: the image has none; name the binary in the command", s.Entrypoint)
			}
			if len(s.Command) == 0 {
				t.Fatal("no command: it must name the binary to run")
			}
			run[s.Command[0]] = true
			cmd, args, err := bins.cliOf(s.Command)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range args {
				if a == "--" {
					break
				}
				if !strings.HasPrefix(a, "-") || a == "-" {
					continue
				}
				flag, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
				if !cmd.flags[flag] {
					t.Errorf("command passes %s, which %s does not define", a, cmd.name)
				}
			}
			for _, env := range slices.Sorted(maps.Keys(s.Environment)) {
				if strings.HasPrefix(env, "CONVERGE_") && !cmd.reads(env) {
					t.Errorf("sets %s, which %s does not read; it reads %s", env, cmd.name, strings.Join(cmd.sortedEnvs(), ", "))
				}
			}
		})
	}
	if len(run) == 0 {
		t.Fatal("no service runs the image built from the Dockerfile")
	}
	for _, b := range bins.Names {
		if !run[b] {
			t.Errorf("no service runs %s (cmd/%s)", b, b)
		}
	}
}

// TestImagesArePinned: every service names a tagged image (not latest) or
// is built from this repository.
func TestImagesArePinned(t *testing.T) {
	for name, s := range loadCompose(t).Services {
		if s.Image == "" {
			if s.Build == nil {
				t.Errorf("%s: neither image nor build", name)
			}
			continue
		}
		ref := withDefaults(s.Image)
		if strings.Contains(ref, "@sha256:") {
			continue
		}
		tag := ""
		if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
			tag = ref[i+1:]
		}
		if tag == "" || tag == "latest" {
			t.Errorf("%s: image %q is not pinned to a version", name, s.Image)
		}
	}
}

// TestPortsArePublishedOnLoopback: nothing of the stack is reachable from
// other machines.
func TestPortsArePublishedOnLoopback(t *testing.T) {
	for name, s := range loadCompose(t).Services {
		for _, p := range s.Ports {
			if p.HostIP != "127.0.0.1" || p.Published == "" {
				t.Errorf("%s: port %q is not published on 127.0.0.1:<port>", name, p.Raw)
			}
		}
	}
}

// TestServicesHaveHealthchecks: every long-running service has a
// healthcheck and a restart policy; every one-shot service (one that
// others wait for to complete) is not restarted, and a long-running
// service waits for it, which is what lets `docker compose up --wait`
// treat its exit as success.
func TestServicesHaveHealthchecks(t *testing.T) {
	c := loadCompose(t)
	oneShots := c.oneShots()
	for name, s := range c.Services {
		if oneShots[name] {
			if s.Restart != "" && s.Restart != "no" {
				t.Errorf("%s: one-shot service with restart %q", name, s.Restart)
			}
			adopted := false
			for other, o := range c.Services {
				if !oneShots[other] && o.DependsOn[name] == "service_completed_successfully" {
					adopted = true
				}
			}
			if !adopted {
				t.Errorf("%s: one-shot service that no long-running service waits for with service_completed_successfully", name)
			}
			continue
		}
		if !s.Healthcheck.enabled() {
			t.Errorf("%s: no healthcheck", name)
		}
		if s.Restart == "" || s.Restart == "no" {
			t.Errorf("%s: long-running service without a restart policy", name)
		}
	}
}

// TestDependsOnExistingServices: every dependency names a service, with a
// condition that service can meet.
func TestDependsOnExistingServices(t *testing.T) {
	c := loadCompose(t)
	for name, s := range c.Services {
		for dep, cond := range s.DependsOn {
			d, ok := c.Services[dep]
			switch {
			case !ok:
				t.Errorf("%s: depends on %q, which is not a service", name, dep)
			case dep == name:
				t.Errorf("%s: depends on itself", name)
			case cond == "service_healthy" && !d.Healthcheck.enabled():
				t.Errorf("%s: waits for %s to be healthy, which has no healthcheck", name, dep)
			case cond != "service_started" && cond != "service_healthy" && cond != "service_completed_successfully":
				t.Errorf("%s: depends on %s with unknown condition %q", name, dep, cond)
			}
		}
	}
}

// TestServicesListenWhereTheirPortsArePublished: each port published for
// a service of the image is one it listens on at 0.0.0.0 (a service
// listening on 127.0.0.1 inside its container cannot be reached through a
// published port), and its healthcheck asks its metrics address.
func TestServicesListenWhereTheirPortsArePublished(t *testing.T) {
	c := loadCompose(t)
	oneShots := c.oneShots()
	for name, s := range c.Services {
		if !s.fromDockerfile() {
			continue
		}
		listens := map[string]string{} // port -> variable
		for env, v := range s.Environment {
			if !strings.HasPrefix(env, "CONVERGE_") || !strings.HasSuffix(env, "_ADDR") {
				continue
			}
			if _, err := netip.ParseAddr(withDefaults(v)); err == nil {
				continue // an address without a port names a host, not a listener (CONVERGE_RELAY_ADDR)
			}
			host, port, err := net.SplitHostPort(withDefaults(v))
			if err != nil {
				t.Errorf("%s: %s=%q: %v", name, env, v, err)
				continue
			}
			if host == "0.0.0.0" || host == "" || host == "::" {
				listens[port] = env
			}
		}
		for _, p := range s.Ports {
			if _, ok := listens[p.Target]; !ok {
				t.Errorf("%s: publishes port %s, but no CONVERGE_*_ADDR makes it listen on 0.0.0.0:%s", name, p.Target, p.Target)
			}
		}
		if oneShots[name] {
			continue
		}
		_, metricsPort, err := net.SplitHostPort(withDefaults(s.Environment["CONVERGE_METRICS_ADDR"]))
		if err != nil {
			t.Errorf("%s: CONVERGE_METRICS_ADDR=%q: its healthcheck needs the metrics address: %v", name, s.Environment["CONVERGE_METRICS_ADDR"], err)
			continue
		}
		if s.Healthcheck != nil && !strings.Contains(strings.Join(s.Healthcheck.Test, " "), ":"+metricsPort+"/") {
			t.Errorf("%s: healthcheck %q does not ask the metrics address (port %s)", name, s.Healthcheck.Test, metricsPort)
		}
	}
}

// secretName matches the variables whose value is a secret, or may hold
// one (a URL with a password).
var secretName = regexp.MustCompile(`PASSWORD|API_KEY|_AUTH$|_URL$`)

// checkSecretValue: a secret is never written into the file, nor given a
// default there: it is a mounted secret, or it comes from a variable
// without a default.
func checkSecretValue(t *testing.T, service, env, v string) {
	t.Helper()
	if strings.HasSuffix(env, "_FILE") && strings.HasPrefix(v, secretsDir) {
		return // a mounted secret (TestEachServiceHoldsItsOwnCredentials)
	}
	isURL := strings.HasSuffix(env, "_URL")
	if isURL {
		u, err := url.Parse(withDefaults(v))
		if err != nil || u.User == nil {
			return // no credentials in it
		}
		if _, ok := u.User.Password(); !ok {
			return
		}
	}
	refs := varRef.FindAllStringSubmatch(v, -1)
	if len(refs) == 0 {
		t.Errorf("%s: %s is written into docker-compose.yml; mount it as a secret", service, env)
	}
	for _, r := range refs {
		if r[2] == ":-" || r[2] == "-" {
			t.Errorf("%s: %s defaults to %q: a default secret is a published one", service, env, r[3])
		}
	}
}

// TestRelaySlotAgrees: `converge migrate up` creates the slot the relay
// reads; a different name would leave the relay to create its own, after
// documents were written.
func TestRelaySlotAgrees(t *testing.T) {
	c := loadCompose(t)
	slots := map[string][]string{} // slot -> services
	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		s := c.Services[name]
		if v, ok := s.Environment["CONVERGE_RELAY_SLOT"]; ok && s.fromDockerfile() {
			slots[withDefaults(v)] = append(slots[withDefaults(v)], name)
		}
	}
	if len(slots) > 1 {
		t.Errorf("services name different replication slots: %v", slots)
	}
}

// The nats-server configurations of the stack: the single server's and a
// cluster node's (docker-compose.cluster.yml).
const (
	natsServerConf  = "deploy/nats/server.conf"
	natsClusterConf = "deploy/nats/cluster.conf"
)

// TestNATSConfiguration: the nats service runs deploy/nats/server.conf
// (TestNATSRequiresTLS runs it: TLS, JetStream, max_payload, the users).
func TestNATSConfiguration(t *testing.T) {
	mounted := false
	for _, s := range loadCompose(t).Services {
		for _, v := range s.Volumes {
			if path.Clean(v.Source) == natsServerConf && slices.Contains(s.Command, v.Target) {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Errorf("no service mounts ./%s and passes it to nats-server", natsServerConf)
	}
}

// TestDockerfile: the builder builds every binary statically and
// reproducibly from files it copies (every package the binaries import is
// under a copied directory), and the runtime stage runs as a non-root user
// from pinned images.
func TestDockerfile(t *testing.T) {
	lines := strings.Split(strings.ReplaceAll(readFile(t, "Dockerfile"), "\\\n", " "), "\n")
	var (
		stages   []string // images, in order
		copied   = map[string]bool{}
		build    string
		lastUser string
	)
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			stages = append(stages, f[1])
			lastUser = ""
		case "COPY":
			if len(stages) == 1 && !strings.HasPrefix(f[1], "--from") {
				for _, src := range f[1 : len(f)-1] {
					copied[path.Clean(src)] = true
				}
			}
		case "RUN":
			if strings.Contains(line, "go build") {
				build = line
			}
		case "USER":
			lastUser = f[1]
		}
	}
	if len(stages) < 2 || !strings.HasPrefix(stages[0], "golang:1.26") {
		t.Fatalf("stages %q: want a golang:1.26 builder, then a runtime stage", stages)
	}
	for _, img := range stages {
		if tag := img[strings.LastIndex(img, ":")+1:]; !strings.Contains(img, ":") || tag == "latest" {
			t.Errorf("image %q is not pinned to a version", img)
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "./cmd/..."} {
		if !strings.Contains(build, want) {
			t.Errorf("the go build step %q lacks %s", build, want)
		}
	}
	if user, _, _ := strings.Cut(lastUser, ":"); user == "" || user == "root" || user == "0" {
		t.Errorf("the runtime stage runs as %q: want a non-root USER", lastUser)
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		if !copied[f] {
			t.Errorf("the builder does not copy %s", f)
		}
	}
	modPath := strings.TrimSpace(goList(t, "-m"))
	for _, pkg := range strings.Fields(goList(t, "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.ImportPath}}{{end}}{{end}}", "./cmd/...")) {
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, modPath), "/")
		top, _, _ := strings.Cut(rel, "/")
		if !copied[top] {
			t.Errorf("the binaries import %s, but the builder does not copy %s/", pkg, top)
		}
	}
}

// goList runs `go list args...` in the module root.
func goList(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}
