package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/service"
)

// docs/configuration.md's reference is what `converge config docs`
// generates from the flags: a flag added, removed or changed fails this
// test until `make docs` is run.
func TestConfigurationReferenceIsCurrent(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "configuration.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, referenceBegin), strings.Index(doc, referenceEnd)
	if i < 0 || j < i {
		t.Fatalf("%s: no generated reference between its markers", path)
	}
	if got, want := doc[i+len(referenceBegin)+1:j], configReference(); got != want {
		t.Fatalf("%s is stale: run `make docs` (go run ./cmd/converge config docs -write docs/configuration.md)", path)
	}
	for _, c := range append(serviceFlags(), cliFlags()...) {
		if len(c.settings) < 2 {
			t.Errorf("%s: %d settings described; its flags were not found", c.name, len(c.settings))
		}
	}
}

// Every flag of every service has a variable, and a service's variables
// are its own or shared on purpose: one name, one meaning.
func TestEveryServiceFlagHasAVariable(t *testing.T) {
	meaning := map[string]string{}
	for _, c := range serviceFlags() {
		for _, s := range c.settings {
			if s.Env == "" && s.Flag != "webhook-secret-file" {
				t.Errorf("%s: -%s has no variable", c.name, s.Flag)
			}
			if s.Env == "" {
				continue
			}
			if m, ok := meaning[s.Env]; ok && m != s.Flag {
				t.Errorf("%s is -%s in one service and -%s in %s", s.Env, m, s.Flag, c.name)
			}
			meaning[s.Env] = s.Flag
		}
	}
}

// The file docs/configuration.md shows is one every command accepts.
func TestDocumentedConfigurationFileIsValid(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatal("docs/configuration.md shows no configuration file")
	}
	path := filepath.Join(t.TempDir(), "converge.yaml")
	if err := os.WriteFile(path, m[1], 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"config", "check", path}, &out); err != nil {
		t.Fatalf("config check of the documented file: %v", err)
	}
	file, err := config.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(file.Keys("common")) + len(file.Keys("relay")); n < 4 || !strings.Contains(out.String(), "settings") {
		t.Fatalf("%d keys read; output %q", n, out.String())
	}
}

// converge config check names every key no command reading its section
// has, with its line, and exits 2.
func TestConfigCheckNamesWhatNoCommandHas(t *testing.T) {
	path := filepath.Join(t.TempDir(), "converge.yaml")
	body := "common:\n  replicas: 3\n  replica: 3\nrelay:\n  window: 9\n  qdrant-url: q:6334\ncli:\n  nats-url: n\n  windw: 1\ndev:\n  docs: 50\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	err := run(context.Background(), []string{"config", "check", path}, &bytes.Buffer{})
	if err == nil || !service.IsUsage(err) {
		t.Fatalf("err = %v, want a usage error", err)
	}
	for _, want := range []string{"converge.yaml:3: common.replica ", "converge.yaml:6: relay.qdrant-url ", "converge.yaml:9: cli.windw "} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v\ndoes not name %q", err, want)
		}
	}
	for _, known := range []string{"replicas ", "window ", "nats-url", "docs"} {
		if strings.Contains(err.Error(), "."+known) {
			t.Errorf("%v\nnames the known %q", err, known)
		}
	}
}

// A service binary started with a configuration file takes its section
// and common, its variables winning over both; a key its section does
// not have stops it, naming the line.
func TestServiceReadsItsSectionOfTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "converge.yaml")
	body := "common:\n  nats-url: nats://127.0.0.1:4222\n  replicas: 3\nprojector-graph:\n  neo4j-batch: 40\n  batch: 64\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	environ := func(k string) (string, bool) {
		if k == "CONVERGE_PROJECTOR_BATCH" {
			return "32", true
		}
		return "", false
	}
	c, _, err := service.Parse("projector-graph", environ, []string{"-config", path}, graphprojector.ServiceFlags)
	if err != nil {
		t.Fatal(err)
	}
	if c.Projector.NATSURL != "nats://127.0.0.1:4222" || c.Projector.Runtime.Replicas != 3 || c.Store.Neo4jBatch != 40 ||
		c.Projector.Runtime.BatchSize != 32 {
		t.Fatalf("got %+v / %+v", c.Projector, c.Store)
	}
	if err := os.WriteFile(path, []byte(body+"  qdrant-url: q:6334\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := service.Parse("projector-graph", environ, []string{"-config", path}, graphprojector.ServiceFlags); err == nil ||
		!strings.Contains(err.Error(), "converge.yaml:7: projector-graph.qdrant-url is not a setting of projector-graph") {
		t.Fatalf("err = %v", err)
	}
}
