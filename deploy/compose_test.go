package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// root is the module root, where docker-compose.yml and the Dockerfile are.
const root = ".."

// composeFile is the part of docker-compose.yml the tests read. Each field
// accepts every syntax Compose accepts for it.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Secrets  map[string]secretSpec     `yaml:"secrets"`
}

// secretSpec is a secret of the file's top level; the stack's come from
// files.
type secretSpec struct {
	File        string `yaml:"file"`
	Environment string `yaml:"environment"`
	External    bool   `yaml:"external"`
}

type composeService struct {
	Image       string       `yaml:"image"`
	Build       *buildSpec   `yaml:"build"`
	Command     stringList   `yaml:"command"`
	Entrypoint  stringList   `yaml:"entrypoint"`
	Environment environment  `yaml:"environment"`
	Ports       []portSpec   `yaml:"ports"`
	Healthcheck *healthcheck `yaml:"healthcheck"`
	DependsOn   dependsOn    `yaml:"depends_on"`
	Restart     string       `yaml:"restart"`
	Volumes     []volumeSpec `yaml:"volumes"`
	Secrets     []secretRef  `yaml:"secrets"`
	Networks    networks     `yaml:"networks"`
}

// networks are the networks a service joins, by name, with its fixed
// address on each (long syntax) or none (short syntax).
type networks map[string]struct {
	IPv4Address string `yaml:"ipv4_address"`
}

func (n *networks) UnmarshalYAML(node *yaml.Node) error {
	*n = networks{}
	if node.Kind == yaml.SequenceNode {
		var names []string
		if err := node.Decode(&names); err != nil {
			return err
		}
		for _, name := range names {
			(*n)[name] = struct {
				IPv4Address string `yaml:"ipv4_address"`
			}{}
		}
		return nil
	}
	type plain networks
	return node.Decode((*plain)(n))
}

// secretsDir is where Compose mounts a service's secrets.
const secretsDir = "/run/secrets/"

// secretRef is a secret mounted into a service, from the short ("name")
// or the long syntax; Target is the path inside the container.
type secretRef struct {
	Source string
	Target string
}

func (r *secretRef) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		r.Source, r.Target = n.Value, secretsDir+n.Value
		return nil
	}
	var long struct {
		Source string `yaml:"source"`
		Target string `yaml:"target"`
	}
	if err := n.Decode(&long); err != nil {
		return err
	}
	r.Source, r.Target = long.Source, long.Target
	switch {
	case r.Target == "":
		r.Target = secretsDir + r.Source
	case !strings.HasPrefix(r.Target, "/"):
		r.Target = secretsDir + r.Target
	}
	return nil
}

// secretAt is the secret s mounts at path, if any.
func (s composeService) secretAt(path string) (string, bool) {
	for _, r := range s.Secrets {
		if r.Target == path {
			return r.Source, true
		}
	}
	return "", false
}

// fromDockerfile reports whether the service runs the image built from the
// Dockerfile at the module root.
func (s composeService) fromDockerfile() bool {
	if s.Build == nil {
		return false
	}
	ctx := filepath.Clean(s.Build.Context)
	df := s.Build.Dockerfile
	if df == "" {
		df = "Dockerfile"
	}
	return ctx == "." && filepath.Clean(df) == "Dockerfile"
}

type buildSpec struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

func (b *buildSpec) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		b.Context = n.Value
		return nil
	}
	type plain buildSpec
	return n.Decode((*plain)(b))
}

// stringList is a command, an entrypoint or a healthcheck test: a list, or
// a string split on spaces.
type stringList []string

func (l *stringList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*l = strings.Fields(n.Value)
		return nil
	}
	var s []string
	if err := n.Decode(&s); err != nil {
		return err
	}
	*l = s
	return nil
}

// environment maps each variable a service sets to its value as written
// (with Compose's ${VAR:-default} references unresolved).
type environment map[string]string

