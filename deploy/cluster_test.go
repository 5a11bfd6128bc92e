package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/converge-sync/converge/internal/testenv"
)

// The cluster profile (docker-compose.cluster.yml over docker-compose.yml):
// three NATS nodes, every service of the stack that uses NATS connecting to
// all three, and three replicas for what the relay, the projectors and the
// notifier create. Each node's configuration is one nats-server accepts.
func TestClusterProfile(t *testing.T) {
	base := loadCompose(t)
	var c composeFile
	if err := yaml.Unmarshal([]byte(readFile(t, "docker-compose.cluster.yml")), &c); err != nil {
		t.Fatalf("docker-compose.cluster.yml: %v", err)
	}
	nodes := []string{"nats", "nats-2", "nats-3"}
	for _, n := range nodes {
		if _, ok := c.Services[n]; !ok {
			t.Errorf("the cluster profile has no NATS node %s", n)
		}
	}
	for name, s := range base.Services {
		url, ok := s.Environment["CONVERGE_NATS_URL"]
		if !ok {
			continue
		}
		o, ok := c.Services[name]
		if !ok {
			t.Errorf("%s connects to NATS (%s) and the cluster profile leaves it on one server", name, url)
			continue
		}
		got := o.Environment["CONVERGE_NATS_URL"]
		for _, n := range nodes {
			if !strings.Contains(got, "nats://"+n+":4222") {
				t.Errorf("%s: CONVERGE_NATS_URL %q does not name node %s", name, got, n)
			}
		}
	}
	for _, name := range []string{"writer", "relay", "streams", "projector-index", "projector-graph", "notifier"} {
		if got := c.Services[name].Environment["CONVERGE_REPLICAS"]; got != "3" {
			t.Errorf("%s: CONVERGE_REPLICAS is %q in the cluster profile, want 3", name, got)
		}
	}

	// Each node runs as the nats service does, with the cluster's
	// configuration over it, on the files deploy/secrets.sh makes: the
	// routes' TLS needs the certificate, its key and the CA to load.
	bin := testenv.BuildNATSServer(t)
	secrets := filepath.Join(t.TempDir(), "secrets")
	runSecretsScript(t, secrets)
	conf := natsStackConf(t, base, secrets, natsServerConf, natsClusterConf)
	for _, n := range nodes {
		s := c.Services[n]
		if n != "nats" {
			s.Secrets = append(s.Secrets, base.Services["nats"].Secrets...)
		}
		if _, ok := s.secretAt(secretsDir + caSecret); !ok {
			t.Errorf("%s: the CA is not mounted: the routes verify the other nodes with it", n)
		}
	}
	if !strings.Contains(readFile(t, natsClusterConf), "verify: true") {
		t.Errorf("%s: the routes do not verify the other nodes' certificates", natsClusterConf)
	}
	for _, name := range []string{"nats-1", "nats-2", "nats-3"} {
		cmd := exec.Command(bin, "-t", "-c", filepath.Base(conf))
		cmd.Dir = filepath.Dir(conf)
		cmd.Env = append(os.Environ(), "NATS_SERVER_NAME="+name)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("node %s: nats-server refuses %s: %v\n%s", name, natsClusterConf, err, out)
		}
	}
}