func (e *environment) UnmarshalYAML(n *yaml.Node) error {
	*e = environment{}
	if n.Kind == yaml.SequenceNode {
		var items []string
		if err := n.Decode(&items); err != nil {
			return err
		}
		for _, it := range items {
			k, v, _ := strings.Cut(it, "=")
			(*e)[k] = v
		}
		return nil
	}
	var m map[string]*string
	if err := n.Decode(&m); err != nil {
		return err
	}
	for k, v := range m {
		if v != nil {
			(*e)[k] = *v
		} else {
			(*e)[k] = ""
		}
	}
	return nil
}

// portSpec is a published port, from the short ("127.0.0.1:8080:8080") or
// the long syntax.
type portSpec struct {
	Raw       string
	HostIP    string
	Published string
	Target    string
}

func (p *portSpec) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		var long struct {
			HostIP    string `yaml:"host_ip"`
			Published string `yaml:"published"`
			Target    string `yaml:"target"`
		}
		if err := n.Decode(&long); err != nil {
			return err
		}
		p.Raw = fmt.Sprintf("host_ip=%s published=%s target=%s", long.HostIP, long.Published, long.Target)
		p.HostIP, p.Published, p.Target = long.HostIP, long.Published, long.Target
		return nil
	}
	p.Raw = n.Value
	spec, _, _ := strings.Cut(n.Value, "/") // "/tcp", "/udp"
	parts := strings.Split(spec, ":")
	switch len(parts) {
	case 1:
		p.Target = parts[0]
	case 2:
		p.Published, p.Target = parts[0], parts[1]
	case 3:
		p.HostIP, p.Published, p.Target = parts[0], parts[1], parts[2]
	default:
		return fmt.Errorf("port %q: unexpected form", n.Value)
	}
	return nil
}

// volumeSpec is a mount, from the short ("./a:/b:ro") or the long syntax.
type volumeSpec struct {
	Source string
	Target string
}

func (v *volumeSpec) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		var long struct {
			Source string `yaml:"source"`
			Target string `yaml:"target"`
		}
		if err := n.Decode(&long); err != nil {
			return err
		}
		v.Source, v.Target = long.Source, long.Target
		return nil
	}
	parts := strings.Split(n.Value, ":")
	if len(parts) < 2 {
		v.Target = parts[0] // an anonymous volume
		return nil
	}
	v.Source, v.Target = parts[0], parts[1]
	return nil
}

type healthcheck struct {
	Test    stringList `yaml:"test"`
	Disable bool       `yaml:"disable"`
}

func (h *healthcheck) enabled() bool {
	return h != nil && !h.Disable && len(h.Test) > 0 && h.Test[0] != "NONE"
}

// dependsOn maps each service depended on to its condition.
type dependsOn map[string]string

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	*d = dependsOn{}
	if n.Kind == yaml.SequenceNode {
		var names []string
		if err := n.Decode(&names); err != nil {
			return err
		}
		for _, name := range names {
			(*d)[name] = "service_started"
		}
		return nil
	}
	var m map[string]struct {
		Condition string `yaml:"condition"`
	}
	if err := n.Decode(&m); err != nil {
		return err
	}
	for name, c := range m {
		cond := c.Condition
		if cond == "" {
			cond = "service_started"
		}
		(*d)[name] = cond
	}
	return nil
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	var c composeFile
	if err := yaml.Unmarshal([]byte(readFile(t, "docker-compose.yml")), &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	if len(c.Services) == 0 {
		t.Fatal("docker-compose.yml: no services")
	}
	return c
}

// oneShots are the services others wait for to complete: they run and
// exit, so they have no healthcheck and are not restarted.
func (c composeFile) oneShots() map[string]bool {
	out := map[string]bool{}
	for _, s := range c.Services {
		for dep, cond := range s.DependsOn {
			if cond == "service_completed_successfully" {
				out[dep] = true
			}
		}
	}
	return out
}

// varRef matches Compose's interpolation: $$, ${VAR}, ${VAR:-default},
// ${VAR-default}, ${VAR:?err}, ${VAR?err}, $VAR.
var varRef = regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// withDefaults resolves s as Compose would with none of its variables set:
// each reference becomes its default.
func withDefaults(s string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		sub := varRef.FindStringSubmatch(m)
		if sub[2] == ":-" || sub[2] == "-" {
			return sub[3]
		}
		return ""
	})
}
